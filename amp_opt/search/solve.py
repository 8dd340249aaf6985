"""``solve``: one entry point over the solvers, with the options checked once at the boundary."""

from __future__ import annotations

import dataclasses

from ..errors import SearchTooLarge
from .context import Search
from .enumerate import solve_enumerate
from .mip.driver import solve_mip
from .options import SolveOptions, solve_options
from .registry import lookup, run_plugin
from .result import SolveResult


def solve(instance, *, solver: str = "auto", cost_model="hetero", placement: str | None = None, top_k: int = 1,
          time_limit: float | None = None, seed: int = 0, workers: int = 1, progress=None) -> SolveResult:
    """Find the fastest plan of an instance under a cost model.

    Parameters
    ----------
    instance : Instance
    solver : str
        A registered solver name: auto (default: the exact enumerator, or CP-SAT when free
        grouping is too large to enumerate), enumerate, cpsat, cbc, highs, their ablation and
        formulation variants (``formulations/variants.md``), or a plug-in's name
        (:func:`amp_opt.register_solver`).
    cost_model : {"hetero", "amp"} or CostModel
        hetero (default): per-device speeds, slowest links, memory limits; amp: the
        AMP paper's model.
    placement : {"free", "rank-order"}, optional
        Default: free under hetero, rank-order under amp.
    top_k : int
        How many of the best plans to return (enumerate keeps more than one).
    time_limit : float, optional
        Seconds for the whole search.
    seed, workers : int
        For the MIP solvers; fixed so that results repeat.
    progress : callable, optional
        Called as ``progress(done, total)`` after each candidate.

    Returns
    -------
    SolveResult
        Its plans were re-scored by :func:`amp_opt.evaluate` (a plug-in's too).

    Raises
    ------
    InputError
        For bad options (the message names the option).
    InfeasibleError
        When no plan fits (the message says why).
    SolverFailed
        When a plug-in raises or returns a plan the evaluator rejects.

    Examples
    --------
    >>> import amp_opt
    >>> inst = amp_opt.load_instance("instances/amp_het_cluster.json")
    >>> result = amp_opt.solve(inst, cost_model="amp")
    >>> round(result.best.predicted_time, 4), result.solver.status
    (1.0617, 'OPTIMAL')
    """
    options = solve_options(solver=solver, cost_model=cost_model, placement=placement, top_k=top_k,
                            time_limit=time_limit, seed=seed, workers=workers, progress=progress)
    entry = lookup(options.solver)
    if not entry.builtin:
        return run_plugin(entry, instance, options)
    return run_builtin(instance, options)


def run_builtin(instance, options: SolveOptions) -> SolveResult:
    """The built-in search an options record describes (``options.backend`` and its switches)."""
    search = Search(instance, options)
    if options.backend not in ("auto", "enumerate"):
        return solve_mip(search)
    try:
        return solve_enumerate(search)
    except SearchTooLarge as exc:
        if options.backend == "enumerate":
            raise
        spent, why = search.elapsed(), exc.problem
    search.options = dataclasses.replace(options, solver="cpsat", backend="cpsat")
    result = solve_mip(search)
    # The solver block covers the whole search, the enumerator's attempt included.
    stats = dataclasses.replace(result.solver, extra={**result.solver.extra,
                                                      "auto": f"enumerator gave up after {spent:.1f} s: {why}"})
    return dataclasses.replace(result, solver=stats)
