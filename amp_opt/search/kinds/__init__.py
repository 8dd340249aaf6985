"""The stage-kind search (``formulations/mip.md`` B4, K1-K7): a Lagrangian bound and plans for
large free-grouping candidates.  :mod:`.lagrangian` (kind tables and the DP), :mod:`.bound` (the
bound), :mod:`.construct` (plans), :mod:`.refine` (the phase of the MIP driver that runs them).
"""
