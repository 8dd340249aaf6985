"""Why no plan fits: the least overfull plan, and the sentence that names its fullest stage.

When a search proves that no plan fits in device memory, the user is told which plan
came closest and by how much its fullest stage overflows: a min-max DP over the
memory-over-capacity ratio of every stage (:func:`amp_opt.search.partition.min_max_path`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..model.candidates import candidates
from ..model.plan import Plan, describe
from .free_grouping import candidate_graph
from .partition import StageGraph, min_max_path


@dataclass(frozen=True)
class Overfull:
    """A plan's largest memory over capacity among its stages (1.0 = exactly full); ``partial``
    when the search for it stopped at the time limit (the tightest of the candidates examined)."""

    ratio: float
    plan: Plan
    partial: bool = False


def least_overfull(graph: StageGraph, to_plan, tightest: Overfull | None) -> Overfull | None:
    """The tighter of ``tightest`` and the least overfull plan of one candidate's graph."""
    ratio, path = min_max_path(graph, graph.memory_ratio, np.broadcast_to(graph.structural, graph.feasible.shape))
    if path is not None and (tightest is None or ratio < tightest.ratio):
        return Overfull(ratio, to_plan(path))
    return tightest


def least_overfull_rank_order(search) -> Overfull | None:
    """The least overfull plan over every candidate in AMP's rank order; once the search is out of
    time, over the candidates examined so far (until one has a plan: a time limit is kept to
    within a candidate's DP or so, and the message still has its example)."""
    tightest = None
    for cand in candidates(search.instance, search.model):
        if tightest is not None and search.out_of_time():
            return replace(tightest, partial=True)
        graph, to_plan = candidate_graph(search.tables, cand, search.model, "rank-order", search.chunks(cand))
        tightest = least_overfull(graph, to_plan, tightest)
    return tightest


def verdict(search, tightest: Overfull | None = None, example: str = "") -> str:
    """Why no plan exists, for the InfeasibleError: on ``tightest``, or with ``options.diagnose``
    on the least overfull rank-order plan searched for it; else in a few words (the idle-GPU
    driver's later subsets, whose messages are not shown, do not pay for that search)."""
    if tightest is None and not search.options.diagnose:
        return "no plan fits (not diagnosed)"
    return infeasible_reason(search, tightest or least_overfull_rank_order(search), example)


def infeasible_reason(search, tightest: Overfull | None, example: str = "") -> str:
    """Why no plan exists, shown on the least overfull plan known (``example`` says which kind
    of plan that is when it is not from the placement searched)."""
    if tightest is None:
        return f"no candidate has a valid layer partition ({search.instance.num_layers} layers)"
    if tightest.ratio <= 1.0:
        return "no plan fits the constraints"
    plan = tightest.plan
    ev = search.evaluate(plan)
    worst = max(ev.stages, key=lambda r: r.memory / r.capacity)
    gib = 2**30
    if tightest.partial:
        example += " among the candidates examined before the time limit"
    return (
        f"no plan fits in device memory. The tightest{example} is {describe(plan)} "
        f"with partition {list(plan.partition)}: stage {worst.index} "
        f"({', '.join(worst.device_types)}, layers {worst.layers[0]}-{worst.layers[1] - 1}) needs "
        f"{worst.memory / gib:.2f} GiB per device, over its capacity of {worst.capacity / gib:.2f} GiB "
        f"by {(worst.memory - worst.capacity) / gib:.2f} GiB"
    )
