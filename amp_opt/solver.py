"""``solve``: one entry point over the solvers, with option checking at the boundary."""

from __future__ import annotations

from .cost import check_cost_model
from .errors import InputError
from .placement import check_placement
from .result import SolveResult

SOLVERS = ("auto", "enumerate", "cpsat", "cbc")


def solve(
    instance,
    solver: str = "auto",
    cost_model: str = "hetero",
    placement: str | None = None,
    top_k: int = 1,
    time_limit: float | None = None,
    seed: int = 0,
    workers: int = 1,
    progress=None,
) -> SolveResult:
    """Find the fastest plan of an instance under a cost model.

    Parameters
    ----------
    instance : Instance
    solver : "auto" (default: the exact enumerator, or CP-SAT when free grouping is too
        large to enumerate), "enumerate", "cpsat" or "cbc"
    cost_model : "hetero" (default) or "amp"
    placement : "free" or "rank-order"; default free under hetero, rank-order under amp
    top_k : how many of the best plans to return (enumerate only keeps more than one)
    time_limit : seconds for the whole search, or None
    seed, workers : for the MIP solvers; fixed so that results repeat

    Returns
    -------
    SolveResult, whose plans were re-scored by :func:`amp_opt.evaluate`.

    Raises
    ------
    InputError for bad options, InfeasibleError when no plan fits.
    """
    check_cost_model(cost_model)
    placement = check_placement(placement, cost_model)
    if solver not in SOLVERS:
        raise InputError("--solver", f"unknown solver {solver!r} (choose from {', '.join(SOLVERS)})")
    if not isinstance(top_k, int) or top_k < 1:
        raise InputError("--top-k", f"must be a positive integer, got {top_k!r}")
    if time_limit is not None and not time_limit > 0:
        raise InputError("--time-limit", f"must be positive seconds, got {time_limit!r}")
    from .mip import solve_mip

    if solver not in ("auto", "enumerate"):
        return solve_mip(instance, solver, cost_model, placement, top_k, time_limit, seed, workers, progress)
    import dataclasses
    import time

    from .enumerate import solve_enumerate
    from .errors import SearchTooLarge

    start = time.perf_counter()
    try:
        return solve_enumerate(instance, cost_model, placement, top_k, time_limit, progress)
    except SearchTooLarge as exc:
        if solver == "enumerate":
            raise
        spent = time.perf_counter() - start
        why = exc.problem
    result = solve_mip(instance, "cpsat", cost_model, placement, top_k,
                       None if time_limit is None else max(0.1, time_limit - spent), seed, workers, progress)
    # The solver block covers the whole search, the enumerator's attempt included.
    stats = dataclasses.replace(result.solver, wall_time=result.solver.wall_time + spent,
                                extra={**result.solver.extra, "auto": f"enumerator gave up after {spent:.1f} s: {why}"})
    return dataclasses.replace(result, solver=stats)
