"""The exhaustive enumerator: every candidate, every placement, the exact partition.

For each (tp, dp, pp, micro-batch) candidate the exact stage DP of
:mod:`amp_opt.partition` finds the best layer split, on AMP's rank order or
jointly with the free grouping of :mod:`amp_opt.grouping`.  Candidates are
visited in order of a lower bound and skipped once the bound cannot beat the
k-th best plan, which keeps the search exact.  Ground truth for the MIPs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .candidates import Candidate, candidates, why_empty
from .cost import StageCosts, evaluate
from .errors import InfeasibleError
from .partition import Path, StageGraph, fixed_placement_graph, min_max_path, optimal_path
from .plan import Plan, rank_order_stages
from .bounds import candidate_lower_bound
from .result import SolverStats, SolveResult


@dataclass(frozen=True)
class Found:
    value: float
    candidate: Candidate
    stages: tuple
    bounds: tuple[int, ...]

    def key(self):
        return (self.value, self.candidate, self.bounds, self.stages)


def candidate_graph(instance, cand: Candidate, cost_model: str, placement: str):
    """The stage graph of a candidate and a function from a path to device stages."""
    if placement == "rank-order":
        stages = rank_order_stages(cand.tp, cand.dp, cand.pp)
        costs = StageCosts(instance, cost_model, cand.tp, cand.dp, cand.pp, cand.micro_batch, stages)
        return fixed_placement_graph(costs, instance.num_layers), lambda path: stages
    from .grouping import free_graph, stages_of_path

    fg = free_graph(instance, cand)
    return fg.graph, lambda path: stages_of_path(instance, cand, fg, path.transitions)


def solve_enumerate(instance, cost_model: str, placement: str, top_k: int = 1, time_limit: float | None = None,
                    progress=None) -> SolveResult:
    """Search every candidate exactly; return the best plans re-scored by the evaluator."""
    start = time.perf_counter()
    cands = candidates(instance)
    if not cands:
        raise InfeasibleError(why_empty(instance))
    lower = {c: candidate_lower_bound(instance, c, cost_model) for c in cands}
    order = sorted(cands, key=lambda c: (lower[c], c))
    found: list[Found] = []
    explored = pruned = 0
    tightest = None  # (memory over capacity, candidate, stages, path) of the least overfull plan
    timed_out, remaining_lb = False, np.inf
    for i, cand in enumerate(order):
        kth = found[top_k - 1].value if len(found) >= top_k else np.inf
        if lower[cand] >= kth:
            pruned = len(order) - i
            break
        if time_limit is not None and time.perf_counter() - start > time_limit:
            timed_out, remaining_lb = True, min(lower[c] for c in order[i:])
            break
        explored += 1
        graph, to_stages = candidate_graph(instance, cand, cost_model, placement)
        best = optimal_path(graph)
        if best is None:
            if not found:
                tightest = _least_overfull(graph, cand, to_stages, tightest)
        else:
            found.append(Found(best[0], cand, to_stages(best[1]), best[1].bounds))
            found.sort(key=Found.key)
            del found[top_k:]
        if progress is not None:
            progress(i + 1, len(order))
    if not found:
        if timed_out:
            raise InfeasibleError(f"no feasible plan found within the time limit of {time_limit} s")
        raise InfeasibleError(_infeasible_reason(instance, cost_model, tightest or least_overfull_rank_order(instance, cost_model)))

    evaluations = [
        evaluate(instance, Plan(f.candidate.tp, f.candidate.dp, f.candidate.pp, f.candidate.micro_batch, f.bounds,
                                f.stages), cost_model)
        for f in found
    ]
    objective = found[0].value
    stats = SolverStats(
        name="enumerate",
        status="FEASIBLE" if timed_out else "OPTIMAL",
        wall_time=time.perf_counter() - start,
        objective=objective,
        bound=min(objective, remaining_lb),
        extra={"placement": placement, "candidates": len(cands), "candidates_explored": explored,
               "candidates_pruned": pruned},
    )
    return SolveResult(evaluations[0], tuple(evaluations), stats)


def least_overfull_rank_order(instance, cost_model: str):
    """The least overfull plan over every candidate in AMP's rank order (to explain infeasibility)."""
    tightest = None
    for cand in candidates(instance):
        graph, to_stages = candidate_graph(instance, cand, cost_model, "rank-order")
        tightest = _least_overfull(graph, cand, to_stages, tightest)
    return tightest


def _least_overfull(graph: StageGraph, cand, to_stages, tightest):
    value, path = min_max_path(graph, graph.memory_ratio, np.broadcast_to(graph.structural, graph.feasible.shape))
    if path is not None and (tightest is None or value < tightest[0]):
        return (value, cand, to_stages(path), path)
    return tightest


def _infeasible_reason(instance, cost_model: str, tightest, example: str = "") -> str:
    """Why no plan exists, shown on the least overfull plan known (``example`` says which kind
    of plan that is when it is not from the placement searched)."""
    if tightest is None:
        return f"no candidate has a valid layer partition ({instance.num_layers} layers)"
    if tightest[0] <= 1.0:
        return "no plan fits the constraints"
    _, cand, stages, path = tightest
    plan = Plan(cand.tp, cand.dp, cand.pp, cand.micro_batch, path.bounds, stages)
    ev = evaluate(instance, plan, cost_model)
    worst = max(ev.stages, key=lambda r: r.memory / r.capacity)
    return (
        f"no plan fits in device memory. The tightest{example} is tp={cand.tp} dp={cand.dp} pp={cand.pp} "
        f"micro_batch={cand.micro_batch} with partition {list(path.bounds)}: stage {worst.index} "
        f"({', '.join(worst.device_types)}, layers {worst.layers[0]}-{worst.layers[1] - 1}) needs "
        f"{worst.memory / 2**30:.2f} GiB per device, over its capacity of {worst.capacity / 2**30:.2f} GiB "
        f"by {(worst.memory - worst.capacity) / 2**30:.2f} GiB"
    )


__all__ = ["solve_enumerate", "candidate_lower_bound", "candidate_graph", "Path"]
