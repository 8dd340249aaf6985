"""The command-line interface: :mod:`.cli` lists the commands, one module each; :mod:`.common`
holds what they share (argument types, I/O).  Commands never import each other or the CLI.
"""
