"""The mixed-integer programs (``formulations/mip.md``): :mod:`.driver` (the loop over
candidates; phase 1's incumbents in :mod:`.fixed_orders`), :mod:`.formulation` (one program per
candidate, written once against the solver-neutral :mod:`.linear`), :mod:`.backends` (CP-SAT,
CBC and HiGHS behind the one signature of :mod:`.protocol`).
"""
