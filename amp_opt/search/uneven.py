"""The search over plans whose stages and replicas differ (engine ``"amp_opt"``).

Exact on small clusters (``formulations/uneven-search.md``, S2): every configuration of
:mod:`.uneven_space` (stages' tp, replicas on nodes, shares, M), one per symmetry class, and
every training setting is priced by the cost terms U1-U4
(:class:`~amp_opt.model.costs.stages.UnevenCosts`); for each, the exact stage DP of
:mod:`.partition` finds the best layer partition (and, in the setting PER_STAGE, each stage's
recomputation mode: S2 step 3); under a MIP solver one program over every configuration and setting
(:mod:`.mip.graph_program`, S5) chooses them all at once.  Past ``MAX_CONFIGURATIONS`` it narrows to the
class-stage space of :mod:`.class_stages` (S6), walked best bound first (:mod:`.class_walk`, S7-S16) and cut off at the
incumbent, and the result says "OPTIMAL within plans of one pipeline (...); plans whose stages and
replicas agree, or whose every stage sits on one node class with even shares" (on the engine that
runs them, plans of several pipelines are priced but not searched: X6 of formulations/exactness.md).  The uniform plans are searched by the
usual search; the better of the two is returned, re-scored by the evaluator.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from ..errors import InfeasibleError, InputError, NoPlanFound
from ..model.costs.hetero import HeteroModel
from ..model.costs.stages import UnevenCosts
from ..model.engines import PER_STAGE_MODES, engine_of, stages_choose_recompute
from ..model.evaluate import Evaluation, evaluate
from ..model.plan import RECOMPUTE, check_plan, parse_plan
from ..model.ranges import INF, grid
from .partition import make_graph, optimal_path, shared_kinds
from .result import SolverStats, SolveResult, status_of
from . import class_stages
from .class_bounds import Bounds
from .class_walk import ranked
from .mip import graph_program
from .mip.backends import BACKENDS, Settings
from .uneven_space import Configuration, configurations

MAX_CONFIGURATIONS = 1_000  # uneven configurations searched at most (each with every setting and its DP)
REL = 1e-9
WARM_SHARE = 0.5  # of the class-stage search's time, for the uniform optimum's neighbours first
# The program over configurations holds at most this many binaries (S5); past it the DP per configuration
# searches.  benchmarks/results/uneven_program.md: the programs' seconds grow with their binaries, up to 39,414
# binaries under 25 s on every backend, 85,403 binaries 23-42 s (the DP 3 s); the limit lies between.
PROGRAM_BINARIES = 50_000
UNIFORM_SHARE = 0.85  # of the time limit, for the uniform search when the uneven one narrows to class stages


def applies(instance, options) -> bool:
    """Whether a solve also searches the uneven plans: an engine that runs them, a cost model
    that prices them (hetero)."""
    return engine_of(instance).uneven and isinstance(options.model, HeteroModel)


PER_STAGE = "per stage"  # the setting whose stages each recompute in full or not at all, as the DP picks


def _settings(instance):
    """Every (sequence_parallel, recompute, recompute_layers, zero_stage) the search section lists
    that an uneven plan may take (ZeRO at most 2).  Where the engine lets stages recompute
    differently, the setting PER_STAGE (each stage "none" or "full", chosen by the DP) replaces
    the two uniform ones it holds."""
    space = instance.search
    modes = [m for m in RECOMPUTE if m in space.recompute]
    if stages_choose_recompute(instance):
        modes = [PER_STAGE] + [m for m in modes if m not in PER_STAGE_MODES]
    for sp in space.sequence_parallel:
        for mode in modes:
            for zero in (z for z in space.zero_stages if z <= 2):
                yield sp, mode, None, zero
                if mode in ("full", PER_STAGE):  # the block method: "full" on every stage
                    for layers in space.recompute_layers:
                        yield sp, "full", layers, zero


def _graph(views: list[UnevenCosts], L: int, stop=None):
    """The stage graph of one configuration and setting, ``views`` its costs in each recomputation
    mode a stage may take (one, or PER_STAGE_MODES): per stage one transition per mode, with one kind
    per distinct (compute, allreduce) table of a mode (stages of one block share one: memory stays
    O(kinds * p * L^2)), the boundary before each stage priced per position (U2), memory as the
    tightest replica's ratio (U4).  None when ``stop()`` turns true (asked per stage: pricing every
    range of a large cluster's stage takes a while)."""
    g, p = grid(L), views[0].pp
    stopped = (lambda: False) if stop is None else stop
    compute, allreduce, kinds = [], [], []
    for costs in views:
        tables = []
        for s in range(p):
            if stopped():
                return None
            tables.append((np.where(g.nonempty, costs.compute(s, g.start, g.stop), INF),
                           np.where(g.nonempty, costs.allreduce(s, g.start, g.stop), INF)))
        c, a, kind_of = shared_kinds(tables)
        kinds.append([k + len(compute) for k in kind_of])
        compute += c
        allreduce += a
    ratio = np.full((p, len(compute), L + 1, L + 1), INF)
    for costs, kind_of in zip(views, kinds):
        for s in range(p):
            ratio[s, kind_of[s]] = np.max([m / c for m, c in costs.replica_memory(s, g.start, g.stop)], axis=0)
    volume = np.zeros((p, L + 1))
    for s in range(1, p):
        volume[s, 1:] = views[0].p2p(s - 1, np.arange(1, L + 1))  # activations: the same in every mode
    transitions = tuple(tuple((0, kind_of[s], 1.0, 0) for kind_of in kinds) for s in range(p))
    return make_graph(views[0].n_micro, np.stack(compute), np.stack(allreduce), ratio, True, volume, transitions,
                      pipeline=views[0].pipeline)


def _rate(instance, plan) -> float | None:
    """USD per hour of the plan's devices (None when a price is missing)."""
    prices = [instance.device_types[instance.nodes[instance.device_node[d]].device_type].price_per_hour
              for stage in plan.stages for group in stage for d in group]
    return None if any(p is None for p in prices) else sum(prices)


@dataclasses.dataclass(frozen=True)
class _Priced:
    """One configuration and setting priced: its stage graph, its plan in each mode the graph's
    transitions stand for, and the objective's units per second of the plan (1, or USD per second)."""

    graph: object
    plans: tuple
    modes: tuple
    scale: float


def _priced(instance, options, tables, cache: dict, conf: Configuration, setting, stop=None) -> _Priced | None:
    """The stage graph of one configuration and setting, or None (an engine rule, over the budget,
    or ``stop()`` turned true)."""
    sp, mode, layers, zero = setting
    L = instance.num_layers
    modes = PER_STAGE_MODES if mode == PER_STAGE else (mode,)
    plans = []
    for m in modes:
        doc = {**conf.plan_doc(instance), "partition": [0, *range(1, conf.pp), L], "sequence_parallel": sp,
               "recompute": m, "zero_stage": zero, **({"recompute_layers": layers} if layers else {})}
        try:
            plans.append(check_plan(instance, parse_plan(doc)))
        except InputError:  # an engine rule on some stage's degrees
            return None
    scale = 1.0
    if options.objective == "cost" or options.budget is not None:
        rate = _rate(instance, plans[0])
        if rate is None:
            raise InputError("instance.device_types", "the cost objective and budgets need every price")
        if options.budget is not None and rate > options.budget * (1 + 1e-12):
            return None
        scale = rate / 3600.0 if options.objective == "cost" else 1.0
    views = []
    for plan in plans:  # pricing a large cluster's configuration takes seconds: the clock is asked between modes
        if stop is not None and stop():
            return None
        views.append(UnevenCosts(options.model, tables, plan, cache=cache))
    graph = _graph(views, L, stop)
    return None if graph is None else _Priced(graph, tuple(plans), modes, scale)


def _plan_of(instance, options, tables, priced: _Priced, path) -> Evaluation | None:
    """The plan of a path through a priced configuration's graph, scored by the evaluator (None if it
    does not fit)."""
    chosen = tuple(priced.modes[t] for t in path.transitions)
    recompute = chosen[0] if len(set(chosen)) == 1 else chosen
    plan = dataclasses.replace(priced.plans[0], partition=path.boundaries, recompute=recompute)
    ev = evaluate(instance, plan, options.model, tables=tables)
    return ev if ev.feasible else None


def _best_of(instance, options, tables, cache: dict, conf: Configuration, setting, kth: float, stop=None):
    """The best plan of one configuration and setting below ``kth`` (objective units), or None;
    ``stop()`` true ends the DP early (its best path so far, not proven: the caller knows)."""
    priced = _priced(instance, options, tables, cache, conf, setting, stop)
    if priced is None:
        return None
    found = optimal_path(priced.graph, cutoff=kth / priced.scale, stop=stop)
    if found is None or found[0] * priced.scale >= kth:
        return None
    return _plan_of(instance, options, tables, priced, found[1])


def _value(ev: Evaluation, objective: str) -> float:
    return ev.cost if objective == "cost" else ev.predicted_time


def search_uneven(instance, options, tables, confs, *, cutoff: float, clock):
    """The best uneven plans (up to top_k, below ``cutoff``), whether every configuration was searched
    before ``clock`` ran out, by what, and a lower bound on the plans not searched (INF when all were,
    0 when nothing is proven).  By what: the stage DP per configuration and setting, or under a MIP
    solver one program over all of them (S5, :mod:`.mip.graph_program`; the DP where that program
    would have more than PROGRAM_BINARIES binaries)."""
    found: list[Evaluation] = []
    cache: dict = {}  # the cost views every configuration shares (UnevenCosts)
    held: list | None = [] if options.backend in BACKENDS else None  # the program's (configuration, setting, part)
    binaries = 0
    for conf in confs:
        if clock.out_of_time():
            return found, False, "DP" if held is None else "program", 0.0
        for setting in _settings(instance):
            if held is None:
                found = _kept(found, options, _best_of(instance, options, tables, cache, conf, setting,
                                                       _kth(found, options, cutoff)))
                continue
            priced = _priced(instance, options, tables, cache, conf, setting)
            if priced is None:
                continue
            part = graph_program.columns(priced.graph, priced.scale)
            held.append((conf, setting, dataclasses.replace(priced, graph=None), part))
            binaries += part.binaries
            if binaries > PROGRAM_BINARIES:  # too large a program: the DP, on what is held and on the rest
                for c, st, _, _ in held:
                    found = _kept(found, options, _best_of(instance, options, tables, cache, c, st,
                                                           _kth(found, options, cutoff)))
                held = None
    if held is None:
        return found, True, f"DP (a program of more than {PROGRAM_BINARIES} binaries)" if binaries else "DP", INF
    found, done, rest = _by_program(instance, options, tables, held, cutoff, clock)
    return found, done, "program", rest


def _kth(found: list[Evaluation], options, cutoff: float) -> float:
    """What a new plan must beat: the k-th best value found, or the cutoff."""
    return _value(found[-1], options.objective) if len(found) >= options.top_k else cutoff


def _kept(found: list[Evaluation], options, ev: Evaluation | None = None) -> list[Evaluation]:
    """The top_k of ``found`` with ``ev`` added."""
    return sorted(found + ([] if ev is None else [ev]), key=lambda e: _value(e, options.objective))[:options.top_k]


def _by_program(instance, options, tables, held: list, cutoff: float, clock):
    """The top_k plans of the program over ``held`` (S5): one solve per plan, each excluding the graphs
    of the plans before it (one plan per configuration and setting, as the DP keeps); whether it ended
    with a proof, and the least value left unsearched (INF when it did; what the last solve proved, else)."""
    parts = [part for _, _, _, part in held]
    settings = Settings(options.seed, options.workers)
    found: list[Evaluation] = []
    excluded: set[int] = set()
    while len(found) < options.top_k:
        out, solution, _ = graph_program.solve_graphs(parts, backend=options.backend, clock=clock, settings=settings,
                                                      cutoff=cutoff, excluded=frozenset(excluded))
        if solution is not None:
            g, path = solution
            excluded.add(g)
            found = _kept(found, options, _plan_of(instance, options, tables, held[g][2], path))
        if out.status == "INFEASIBLE":
            return found, True, INF
        if out.status != "OPTIMAL":  # stopped: the plans not found are bounded by what it proved
            return found, False, out.bound
    return found, True, INF


def _conf_rate(instance, conf: Configuration) -> float | None:
    """USD per hour of a configuration's devices (None when a price is missing)."""
    prices = [instance.device_types[instance.nodes[node].device_type].price_per_hour
              for tp, stage in zip(conf.tps, conf.replicas) for node, _ in stage for _ in range(tp)]
    return None if any(p is None for p in prices) else sum(prices)


def _setting_of(instance, plan):
    """The uneven search's setting closest to a uniform plan's (ZeRO at most 2): its own, or PER_STAGE
    where that holds its mode (:func:`_settings`)."""
    mode = plan.recompute if isinstance(plan.recompute, str) else PER_STAGE
    layers = plan.recompute_layers if mode == "full" else None
    if mode in PER_STAGE_MODES and not layers and stages_choose_recompute(instance):
        mode = PER_STAGE
    return plan.sequence_parallel, mode, layers, min(plan.zero_stage or 0, 2)


def _visit(instance, options, tables, cache, conf, settings, found, cutoff, clock) -> list[Evaluation]:
    """``found`` with the best plan of each setting of one configuration added (top_k kept)."""
    for setting in settings:
        if clock.out_of_time():
            break
        ev = _best_of(instance, options, tables, cache, conf, setting, _kth(found, options, cutoff),
                      stop=clock.out_of_time)
        found = _kept(found, options, ev)
    UnevenCosts.forget_stage_views(cache)
    return found


def search_class_stages(instance, options, tables, *, cutoff: float, clock, near=None):
    """The best plans of the class-stage space R (S6) below ``cutoff``, best bound first (S7-S16):
    (plans, whether R was searched whole, the least bound over R's configurations not searched).
    ``near``: a uniform plan whose neighbours in R (:func:`.class_stages.neighbours`) are tried
    first, in its own setting, for an early incumbent."""
    bounds = Bounds(instance, tables, options.model)
    found: list[Evaluation] = []
    cache: dict = {}
    obj = options.objective
    if near is not None:
        warm = clock.share(WARM_SHARE)
        for M, order in class_stages.neighbours(instance, near):
            if warm.out_of_time():
                break
            conf = class_stages.configuration(instance, M, order)
            found = _visit(instance, options, tables, cache, conf, [_setting_of(instance, near)], found, cutoff, warm)

    def incumbent() -> float:  # read by the walk as it goes: ``found`` grows
        return _kth(found, options, cutoff)

    zeros = class_stages.zero_stages(instance)  # R's configurations have two stages or more
    settings = [s for s in _settings(instance) if s[3] in zeros]

    for key, M, order in ranked(instance, bounds, limit=incumbent if obj == "time" else None,
                               stop=clock.out_of_time):
        kth = incumbent()
        if order is None:  # no configuration: only the stops apply
            if obj == "time" and key >= kth:
                return found, True, INF
            if clock.out_of_time():
                return found, False, key if obj == "time" else 0.0
            continue
        scale = 1.0
        conf = class_stages.configuration(instance, M, order)
        if obj == "cost" or options.budget is not None:
            rate = _conf_rate(instance, conf)
            if rate is None:
                raise InputError("instance.device_types", "the cost objective and budgets need every price")
            if options.budget is not None and rate > options.budget * (1 + 1e-12):
                continue
            scale = rate / 3600.0 if obj == "cost" else 1.0
        if obj == "time" and key >= kth:
            return found, True, INF  # every configuration left is bounded at or above the incumbent
        if clock.out_of_time():
            return found, False, key if obj == "time" else 0.0
        if not bounds.below(M, order, kth / scale):
            continue
        found = _visit(instance, options, tables, cache, conf, settings, found, cutoff, clock)
        if clock.out_of_time():
            return found, False, key if obj == "time" else 0.0
    return found, True, INF


ONE_PIPELINE = "plans of one pipeline (plans of several pipelines are priced by evaluate, not searched)"
SEVERAL_UNSEARCHED = "plans of several pipelines are not searched"  # what an infeasible verdict leaves out (X6)


def solve_with_uneven(instance, options, run, clock) -> SolveResult:
    """The uniform search (``run(clock)``) and the uneven one, merged: the best plans of both, OPTIMAL
    when both were searched whole (``clock``: the solve's :class:`~amp_opt.search.clock.Clock`).
    Past MAX_CONFIGURATIONS the uneven search narrows to the class-stage space (S6) and says so."""
    from ..model.tables import Tables

    started = clock.start
    confs, complete = configurations(instance, limit=MAX_CONFIGURATIONS)
    narrow = options.placement == "free" and not complete
    try:
        uniform, why_none = run(clock.part(UNIFORM_SHARE) if narrow else clock), None
    except InfeasibleError as exc:  # no uniform plan fits: the uneven ones may
        uniform, why_none = None, exc
    except NoPlanFound as exc:  # none found in the uniform search's share of the time: the uneven ones may
        if not narrow:
            raise
        uniform, why_none = None, exc
    # the engine runs several pipelines too (X6 of formulations/exactness.md): the searches list one
    within = (uniform.solver.within + "; " if uniform is not None and uniform.solver.within else "") + ONE_PIPELINE
    if options.placement != "free":
        within += "; plans whose stages and replicas agree (rank-order placement)"
        if uniform is None:
            raise InfeasibleError(f"{why_none} (uneven plans were not searched: rank-order placement)")
        return dataclasses.replace(uniform, solver=dataclasses.replace(uniform.solver, within=within))
    top = list(uniform.top) if uniform is not None else []
    obj = options.objective
    cutoff = _value(top[options.top_k - 1], obj) * (1 + REL) if len(top) >= options.top_k else options.cutoff
    rest = INF
    if narrow:
        found, done, rest = search_class_stages(instance, options, Tables(instance), cutoff=cutoff, clock=clock,
                                                near=top[0].plan if top else None)
        within += (
            f"; plans whose stages and replicas agree, or whose every stage sits on one node class with even shares "
            f"(class stages: more than {MAX_CONFIGURATIONS} uneven configurations)")
        stats = {"space": "class stages", "searched_whole": done, "plans_found": len(found)}
    else:
        found, done, by, rest = search_uneven(instance, options, Tables(instance), confs, cutoff=cutoff, clock=clock)
        stats = {"configurations": len(confs), "searched_whole": done, "plans_found": len(found), "by": by}
    merged = _kept(top + found, options)
    if not merged:
        if isinstance(why_none, NoPlanFound) or not done:
            proven = (f"no plan whose stages and replicas agree fits ({why_none}), and the class stages were not "
                      "searched whole" if isinstance(why_none, InfeasibleError) else "")
            raise NoPlanFound(clock.stopped_why(), bound=0.0, proven=proven)
        differ = ("nor does any plan whose every stage sits on one node class with even shares; other plans whose "
                  "stages or replicas differ are not searched" if narrow else
                  "nor does any plan whose stages or replicas differ")
        raise InfeasibleError(f"{why_none} ({differ}; {SEVERAL_UNSEARCHED})")
    best = _value(merged[0], obj)
    if options.top_k > 1:  # the uneven search keeps one plan per configuration and setting
        within += "; one plan per configuration of stages and replicas that differ (--top-k)"
    u_bound = uniform.solver.bound if uniform is not None else (
        why_none.bound if isinstance(why_none, NoPlanFound) else INF)  # a uniform search stopped early proved only this
    bound = min(u_bound, best) if done else min(u_bound, best, rest)
    stats["uniform_objective"] = _value(top[0], obj) if top else None  # the uniform search's own best
    extra = {**(uniform.solver.extra if uniform is not None else {}), "uneven": stats}
    base = uniform.solver if uniform is not None else SolverStats(options.solver, "OPTIMAL", 0.0, best, best)
    status = status_of(best, bound) if base.status == "OPTIMAL" or uniform is None else "FEASIBLE"
    solver = dataclasses.replace(base, status=status if done else "FEASIBLE", objective=best, bound=bound,
                                wall_time=time.perf_counter() - started, extra=extra, within=within)
    return SolveResult(merged[0], tuple(merged), solver)
