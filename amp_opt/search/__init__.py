"""The search: :func:`.solve.solve` over the solvers, all of them exact unless stopped.

:mod:`.options` (the validated options) and :mod:`.clock` (the time limit as one clock, shared
down to every backend; the shares in :mod:`.tuning`) -> :mod:`.subsets` (the sets of devices)
-> :mod:`.context` (one solve's tables and clock) -> :mod:`.enumerate` (every candidate, the
exact stage DP of :mod:`.partition` over the placements of :mod:`.free_grouping`) or :mod:`.mip` (a
program per candidate, after the stage-kind search of :mod:`.kinds`) -> :mod:`.result`.
:mod:`.diagnose` says why nothing fits; :mod:`.alternatives` what would make a plan fit.
"""
