"""The end of an iteration of several pipelines (``formulations/hetero.md`` U6).

The pipelines' partitions cut the layers into segments (the union of their boundaries); the
gradients of a segment are reduced by one ring over every replica, in every pipeline, of the
stage that holds the segment, once all of them have produced them (during their last backward
pass where the engine overlaps the reduction, H18; else after it).  A stage runs the rings of
its segments one after another and then its optimizer step; the iteration ends with the
slowest stage's end.  Each pipeline's own terms (compute, boundaries, memory, the optimizer step) come from
the cost model's stage terms as for one pipeline.
"""

from __future__ import annotations

from .link_rules import link_latency, ring_link


def segments(partitions) -> list[tuple[int, int, list[tuple[int, int]]]]:
    """Per segment [a, b) of the pipelines' joint partition, the (pipeline, stage) pairs holding it;
    ``partitions[i]``: pipeline i's layer boundaries.

    Examples
    --------
    >>> segments([(0, 2, 4), (0, 4)])
    [(0, 2, [(0, 0), (1, 0)]), (2, 4, [(0, 1), (1, 0)])]
    """
    cuts = sorted({b for p in partitions for b in p})
    out = []
    for a, b in zip(cuts, cuts[1:]):
        holders = [(i, next(s for s in range(len(p) - 1) if p[s] <= a < p[s + 1])) for i, p in enumerate(partitions)]
        out.append((a, b, holders))
    return out


def segment_reduction(instance, tables, plan, a: int, b: int, holders) -> float:
    """U6: seconds of the ring reducing segment [a, b)'s gradients over its R holders' replicas,
    2 (R-1)/R of the largest shard's gradient bytes (the least tp among the holders) over the
    slowest link the ring crosses, each NIC shared by the largest tp's rings (H4, H17), plus
    2 (R-1) messages at that link's latency (H19); 0 for one replica."""
    R = sum(plan.pipelines[i].dp_at(s) for i, s in holders)
    if R == 1:
        return 0.0
    tps = [plan.pipelines[i].tp_at(s) for i, s in holders]
    node_of = instance.device_node
    nodes = sorted({int(node_of[d]) for i, s in holders for group in plan.pipelines[i].stages[s] for d in group})
    params = float(tables.layer_sums(min(tps)).params_in(a, b))
    moved = 2 * (R - 1) / R * params * instance.training.allreduce_bytes_per_param
    return moved / ring_link(instance, nodes, max(tps)) + 2 * (R - 1) * link_latency(instance, nodes)


def stage_ends(instance, tables, plan, bodies, windows, steps) -> tuple[tuple[float, ...], ...]:
    """U6: per pipeline i and stage s, the second its end of iteration finishes, counted from the
    iteration's start.  ``bodies[i]``: pipeline i's time to the end of its last backward pass (H13
    without its end); ``windows[i][s]``: the seconds of stage (i, s)'s last backward pass a reduction
    may hide in (H18; 0 where the engine does not overlap); ``steps[i][s]``: its optimizer step (H15).
    A segment's ring starts once every holder has produced its gradients, at the latest
    B_i - W_{i,s} over its holders; a stage runs its segments' rings one after another from the
    latest of their starts, then, once its own backward pass is done, its step."""
    ready = [[0.0] * len(row) for row in steps]
    rings = [[0.0] * len(row) for row in steps]
    for a, b, holders in segments([p.partition for p in plan.pipelines]):
        start = max(bodies[i] - windows[i][s] for i, s in holders)
        seconds = segment_reduction(instance, tables, plan, a, b, holders)
        for i, s in holders:
            ready[i][s] = max(ready[i][s], start)
            rings[i][s] += seconds
    return tuple(tuple(max(bodies[i], ready[i][s] + rings[i][s]) + steps[i][s] for s in range(len(steps[i])))
                 for i in range(len(steps)))
