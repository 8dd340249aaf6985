"""The mixed-integer programs (``formulations/mip.md``): :mod:`.driver` (the loop over
candidates), :mod:`.formulation` (one program per candidate, written once against the
solver-neutral :mod:`.model`), :mod:`.backends` (CP-SAT and CBC).
"""
