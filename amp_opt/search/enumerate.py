"""The exhaustive enumerator: every candidate, every placement, the exact partition.

For each (tp, dp, pp, micro-batch) candidate the exact stage DP of
:mod:`amp_opt.search.partition` finds the best layer split, on AMP's rank order or
jointly with the free grouping of :mod:`amp_opt.search.grouping`.  Candidates are
visited in order of a lower bound and skipped once the bound cannot beat the
k-th best plan, which keeps the search exact.  Ground truth for the MIPs.
"""

from __future__ import annotations

import json

import numpy as np

from ..errors import InfeasibleError, NoPlanFound
from ..model.candidates import candidates, why_empty
from .diagnose import least_overfull, verdict
from .grouping import Stopped, candidate_graph
from .kbest import k_best_paths
from .partition import optimal_path
from .result import Incumbent, NoPlanBelow, SolverStats, SolveResult


def solve_enumerate(search) -> SolveResult:
    """Search every candidate exactly; return the best plans re-scored by the evaluator."""
    instance, opts = search.instance, search.options
    cands = candidates(instance, search.model)
    if not cands:
        raise InfeasibleError(why_empty(instance))
    # Candidates in order of a cheap bound; the tighter one (B2) only for those the cheap one
    # cannot rule out.
    lower = {c: search.lower_bound(c, labelled=False) for c in cands}
    order = sorted(cands, key=lambda c: (lower[c], c))
    found: list[Incumbent] = []
    explored = pruned = 0
    tightest = None  # the least overfull plan, to explain infeasibility
    timed_out, remaining_lb = False, np.inf
    for i, cand in enumerate(order):
        kth = found[opts.top_k - 1].value if len(found) >= opts.top_k else opts.cutoff
        if lower[cand] >= kth:
            pruned += len(order) - i
            break
        if search.out_of_time():
            timed_out, remaining_lb = True, min(lower[c] for c in order[i:])
            break
        if search.lower_bound(cand, labelled=not search.out_of_time()) >= kth:
            pruned += 1
            continue
        explored += 1
        try:
            graph, to_plan = candidate_graph(search.tables, cand, search.model, opts.placement, search.chunks(cand),
                                             stop=search.out_of_time)
        except Stopped:
            timed_out, remaining_lb = True, min(lower[c] for c in order[i:])
            break
        best = _best_plans(graph, to_plan, cand, found, opts, kth, search.out_of_time, instance)
        if search.out_of_time():  # the DP may have stopped early: this candidate is not proven
            timed_out, remaining_lb = True, min(lower[c] for c in order[i:])
        if not best and not found and not timed_out:
            tightest = least_overfull(graph, to_plan, tightest)
        # Explored candidates are solved exactly; the others are bounded by the next one's bound.
        best_value = found[0].value if found else np.inf
        dual = min(best_value, lower[order[i + 1]] if i + 1 < len(order) else np.inf)
        search.trace.update(best_value if found else None, dual if np.isfinite(dual) else None)
        if opts.progress is not None:
            opts.progress(i + 1, len(order))
        if timed_out:
            break
    if not found:
        if timed_out:
            raise NoPlanFound(search.stopped_why())
        if np.isfinite(opts.cutoff):  # nothing beats the plan the caller has (or nothing fits at all)
            raise NoPlanBelow(opts.cutoff)
        raise InfeasibleError(verdict(search, tightest))

    evaluations = tuple(search.evaluate(f.plan) for f in found)
    objective = found[0].value
    search.trace.update(objective, min(objective, remaining_lb))
    stats = SolverStats(
        name="enumerate",
        status="FEASIBLE" if timed_out else "OPTIMAL",
        wall_time=search.elapsed(),
        objective=objective,
        bound=min(objective, remaining_lb),
        extra={"placement": opts.placement, "candidates": len(cands), "candidates_explored": explored,
               "candidates_pruned": pruned, **({"stopped": search.stopped_why()} if timed_out else {})},
        trace=search.trace.as_tuple(),
    )
    return SolveResult(evaluations[0], evaluations, stats)


def _best_plans(graph, to_plan, cand, found: list, opts, cutoff: float, stop, instance) -> bool:
    """Add the candidate's best plan below ``cutoff`` to ``found`` (kept sorted, at most top_k
    long); with ``top_k`` K > 1 its K best distinct plans (:mod:`.kbest`).  Whether it has a
    plan (with K > 1: one below the cutoff)."""
    if opts.top_k == 1 or opts.per_candidate:
        best = optimal_path(graph, cutoff=cutoff, stop=stop)
        if best is None or best[0] >= cutoff:
            return best is not None
        found.append(Incumbent.of_plan(best[0], cand, to_plan(best[1])))
        found.sort(key=Incumbent.key)
        del found[opts.top_k:]
        return True

    def kth() -> float:
        return found[opts.top_k - 1].value if len(found) >= opts.top_k else cutoff

    seen = {_plan_key(instance, f.plan) for f in found}
    any_path = False
    for value, path in k_best_paths(graph, limit=kth, stop=stop):
        any_path = True
        plan = to_plan(path)
        key = _plan_key(instance, plan)
        # One plan, several paths (formulations/exactness.md, "The k best plans"): a per-stage
        # candidate's path in a slower mode than fits gives the faster path's plan (plan_of), a
        # block count covering every range plain full recomputation's; the first came first.
        if key in seen:
            continue
        seen.add(key)
        found.append(Incumbent.of_plan(value, cand, plan))
        found.sort(key=Incumbent.key)
        del found[opts.top_k:]
    return any_path


def _plan_key(instance, plan) -> str:
    """One key per plan: a block count that covers every range of the partition is written as
    plain full recomputation (every recomputing layer recomputes either way)."""
    doc = plan.to_json()
    r = doc.pop("recompute_layers", None)
    bounds = doc["partition"]
    if r is not None and any(sum(bool(x.recomputes) for x in instance.layers[k:l]) > r for k, l in zip(bounds, bounds[1:])):
        doc["recompute_layers"] = r
    return json.dumps(doc, sort_keys=True)
