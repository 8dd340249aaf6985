"""The search: :func:`.solve.solve` over the solvers, all of them exact unless stopped.

:mod:`.options` (the validated options) and :mod:`.context` (one solve's tables and
clock) -> :mod:`.enumerate` (every candidate, the exact stage DP of :mod:`.partition`
over the placements of :mod:`.grouping`) or :mod:`.mip` (a program per candidate,
after the stage-kind search of :mod:`.kinds`) -> :mod:`.result`.  :mod:`.diagnose`
says why nothing fits.
"""
