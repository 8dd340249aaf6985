"""``solve``: one entry point over the solvers, with the options checked once at the boundary."""

from __future__ import annotations

import dataclasses
import inspect

from ..errors import InfeasibleError, SearchTooLarge
from ..model.costs.contract import check_rows_price
from ..model.coarsen import coarsen
from .blocks import solve_blocks
from .clock import Clock
from .context import Search
from .enumerate import solve_enumerate
from .mip.driver import solve_mip
from .options import SolveOptions, signature, solve_options
from .registry import lookup, run_plugin
from .result import SolveResult
from .route import enumerator_fits
from .subsets import solve_subsets
from . import several_pipelines, uneven  # at the top: every solve asks uneven.applies; `import amp_opt` loads solve on first use


def solve(instance, *, started: float | None = None, **options) -> SolveResult:
    """Find the fastest plan of an instance under a cost model.

    The options are keyword-only; their names and defaults are the option fields of
    :class:`~amp_opt.search.options.SolveOptions` (``inspect.signature(solve)`` lists them).

    Parameters
    ----------
    instance : Instance
    solver : str
        A registered solver name: auto (default: the exact enumerator, or CP-SAT when free
        grouping is too large to enumerate, estimated from the instance before either starts,
        :mod:`amp_opt.search.route`), enumerate, cpsat, cbc, highs, their ablation and
        formulation variants (``formulations/variants.md``), or a plug-in's name
        (:func:`amp_opt.register_solver`).
    cost_model : {"hetero", "amp"} or CostModel
        hetero (default): per-device speeds, slowest links, memory limits; amp: the
        AMP paper's model.  An object of the caller's prices every path through its
        ``candidate_terms``; one that overrides ``stage_costs`` or ``lower_bound`` instead is
        searched by the enumerator only (``formulations/hetero.md``, "One source of terms").
    placement : {"free", "rank-order"}, optional
        Default: free under hetero, rank-order under amp.
    top_k : int
        How many of the best plans to return: the K best distinct plans
        (``formulations/exactness.md``, "The k best plans"; a MIP solver lists one plan for a
        candidate whose free grouping is too large to list, and the result then says so).
    per_candidate : bool
        With ``top_k``: the best plan of each of the K best candidates (AMP's ranking).
    pipelines : {"skip", "bound"}
        On the engine "amp_opt": plans of several pipelines are left out of the search (skip,
        default: OPTIMAL says so), or also ruled out where the bound P1 over every split of a small
        cluster's devices and batch proves that none beats the plan found (bound;
        ``formulations/exactness.md``, X6; ``solver.extra["pipelines"]`` says what it proved).
    time_limit : float, optional
        Seconds for the whole search, counted from ``started``.  A search cut short returns
        the best plan found so far (status FEASIBLE, with its proven bound).
    seed, workers : int
        For the MIP solvers; fixed so that results repeat.
    objective : {"time", "cost"}
        Seconds per iteration (default), or USD per iteration at the used devices' $/hour.
    budget : float, optional
        USD per hour the used devices may cost at most (with objective "time").
    progress : callable, optional
        Called as ``progress(done, total)`` after each candidate.
    started : float, optional
        ``time.perf_counter()`` when the time limit started counting (the CLI passes the
        start of the process); default: now.
    processes : int
        With a time limit and idle GPUs allowed: the whole cluster is searched in this process
        and the other subsets of node classes in up to ``processes`` - 1 forked processes beside
        it, capped by the usable cores (Linux only).  Default 1: one after another in this
        process (the CLI's default is 2).

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
    NoPlanFound
        When the time limit or a stop request (:mod:`amp_opt.search.stop`) ended the search
        before it found a plan or proved that none exists.
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
    options = solve_options(**options)
    entry = lookup(options.solver)
    if not entry.builtin:  # a plug-in gets the whole instance; its plans are re-scored by the evaluator
        return run_plugin(entry, instance, options)
    clock = Clock.of(options.time_limit, started)
    if options.pipelines != "bound" or not uneven.applies(instance, options):
        return _search(instance, options, clock)
    try:
        result = _search(instance, options, clock)
    except InfeasibleError as exc:  # of one pipeline: P1 says whether several pipelines fit
        raise several_pipelines.infeasible(instance, options, exc, clock, _search) from None
    return several_pipelines.checked(instance, options, result, clock, _search)


def _search(instance, options: SolveOptions, clock: Clock) -> SolveResult:
    """The built-in search of one instance: every set of its devices, and on the engine amp_opt the
    plans whose stages and replicas differ too."""
    if uneven.applies(instance, options):
        return uneven.solve_with_uneven(instance, options, lambda part: solve_subsets(instance, options, run_builtin, part),
                                        clock)
    return solve_subsets(instance, options, run_builtin, clock)



solve.__signature__ = signature(before=[inspect.Parameter("instance", inspect.Parameter.POSITIONAL_OR_KEYWORD)],
                                after=[inspect.Parameter("started", inspect.Parameter.KEYWORD_ONLY, default=None)])


def run_builtin(instance, options: SolveOptions, clock: Clock | None = None) -> SolveResult:
    """The built-in search an options record describes (``options.backend`` and its switches) on
    one instance (all its devices), with the options' cutoff, by ``clock`` (default: the options'
    time limit from now); a long model is searched over blocks of identical layers."""
    clock = Clock.of(options.time_limit) if clock is None else clock
    coarse = coarsen(instance)
    if coarse is not None:
        return solve_blocks(instance, *coarse, lambda inst, inner: run_builtin(
            inst, dataclasses.replace(options, carry=None), inner), clock, model=options.model)
    search = Search(instance, options, clock)
    if options.backend not in ("auto", "enumerate"):
        return solve_mip(search)
    if options.backend == "auto":
        fits, why = enumerator_fits(instance, options.placement)
        if not fits:
            check_rows_price(options.model, f"CP-SAT (auto's choice: {why})")
            return _noting(_as_cpsat(search), f"CP-SAT chosen up front: {why}")
    try:
        return solve_enumerate(search)
    except SearchTooLarge as exc:
        if options.backend == "enumerate":
            raise
        spent, why = search.elapsed(), exc.problem
        check_rows_price(options.model, f"CP-SAT (auto's choice: {why})")
    # The estimate let the enumerator start, but a candidate was larger than estimated.
    return _noting(_as_cpsat(search), f"enumerator gave up after {spent:.1f} s: {why}")


def _as_cpsat(search: Search) -> SolveResult:
    search.options = dataclasses.replace(search.options, solver="cpsat", backend="cpsat")
    return solve_mip(search)


def _noting(result: SolveResult, note: str) -> SolveResult:
    """The result with how ``auto`` chose its solver; the solver block covers the whole search."""
    stats = dataclasses.replace(result.solver, extra={**result.solver.extra, "auto": note})
    return dataclasses.replace(result, solver=stats)
