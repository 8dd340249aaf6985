"""The MIP solvers: the outer loop over candidates around one program per candidate.

``formulations/mip.md`` states the program.  Outer choices (tp, dp, pp,
micro-batch) are enumerated around it: there are few of them, each program is
then smaller and tighter (w = n-1 and the memory in flight are constants), and
candidates are pruned with the best objective found so far.  Every candidate
first gets a fast incumbent from the exact stage DP on a few fixed node orders
(AMP's rank order, fastest nodes first, slowest first), which seeds the
program's hint and the cutoff.  Under the hetero model with free grouping a
stage-kind search (``amp_opt.lagrange``: a Lagrangian bound and layouts of
kind multisets) then tightens every candidate's bound and improves the plans
before the programs run.  The returned plans are re-scored by the evaluator.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np

from ..candidates import Candidate, candidates, why_empty
from ..cost import StageCosts, evaluate
from ..errors import InfeasibleError
from ..partition import fixed_placement_graph, good_path
from ..plan import Plan, rank_order_stages
from ..result import SolverStats, SolveResult
from .backends import resolution_for, solve_cbc, solve_cpsat
from .formulation import build


KIND_MIN_NODES = 8  # nodes from which the stage-kind search (phase 1b) runs
KIND_ROUNDS = 4  # rounds of bound refinement and plan building (eq. B4, K6); more while they pay
KIND_PROGRESS = 1e-4  # relative move of the best plan or the weakest bound that pays for a round
KIND_SHARE = 0.75  # share of the time left that phase 1b may spend
KIND_SWEEPS = 400  # DP paths per candidate and round for the Lagrangian kind bound
POLISHED = 3  # candidates (lowest bounds first) that get plans built per round
SAME = 1e-6  # relative difference below which a bound counts as reaching a value
QUICK_SWEEPS = 60  # DP paths of the kind bound before a candidate's first incumbent
POLISH_CELLS = 3  # threshold cells (the weakest) at which an incumbent is re-partitioned


@dataclass
class Incumbent:
    value: float
    bounds: tuple[int, ...]
    stages: tuple


def node_orders(instance, cand, placement: str) -> list[list[int]]:
    """Node orders whose rank-order placement seeds the search: AMP's rank order and,
    under free placement, the nodes fastest first and slowest first."""
    orders = [list(range(len(instance.nodes)))]
    if placement == "free":
        from ..profiles import layer_times

        speed = [float(layer_times(instance, n.device_type, n.intra_bandwidth, cand.tp, cand.micro_batch).seconds.sum())
                 for n in instance.nodes]
        fast_first = sorted(range(len(speed)), key=lambda j: (speed[j], j))
        orders += [fast_first, fast_first[::-1]]
    return [o for i, o in enumerate(orders) if o not in orders[:i]]


def stages_in_order(instance, cand, order: list[int]):
    """Rank-order placement over the devices of the nodes taken in ``order``."""
    devices = [dev for j in order for dev in range(instance.node_first_device[j],
                                                   instance.node_first_device[j] + instance.nodes[j].devices)]
    return tuple(tuple(tuple(devices[r] for r in group) for group in stage)
                 for stage in rank_order_stages(cand.tp, cand.dp, cand.pp))


def heuristic(instance, cand, cost_model: str, placement: str) -> Incumbent | None:
    """The best partition (stage DP) over a few fixed placements (``node_orders``)."""
    best = None
    for order in node_orders(instance, cand, placement):
        stages = stages_in_order(instance, cand, order)
        costs = StageCosts(instance, cost_model, cand.tp, cand.dp, cand.pp, cand.micro_batch, stages)
        found = good_path(fixed_placement_graph(costs, instance.num_layers))
        if found and (best is None or found[0] < best.value):
            best = Incumbent(found[0], found[1].bounds, stages)
    return best


def solve_mip(instance, solver: str, cost_model: str, placement: str, top_k: int = 1,
              time_limit: float | None = None, seed: int = 0, workers: int = 1, progress=None,
              gap: float = 0.0) -> SolveResult:
    """Solve every promising candidate's program with CP-SAT or CBC; exact unless stopped by time or gap."""
    from ..bounds import candidate_lower_bound
    from ..enumerate import _infeasible_reason, least_overfull_rank_order

    start = time.perf_counter()
    deadline = None if time_limit is None else start + time_limit
    cands = candidates(instance)
    if not cands:
        raise InfeasibleError(why_empty(instance))
    # Phase 1b (eq. B4, K6) pays for itself on large clusters; on a few nodes the programs alone
    # are exact in well under a second.
    kinds = cost_model == "hetero" and placement == "free" and len(instance.nodes) >= KIND_MIN_NODES
    lower = {c: candidate_lower_bound(instance, c, cost_model, labelled=not kinds) for c in cands}

    # Phase 1: incumbents from the DP, candidates in order of their lower bound.  Under free
    # grouping the kind bound (eq. B4) first gets a quick try at ruling the candidate out.
    incumbents: dict[Candidate, Incumbent] = {}
    searches: dict = {}
    best = np.inf
    for c in sorted(cands, key=lambda c: (lower[c], c)):
        if lower[c] >= best or _out_of_time(deadline):
            break
        if kinds and _kind_search(instance, c, best, searches) is not None:
            lower[c] = max(lower[c], _raise(searches[c], best, QUICK_SWEEPS, deadline))
            if lower[c] >= best:
                continue
        inc = heuristic(instance, c, cost_model, placement)
        if inc is not None:
            incumbents[c] = inc
            best = min(best, inc.value)

    if kinds:
        best = _refine_with_kinds(instance, incumbents, lower, best, deadline, searches, max(gap, SAME))

    # Phase 2: the programs, most promising first, each cut off at the k-th best value so far.
    order = sorted(cands, key=lambda c: (incumbents[c].value if c in incumbents else np.inf, lower[c], c))
    results: list[tuple[float, float, Candidate, Plan]] = []  # (evaluated, solver objective, candidate, plan)
    cand_bound: dict[Candidate, float] = {}
    sizes = {"variables": 0, "constraints": 0, "programs": 0}
    closed = True

    def kth_best():
        values = sorted([r[0] for r in results] + [incumbents[x].value for x in incumbents if x not in cand_bound])
        return values[top_k - 1] if len(values) >= top_k else np.inf

    def keep_incumbent(c):
        """Record a candidate's DP plan as a result (its value is the evaluator's terms)."""
        inc = incumbents[c]
        results.append((inc.value, inc.value, c, Plan(c.tp, c.dp, c.pp, c.micro_batch, inc.bounds, inc.stages)))

    for i, c in enumerate(order):
        kth = kth_best()
        if lower[c] >= kth * (1 - max(gap, SAME)):
            # Nothing of this candidate beats the k-th best; its own warm start may be that plan.
            if c in incumbents:
                keep_incumbent(c)
            cand_bound[c] = lower[c]
            continue
        if _out_of_time(deadline):
            closed = False
            cand_bound[c] = lower[c]
            continue
        form = build(instance, c, cost_model, placement, rank_order_stages(c.tp, c.dp, c.pp))
        inc = incumbents.get(c)
        if inc is not None:
            form.hint_from(inc.bounds, inc.stages)
        scale = inc.value if inc is not None else lower[c]
        delta = resolution_for(scale, form.model)
        tol = form.terms * delta + 1e-9 * scale
        cutoff = kth * (1 + 1e-9) + tol if np.isfinite(kth) else None
        remaining = None
        if deadline is not None:
            # Share what is left among the candidates still open; the first ones get a bit more.
            still_open = sum(1 for x in order[i:] if lower[x] < kth)
            left = max(0.05, deadline - time.perf_counter())
            remaining = min(left, max(0.05, 1.5 * left / max(1, still_open)))
        if solver == "cpsat":
            out = solve_cpsat(form.model, delta, remaining, seed, workers, cutoff, gap)
        else:
            out = solve_cbc(form.model, remaining, seed, workers, cutoff, gap, scale)
        sizes["programs"] += 1
        sizes["variables"] = max(sizes["variables"], form.model.size["variables"])
        sizes["constraints"] = max(sizes["constraints"], form.model.size["constraints"])
        found = np.inf
        if out.values is not None:
            bounds, stages = form.decode(out.values)
            plan = Plan(c.tp, c.dp, c.pp, c.micro_batch, bounds, stages)
            ev = evaluate(instance, plan, cost_model)
            if ev.feasible:
                found = ev.predicted_time
                # A solution stopped short of optimality may leave slack (a class marked in use that
                # is not); re-scoring tightens it, so the program's value of this plan is the score.
                results.append((found, min(out.objective, found), c, plan))
        if inc is not None and inc.value < found:
            keep_incumbent(c)  # the program stopped without beating its warm start
        contradicted = out.status == "OPTIMAL" and inc is not None and inc.value < out.objective - tol
        if contradicted:
            # A known plan beats the claimed optimum: do not trust the proof (numerics).
            closed = False
            cand_bound[c] = lower[c]
        elif out.status == "OPTIMAL":
            cand_bound[c] = out.objective
        elif out.status == "INFEASIBLE":
            cand_bound[c] = cutoff if cutoff is not None else np.inf
        else:
            closed = False
            cand_bound[c] = max(lower[c], out.bound if out.bound is not None else -np.inf)
        if progress is not None:
            progress(i + 1, len(order))

    if not results:
        if not closed:
            raise InfeasibleError(f"no feasible plan found within the time limit of {time_limit} s")
        example = " rank-order plan (free grouping was searched too)" if placement == "free" else ""
        raise InfeasibleError(_infeasible_reason(instance, cost_model, least_overfull_rank_order(instance, cost_model),
                                                 example))

    results.sort(key=lambda r: (r[0], r[2]))
    top = results[:top_k]
    evaluations = tuple(evaluate(instance, plan, cost_model) for _, _, _, plan in top)
    objective = top[0][1]
    bound = min([objective] + [v for v in cand_bound.values()])
    stats = SolverStats(
        name=solver,
        # Every candidate's bound is proven (solved, cut off, or bounded), so a bound that meets
        # the objective proves it optimal even when some program stopped at the time limit.
        status="OPTIMAL" if bound >= objective * (1 - SAME) else "FEASIBLE",
        wall_time=time.perf_counter() - start,
        objective=objective,
        bound=min(bound, objective),
        extra={"placement": placement, "candidates": len(cands), **sizes,
               **({"time_resolution_relative": 1e-8} if solver == "cpsat" else {})},
    )
    return SolveResult(evaluations[0], evaluations, stats)


def _kind_search(instance, c, best, searches):
    """The candidate's kind search (eq. B4), started at target ``best`` on first use; None when
    the candidate has too many node classes for it."""
    from ..lagrange import KindSearch, kind_model

    if c not in searches:
        model = kind_model(instance, c)
        searches[c] = None if model is None else KindSearch(model, min(best, model.ceiling))
    return searches[c]


def _raise(search, best, sweeps, deadline) -> float:
    """The candidate's kind bound raised towards ``best``, or infinity once it reaches the cost
    no plan of the candidate exceeds (``KindModel.ceiling``): then it has no plan at all."""
    ceiling = search.model.ceiling
    value = search.raise_to(min(best, ceiling), sweeps, deadline)
    return np.inf if value >= ceiling else value


def _refine_with_kinds(instance, incumbents, lower, best, deadline, searches, gap) -> float:
    """Phase 1b (``formulations/mip.md``, eq. B4 and K6), for free grouping under hetero.

    In rounds: every candidate whose lower bound is more than ``gap`` below the best plan
    gets more of the Lagrangian kind bound (infinite once it proves the candidate has no
    plan); then the candidates with the lowest bounds get plans built from their relaxed
    paths (kinds repaired to fit the supply), and their incumbents re-ordered and
    re-partitioned keeping their kinds, at the thresholds where the bound is weakest.
    Spends at most three quarters of the time left; KIND_ROUNDS rounds, and under a time
    limit more while they pay.
    """
    from ..lagrange import POLISH_RATE, POLISH_WORK, construct, polish

    stop = None if deadline is None else time.perf_counter() + KIND_SHARE * (deadline - time.perf_counter())
    tried: set = set()
    for round_ in itertools.count():
        # Open: candidates whose bound leaves more than the requested gap below the best plan.
        open_ = [c for c in sorted(lower, key=lambda c: (lower[c], c)) if lower[c] < best * (1 - gap)]
        before = (best, min([lower[c] for c in open_], default=np.inf))
        for c in open_:
            if _out_of_time(stop) or lower[c] >= best or _kind_search(instance, c, best, searches) is None:
                continue
            lower[c] = max(lower[c], _raise(searches[c], best, KIND_SWEEPS, stop))
        # Plans where the bounds leave the most room: the likeliest to hold better ones.
        for c in [c for c in sorted(lower, key=lambda c: (lower[c], c)) if searches.get(c) is not None][:POLISHED]:
            if lower[c] >= best or _out_of_time(stop):
                continue
            model, cells = searches[c].model, searches[c].promising(POLISH_CELLS)
            work = POLISH_WORK if stop is None else POLISH_RATE * 0.25 * max(0.0, stop - time.perf_counter())
            seconds = 5.0 if stop is None else 0.1 * max(0.0, stop - time.perf_counter())
            found = [construct(model, [x for x in cells if (c, x.path) not in tried], work / 2, seconds)]
            tried.update((c, x.path) for x in cells)
            inc = incumbents.get(c)
            if inc is not None:
                ev = evaluate(instance, Plan(c.tp, c.dp, c.pp, c.micro_batch, inc.bounds, inc.stages))
                pairs = [(max(s.compute for s in ev.stages), max(s.allreduce for s in ev.stages))]
                pairs += [(x.T_hi, x.U_hi) for x in cells]
                pairs = [x for x in dict.fromkeys(pairs) if (c, inc.bounds, x) not in tried]
                tried.update((c, inc.bounds, x) for x in pairs)
                found.append(polish(model, inc.stages, pairs, work / 2))
            for f in found:
                if f is not None and (c not in incumbents or f[0] < incumbents[c].value):
                    incumbents[c] = Incumbent(f[0], f[1], f[2])
                    best = min(best, f[0])
        if not open_ or _out_of_time(stop):
            break
        # After KIND_ROUNDS, more rounds only under a time limit and only while they pay: the
        # best plan or the weakest open bound moved by more than KIND_PROGRESS of the best.
        weakest = min([lower[c] for c in open_ if lower[c] < best], default=np.inf)
        moved = before[0] - best > KIND_PROGRESS * best or weakest - before[1] > KIND_PROGRESS * best
        if round_ + 1 >= KIND_ROUNDS and (stop is None or not moved):
            break
    return best


def _out_of_time(deadline) -> bool:
    return deadline is not None and time.perf_counter() >= deadline
