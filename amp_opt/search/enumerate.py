"""The exhaustive enumerator: every candidate, every placement, the exact partition.

For each (tp, dp, pp, micro-batch) candidate the exact stage DP of
:mod:`amp_opt.search.partition` finds the best layer split, on AMP's rank order or
jointly with the free grouping of :mod:`amp_opt.search.free_grouping`.  Candidates are
visited in order of a lower bound and skipped once the bound cannot beat the
k-th best plan, which keeps the search exact.  Ground truth for the MIPs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from ..errors import InfeasibleError, NoPlanFound
from ..model.candidates import candidates, why_empty
from .diagnose import least_overfull, verdict
from .free_grouping import Stopped, candidate_graph
from .kbest import k_best_paths
from .partition import optimal_path
from .result import Incumbent, NoPlanBelow, SolverStats, SolveResult


@dataclass
class _Walk:
    """Where the walk over the candidates stands."""

    found: list = field(default_factory=list)  # the best plans so far (Incumbent), best first, at most top_k
    explored: int = 0
    pruned: int = 0
    tightest: object = None  # the least overfull plan, to explain infeasibility
    timed_out: bool = False
    remaining_lb: float = np.inf  # a bound on the candidates not solved when the walk stopped

    def kth(self, opts) -> float:
        """What a plan must beat to be listed: the K-th best so far, or the caller's cutoff."""
        return self.found[opts.top_k - 1].value if len(self.found) >= opts.top_k else opts.cutoff


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
    walk = _Walk()
    for i, cand in enumerate(order):
        if lower[cand] >= walk.kth(opts):
            walk.pruned += len(order) - i
            break
        if _visit(search, walk, cand, [lower[c] for c in order[i:]]):
            break
        # Explored candidates are solved exactly; the others are bounded by the next one's bound.
        best_value = walk.found[0].value if walk.found else np.inf
        dual = min(best_value, lower[order[i + 1]] if i + 1 < len(order) else np.inf)
        search.trace.update(best_value if walk.found else None, dual if np.isfinite(dual) else None)
        if opts.progress is not None:
            opts.progress(i + 1, len(order))
        if walk.timed_out:
            break
    return _result(search, walk, len(cands))


def _visit(search, walk: _Walk, cand, lower_left: list[float]) -> bool:
    """Solve one candidate below the K-th best plan so far; True when the walk must stop before
    it (time is up).  ``lower_left``: the bounds of this candidate and those after it."""
    opts = search.options
    if search.out_of_time():
        walk.timed_out, walk.remaining_lb = True, min(lower_left)
        return True
    kth = walk.kth(opts)
    if search.lower_bound(cand, labelled=not search.out_of_time()) >= kth:
        walk.pruned += 1
        return False
    walk.explored += 1
    try:
        graph, to_plan = candidate_graph(search.tables, cand, search.model, opts.placement, search.chunks(cand),
                                         stop=search.out_of_time)
    except Stopped:
        walk.timed_out, walk.remaining_lb = True, min(lower_left)
        return True
    first = best_plans(graph, to_plan, cand, walk.found, top_k=opts.top_k, one=opts.per_candidate, cutoff=kth,
                       stop=search.out_of_time, instance=search.instance)
    if search.out_of_time():  # the DP may have stopped early: this candidate is not proven
        walk.timed_out, walk.remaining_lb = True, min(lower_left)
    if first is None and not walk.found and not walk.timed_out:
        walk.tightest = least_overfull(graph, to_plan, walk.tightest)
    return False


def _result(search, walk: _Walk, count: int) -> SolveResult:
    """The plans found, re-scored by the evaluator, with the bound the walk proved; raises when
    there is none (time ran out, nothing beats the cutoff, or nothing fits)."""
    opts = search.options
    if not walk.found:
        if walk.timed_out:
            raise NoPlanFound(search.stopped_why())
        if np.isfinite(opts.cutoff):  # nothing beats the plan the caller has (or nothing fits at all)
            raise NoPlanBelow(opts.cutoff)
        raise InfeasibleError(verdict(search, walk.tightest))
    evaluations = tuple(search.evaluate(f.plan) for f in walk.found)
    objective = walk.found[0].value
    bound = min(objective, walk.remaining_lb)
    search.trace.update(objective, bound)
    stats = SolverStats(
        name="enumerate",
        status="FEASIBLE" if walk.timed_out else "OPTIMAL",
        wall_time=search.elapsed(),
        objective=objective,
        bound=bound,
        extra={"placement": opts.placement, "candidates": count, "candidates_explored": walk.explored,
               "candidates_pruned": walk.pruned, **({"stopped": search.stopped_why()} if walk.timed_out else {})},
        trace=search.trace.as_tuple(),
    )
    return SolveResult(evaluations[0], evaluations, stats)


def best_plans(graph, to_plan, cand, found: list, *, top_k: int, cutoff: float, stop, instance,
               one: bool = False) -> float | None:
    """Add the candidate's best plan below ``cutoff`` to ``found`` (kept sorted, distinct, at most
    ``top_k`` long); with ``top_k`` K > 1 (and not ``one``: one plan per candidate) its K best
    distinct plans (:mod:`.kbest`), each below the K-th best of ``found`` and ``cutoff``.  Returns
    the value of its best path (with K > 1: of its best path below the cutoff), None when it has
    none: the candidate's exact bound."""
    if top_k == 1 or one:
        best = optimal_path(graph, cutoff=cutoff, stop=stop)
        if best is None or best[0] >= cutoff:
            return None if best is None else best[0]
        found.append(Incumbent.of_plan(best[0], cand, to_plan(best[1])))
        found.sort(key=Incumbent.key)
        del found[top_k:]
        return best[0]

    def kth() -> float:
        return min(found[top_k - 1].value, cutoff) if len(found) >= top_k else cutoff

    seen = {plan_key(instance, f.plan) for f in found}
    first = None
    for value, path in k_best_paths(graph, limit=kth, stop=stop):
        first = value if first is None else first
        plan = to_plan(path)
        key = plan_key(instance, plan)
        # One plan, several paths (formulations/exactness.md, "The k best plans"): a per-stage
        # candidate's path in a slower mode than fits gives the faster path's plan (plan_of), a
        # block count covering every range plain full recomputation's; the first came first.
        if key in seen:
            continue
        seen.add(key)
        found.append(Incumbent.of_plan(value, cand, plan))
        found.sort(key=Incumbent.key)
        del found[top_k:]
    return first


def plan_key(instance, plan) -> str:
    """One key per plan: a block count that covers every range of the partition is written as
    plain full recomputation (every recomputing layer recomputes either way)."""
    doc = plan.to_json()
    r = doc.pop("recompute_layers", None)
    boundaries = doc["partition"]
    if r is not None and any(sum(bool(x.recomputes) for x in instance.layers[k:l]) > r for k, l in zip(boundaries, boundaries[1:])):
        doc["recompute_layers"] = r
    return json.dumps(doc, sort_keys=True)
