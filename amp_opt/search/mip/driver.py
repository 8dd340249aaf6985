"""The MIP solvers: the outer loop over candidates around one program per candidate.

``formulations/mip.md`` states the program and this loop.  Outer choices (tp, dp, pp,
micro-batch) are enumerated around it: there are few of them, each program is then
smaller and tighter (w = n-1 and the memory in flight are constants), and candidates
are pruned with the best objective found so far.  In order:

1. every candidate gets a fast incumbent from the exact stage DP on a few fixed node
   orders (AMP's rank order, fastest nodes first, slowest first; :mod:`.fixed_orders`); under a time limit this
   phase ends at P1_SHARE of the time left once it has a plan (P1_KINDS_SHARE when phase
   1b follows, whose plans are better; without a plan it goes on until it has one), and the
   quick kind bounds before the DP stop at P1_QUICK_SHARE;
1b. under the hetero model with free grouping on large clusters, the stage-kind search
   (:mod:`amp_opt.search.kinds.refine`) tightens every candidate's bound and improves
   the plans;
2. the programs, most promising first, warm-started and cut off at the k-th best value.

Each ingredient can be switched off through the options record (``kinds``,
``incumbents``, ``warm_start``, ``cutoffs``, ``symmetry``; the ablation variants of
``formulations/variants.md``), and the layer assignment can be the prefix or the
assignment formulation (``layers``).  The backend is ``options.backend`` (CP-SAT, CBC or
HiGHS, :mod:`.backends`), each program handed its share of the search's clock.  The search's trace records the best plan and the proven bound over time, and
every program's statistics are returned in ``SolverStats.programs``.

The returned plans are re-scored by the evaluator.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ...errors import InfeasibleError, NoPlanFound
from ...model.candidates import candidates, why_empty
from ...model.costs.contract import check_rows_price
from ...model.plan import Candidate, describe_candidate, rank_order_stages
from ..clock import Clock
from ..diagnose import verdict
from ..kinds.refine import KindPhase, runs_kinds
from ..result import SAME, Incumbent, NoPlanBelow, SolverStats, SolveResult, status_of
from ..tuning import (BOUNDS_SHARE, KIND_FIRST, P1_KINDS_SHARE, P1_QUICK_SHARE, P1_SHARE, PROGRAM_FLOOR,
                      PROGRAM_SHARE, SOLVER_FLOOR)
from .backends import Program, Settings, resolution_for, run_backend
from .fixed_orders import heuristic
from .formulation import build
from .listing import Listing, PlanKeys, list_candidates, open_candidates


@dataclass
class Proofs:
    """What phase 2 found and proved, per candidate."""

    results: list[Incumbent] = field(default_factory=list)  # plans, with the solver's objective
    bound: dict = field(default_factory=dict)  # candidate -> proven lower bound
    closed: bool = True  # every candidate's bound is proven (no program was cut short without one)
    sizes: dict = field(default_factory=lambda: {"variables": 0, "constraints": 0, "programs": 0})
    build_rate: float = 0.0  # the most seconds per stage x layer that building a program took
    programs: list = field(default_factory=list)  # per program: candidate, status, objective, bound, seconds, ...


def _dual(cands, lower: dict, proofs: Proofs | None = None, skip=None) -> float:
    """The proven bound on the optimum right now: the least over candidates of what is proven for each."""
    bound = proofs.bound if proofs is not None else {}
    return min([bound.get(c, lower[c]) for c in cands if c != skip], default=np.inf)


def solve_mip(search) -> SolveResult:
    """Solve every promising candidate's program with CP-SAT, CBC or HiGHS; exact unless stopped by time."""
    instance, opts = search.instance, search.options
    check_rows_price(search.model, opts.solver)  # the rows price by candidate_terms (terms.py)
    cands = candidates(instance, search.model)
    if not cands:
        raise InfeasibleError(why_empty(instance))
    carry = opts.carry
    phase = None
    if opts.kinds and runs_kinds(search):
        phase = carry.kinds if carry is not None and carry.kinds is not None else KindPhase(search)
        phase.search = search
    # First bounds: without phase 1b the labelled bound (B2, about 10 ms per candidate on 256
    # GPUs), else the cost model's plain bound (B3, 1-2 ms).  They stop at BOUNDS_SHARE of the
    # time, so that phase 1 has time for plans (the 4044 candidates of a 1024-GPU instance take
    # 6 s, which left a 5 s limit no time for one).  A candidate left without one counts 0
    # (nothing proven), comes last in phase 1 and is bounded when reached there, or after phase 1
    # while time is left: bounds are what proves that an idle-GPU subset has no plan, or none
    # below the cutoff (left at 0, the subsets of a 1024-GPU instance given about a second each
    # proved nothing, and the solve's bound fell to a floor).
    # A search run again (``opts.carry``) starts from what the last one proved and found: its
    # bounds are remembered, and phase 1 skips the candidates whose DP ran.
    until = search.clock.share(BOUNDS_SHARE)
    lower = dict.fromkeys(cands, 0.0)
    unbounded = _first_bounds(search, cands, lower, phase is None, until)
    reached = set() if carry is None else carry.reached
    incumbents = {} if carry is None else carry.incumbents
    if carry is not None:
        for c, value in carry.lower.items():
            lower[c] = max(lower[c], value)
            unbounded.discard(c)
    proofs = Proofs()
    try:
        best = _incumbents(search, cands, lower, phase, unbounded, incumbents, reached)
        unbounded &= _first_bounds(search, [c for c in cands if c in unbounded], lower, phase is None,
                                   search.clock)
        search.trace.update(best if np.isfinite(best) else None, _dual(cands, lower))
        if phase is not None:
            best = phase.refine(incumbents, lower, best, SAME)
            search.trace.update(best if np.isfinite(best) else None, _dual(cands, lower))
        keys = PlanKeys(instance)
        # --top-k K: the K best plans of the candidates the enumerator can walk, listed exactly first.
        listing = (list_candidates(search, cands, lower, incumbents, keys)
                   if opts.top_k > 1 and not opts.per_candidate else None)
        proofs = _programs(search, cands, lower, incumbents, phase, listing, keys)
    finally:
        if carry is not None:  # what this run proved, for the next one
            # (a candidate without its first bound keeps what phase 1b proved of it, if anything)
            carry.lower = {c: max(lower[c], proofs.bound.get(c, 0.0)) for c in cands
                           if c not in unbounded or lower[c] > 0}
            if phase is not None:  # the next run starts at most at these (its cutoff falls, it keeps the incumbents)
                phase.release(lower, min([opts.cutoff] + [x.value for x in incumbents.values()]))
            carry.kinds = phase
            carry.build_rate = max(carry.build_rate, proofs.build_rate)
    proofs.results = [r for r in proofs.results if r.value < opts.cutoff]
    if not proofs.results:
        if not proofs.closed:
            raise NoPlanFound(search.stopped_why(), bound=_dual(cands, lower, proofs))
        if np.isfinite(opts.cutoff):  # nothing beats the plan the caller has (or nothing fits at all)
            raise NoPlanBelow(opts.cutoff)
        example = " rank-order plan (free grouping was searched too)" if opts.placement == "free" else ""
        raise InfeasibleError(verdict(search, example=example))
    return _result(search, cands, proofs, listing, keys)


def _first_bounds(search, cands, lower: dict, labelled: bool, until: Clock) -> set:
    """Each candidate's first bound into ``lower`` (B2 if ``labelled``, else B3), in turn until
    ``until`` runs out; returns the candidates left without one (their entry unchanged)."""
    left = set()
    for c in cands:
        if until.out_of_time():
            left.add(c)
        else:
            lower[c] = search.lower_bound(c, labelled=labelled)
    return left


def _incumbents(search, cands, lower: dict, phase: KindPhase | None, unbounded: set, incumbents: dict,
                reached: set) -> float:
    """Phase 1: incumbents from the DP into ``incumbents``, candidates in order of their lower bound
    (those without one last, bounded when reached and taken out of ``unbounded``; those in
    ``reached``, whose DP ran in an earlier run, skipped); returns the best value.  Under free
    grouping the kind bound (eq. B4) first gets a quick try at ruling the candidate out."""
    best = min([search.options.cutoff] + [inc.value for inc in incumbents.values()])
    until = search.clock.share(P1_SHARE if phase is None else P1_KINDS_SHARE)
    quick_until = search.clock.share(P1_QUICK_SHARE)
    leanest = leanest_siblings(cands)

    def incumbent(c):
        """The candidate's DP incumbent into ``incumbents`` (None if no fixed order fits)."""
        inc = heuristic(search, c) if search.options.incumbents else None
        if not search.out_of_time():  # (else its DP may have tried only some node orders)
            reached.add(c)
        if inc is not None:
            incumbents[c] = inc
        return inc

    for c in sorted(cands, key=lambda c: (c in unbounded, lower[c], c)):
        if lower[c] >= best or c in reached:
            continue  # an unbounded candidate may follow
        if search.out_of_time() or (np.isfinite(best) and until.out_of_time()):
            break
        if c in unbounded:  # its first bound before its DP: a few milliseconds, and it may rule it out
            unbounded.discard(c)
            lower[c] = search.lower_bound(c, labelled=phase is None)
            if lower[c] >= best:
                continue
        # Before the first plan the DP goes first: a plan is what every later phase needs.
        if phase is not None and np.isfinite(best) and not quick_until.out_of_time():
            lower[c] = phase.quick_bound(c, lower[c], best, quick_until)
            if lower[c] >= best:
                continue
        inc = incumbent(c)
        if inc is None and not np.isfinite(best) and search.options.incumbents and not search.out_of_time():
            # No plan yet, and none of this candidate's fixed orders fits: the candidates of the
            # lowest bounds are often those that keep the most memory.  Its leanest sibling (same
            # degrees, the least memory) is tried at once, so that a plan comes early.
            lean = leanest[_degrees(c)]
            if lean not in reached and lower[lean] < best:
                inc = incumbent(lean)
        if inc is not None:
            best = min(best, inc.value)
        elif phase is not None and not np.isfinite(best) and not quick_until.out_of_time():
            lower[c] = phase.quick_bound(c, lower[c], best, quick_until)  # may prove it has no plan
    return best


def _degrees(c: Candidate) -> tuple:
    return c.tp, c.cp, c.dp, c.pp, c.virtual_stages


def leanest_siblings(cands) -> dict:
    """Per (tp, cp, dp, pp, virtual stages): the candidate that keeps the least memory per device
    on every stage, whatever its layers (the smallest micro-batch, full recomputation of every
    layer (or each stage's choice of it), the highest ZeRO stage, sequence parallelism): phase 1's
    fallback for a first plan."""
    def lean(c):
        full = c.recompute == "full" and c.recompute_layers == 0
        return (c.micro_batch, not full, c.recompute != "selective", -c.zero_stage, not c.sequence_parallel, c)

    out: dict = {}
    for c in cands:
        key = _degrees(c)
        if key not in out or lean(c) < lean(out[key]):
            out[key] = c
    return out


def _programs(search, cands, lower: dict, incumbents: dict, phase: KindPhase | None = None,
              listing: Listing | None = None, keys: PlanKeys | None = None) -> Proofs:
    """Phase 2: the programs, most promising first, each cut off at the k-th best value so far
    (the candidates ``listing`` listed exactly are done: their plans and bounds are taken as they are).
    Under a time limit, a candidate whose kind search phase 1b kept first gets one more round of
    that bound, within KIND_FIRST of its share (a program on a large cluster seldom proves anything
    in a fraction of a second; the kind bound often rules the candidate out), and its program only
    if it stays open."""
    opts = search.options
    order = sorted(cands, key=lambda c: (incumbents[c].value if c in incumbents else np.inf, lower[c], c))
    proofs = Proofs()
    if opts.carry is not None:  # a build this solve timed before (another run, another subset)
        proofs.build_rate = opts.carry.build_rate
    if listing is not None:
        proofs.results += listing.found
        proofs.bound.update(listing.bound)

    def kth_best():
        plans = proofs.results + [incumbents[x] for x in incumbents if x not in proofs.bound]
        if keys is not None and opts.top_k > 1:  # each plan once (two candidates may write one plan)
            return keys.kth(plans, opts.top_k, opts.cutoff)
        values = sorted(r.value for r in plans)
        return min(values[opts.top_k - 1] if len(values) >= opts.top_k else np.inf, opts.cutoff)

    def share(i, kth) -> Clock:
        """The i-th candidate's clock: what is left, shared among the candidates still open (the
        first ones get a bit more)."""
        if search.clock.deadline is None:
            return search.clock
        still_open = sum(1 for x in order[i:] if lower[x] < kth)
        return search.clock.share(PROGRAM_SHARE, among=still_open, floor=PROGRAM_FLOOR)

    for i, c in enumerate(order):
        if listing is not None and c in listing.bound:
            continue
        kth = kth_best()
        kind_first = (lower[c] < kth * (1 - SAME) and phase is not None and phase.kept(c)
                      and not search.out_of_time() and search.clock.deadline is not None)
        if kind_first:
            phase.raise_bounds([c], lower, kth, share(i, kth).share(KIND_FIRST))
        if lower[c] >= kth * (1 - SAME):
            # Nothing of this candidate beats the k-th best; its own warm start may be that plan.
            if c in incumbents:
                proofs.results.append(incumbents[c])
            proofs.bound[c] = lower[c]
            if kind_first:
                search.trace.update(None, _dual(cands, lower, proofs))
        elif search.out_of_time() or not _time_to_build(search, c, proofs):
            proofs.closed = False
            proofs.bound[c] = lower[c]
            if c in incumbents:  # no time for its program: its plan from phases 1 and 1b stands
                proofs.results.append(incumbents[c])
        else:
            others = _dual(cands, lower, proofs, skip=c)
            _program(search, c, lower[c], incumbents.get(c), kth, share(i, kth), proofs, others)
            # Only a program or a kind bound moves the best plan or the bound (a skipped candidate
            # keeps its lower bound and its incumbent, both counted already): the trace, O(candidates), after them.
            best_plan = min([r.value for r in proofs.results] + [x.value for x in incumbents.values()], default=None)
            search.trace.update(best_plan, _dual(cands, lower, proofs))
        if opts.progress is not None:
            opts.progress(i + 1, len(order))
    return proofs


def _time_to_build(search, c: Candidate, proofs: Proofs) -> bool:
    """Whether the time left covers building the candidate's program (and handing it to the
    solver, about as long again, and decoding), estimated from the slowest build so far per
    stage x layer: a program's size grows with p x L.  Before this run's first build, the
    slowest of the solve's earlier runs counts (the idle-GPU search's carries share it); only
    the solve's very first build starts without an estimate."""
    left = search.clock.remaining()
    return left is None or left > 3.0 * proofs.build_rate * c.pp * search.instance.num_layers + 0.05


def _program(search, c: Candidate, lower: float, inc: Incumbent | None, kth: float, clock: Clock, proofs: Proofs,
             others: float = -np.inf) -> None:
    """Build, solve (by ``clock``) and decode one candidate's program; record its plan and what
    it proved.  ``others`` is the proven bound over the other candidates (for the trace)."""
    opts = search.options
    started = time.perf_counter()
    form = build(search, c, None if opts.placement == "free" else rank_order_stages(c.tp, c.dp, c.pp, c.cp))
    built = time.perf_counter() - started
    proofs.build_rate = max(proofs.build_rate, built / (c.pp * search.instance.num_layers))
    clock = clock.at_least(SOLVER_FLOOR)  # the solver gets what is left of the share once the program is built
    if inc is not None and opts.warm_start:
        form.hint_from(search.stage_boundaries(c, inc.boundaries), inc.stages)
    scale = inc.value if inc is not None else lower
    if not (np.isfinite(scale) and scale > 0):
        scale = 1.0
    delta = resolution_for(scale, form.model)
    tol = form.terms * delta + 1e-9 * scale
    cutoff = kth * (1 + 1e-9) + tol if np.isfinite(kth) and opts.cutoffs else None
    out = run_backend(opts.backend, Program(form.model, scale, delta, cutoff), clock,
                      Settings(opts.seed, opts.workers))
    # The program's incumbents and bounds, on the search's clock (plans at the program's value).  Under a
    # cutoff the program bounds only the plans at most that good, so the candidate's bound is capped by it.
    cap = cutoff if cutoff is not None else np.inf
    for t, objective, bound in out.progress:
        dual = min(others, max(lower, min(bound, cap))) if bound is not None else None
        search.trace.update(objective, dual if dual is not None and np.isfinite(dual) else None, at=t)
    _count(proofs.sizes, out, form.model.size)
    found = np.inf
    if out.values is not None:
        boundaries, stages = form.decode(out.values)
        boundaries = search.partition(c, boundaries)
        plan = search.plan(c, boundaries, stages)
        ev = search.evaluate(plan)
        if ev.feasible:
            found = ev.predicted_time
            # A solution stopped short of optimality may leave slack (a class marked in use that
            # is not); re-scoring tightens it, so the program's value of this plan is the score.
            proofs.results.append(Incumbent.of_plan(found, c, plan, min(out.objective, found)))
    if inc is not None and inc.value < found:
        proofs.results.append(inc)  # the program stopped without beating its warm start
    proofs.programs.append({
        "candidate": describe_candidate(c), "status": out.status,
        "objective": out.objective, "bound": out.bound, "plan_time": found if np.isfinite(found) else None,
        "seconds": time.perf_counter() - started, "solver_seconds": out.wall_time, "nodes": out.nodes,
        "variables": form.model.size["variables"], "constraints": form.model.size["constraints"],
        "warm_start": inc is not None and opts.warm_start, "cutoff": cutoff, "lower_bound": lower})
    _record_proof(proofs, c, out, inc, lower, tol, cutoff)


def _count(sizes: dict, out, size: dict) -> None:
    """One more program in the search's statistics: the count, the rejected ones, the largest sizes."""
    sizes["programs"] += 1
    if out.rejected:  # the program exists but the solver could not take it: no proof, no plan
        sizes["programs_rejected"] = sizes.get("programs_rejected", 0) + 1
    sizes["variables"] = max(sizes["variables"], size["variables"])
    sizes["constraints"] = max(sizes["constraints"], size["constraints"])


def _record_proof(proofs: Proofs, c: Candidate, out, inc: Incumbent | None, lower: float, tol: float,
                  cutoff: float | None) -> None:
    """What one candidate's program proved about it, into ``proofs`` (``tol``: the program's
    integer resolution on the objective's path)."""
    # What an optimal program proves is its bound (CP-SAT and CBC: the objective; HiGHS: its dual
    # bound, which may sit below a solution it accepted within its tolerances).
    proven = out.bound if out.status == "OPTIMAL" and out.bound is not None else out.objective
    if out.status == "OPTIMAL" and inc is not None and inc.value < proven - tol:
        if inc.value >= proven * (1 - SAME):
            # Beaten within the evaluator's resolution (a solver's feasibility tolerance moves the
            # program's value of a plan by that much): the proof stands, at the known plan.
            proofs.bound[c] = inc.value
        else:  # a known plan beats the claimed optimum: do not trust the proof (numerics)
            proofs.closed = False
            proofs.bound[c] = lower
    elif out.status == "OPTIMAL":
        proofs.bound[c] = proven
    elif out.status == "INFEASIBLE":
        proofs.bound[c] = cutoff if cutoff is not None else np.inf
    else:
        proofs.closed = False
        proofs.bound[c] = max(lower, out.bound if out.bound is not None else -np.inf)


def _result(search, cands, proofs: Proofs, listing: Listing | None, keys: PlanKeys) -> SolveResult:
    opts = search.options
    if opts.top_k > 1:  # each plan once
        ranked = keys.distinct(proofs.results)
    else:
        ranked = sorted(proofs.results, key=lambda r: (r.value, r.candidate))
    top = ranked[:opts.top_k]
    evaluations = tuple(search.evaluate(r.plan) for r in top)
    objective = top[0].objective if top[0].objective is not None else top[0].value
    bound = min([objective] + list(proofs.bound.values()))
    # Every candidate's bound is proven (solved, cut off, or bounded), so a bound that meets
    # the objective proves it optimal even when some program stopped at the time limit.
    search.trace.update(top[0].value, min(bound, objective))
    # With --top-k: the candidates listed one plan each that may hold more of the K best; whether the
    # list may miss a plan is decided against the K-th plan over every set of devices (subsets.py).
    unlisted = open_candidates(listing, proofs.bound, keys.kth(top, opts.top_k, np.inf)) if listing else []
    listed = {"top_k_open": unlisted, "top_k_stopped": listing.stopped} if listing else {}
    stats = SolverStats(
        name=opts.solver,
        status=status_of(objective, bound),
        wall_time=search.elapsed(),
        objective=objective,
        bound=min(bound, objective),
        extra={"placement": opts.placement, "candidates": len(cands), **proofs.sizes,
               **({"time_resolution_relative": 1e-8} if opts.backend == "cpsat" else {}),
               **({"stopped": search.stopped_why()} if status_of(objective, bound) != "OPTIMAL" and search.out_of_time() else {}),
               **listed},
        trace=search.trace.as_tuple(),
        programs=tuple(proofs.programs),
    )
    return SolveResult(evaluations[0], evaluations, stats)
