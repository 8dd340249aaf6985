"""``python -m amp_opt``: the command-line interface."""

from .commands.cli import main

raise SystemExit(main())
