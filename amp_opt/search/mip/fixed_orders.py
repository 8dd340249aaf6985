"""Phase 1 of the MIP driver: a fast incumbent per candidate from the exact stage DP on a few
fixed node orders (AMP's rank order and, under free placement, the nodes fastest first and
slowest first; ``formulations/mip.md``)."""

from __future__ import annotations

from ...model.costs.terms import stage_order
from ...model.plan import Candidate, rank_order_stages
from ..partition import fixed_placement_graph, good_path
from ..result import Incumbent


def node_orders(search, cand: Candidate) -> list[list[int]]:
    """Node orders whose rank-order placement seeds the search: AMP's rank order and,
    under free placement, the nodes fastest first and slowest first."""
    instance = search.instance
    orders = [list(range(len(instance.nodes)))]
    if search.options.placement == "free":  # speeds as the model prices them (its candidate_terms)
        terms = search.model.candidate_terms(search.tables, cand, chunks=search.chunks(cand))
        speed = [float(terms.layer_seconds(n.device_type, n.intra_bandwidth, "none", n.intra_latency).sum())
                 for n in instance.nodes]
        fast_first = sorted(range(len(speed)), key=lambda j: (speed[j], j))
        orders += [fast_first, fast_first[::-1]]
    return [o for i, o in enumerate(orders) if o not in orders[:i]]


def stages_in_order(instance, cand: Candidate, order: list[int]):
    """Rank-order placement over the devices of the nodes taken in ``order``."""
    devices = [dev for j in order for dev in range(instance.node_first_device[j],
                                                   instance.node_first_device[j] + instance.nodes[j].devices)]
    return tuple(tuple(tuple(devices[r] for r in group) for group in stage)
                 for stage in rank_order_stages(cand.tp, cand.dp, cand.pp, cand.cp))


def heuristic(search, cand: Candidate) -> Incumbent | None:
    """The best partition (stage DP) over a few fixed placements (``node_orders``); once out of
    time, what the orders tried so far gave."""
    best = None
    chunks = search.chunks(cand)
    fixed = None if chunks is None else stage_order(chunks, cand.pp)[1]
    for i, order in enumerate(node_orders(search, cand)):
        if i > 0 and search.out_of_time():
            break
        stages = stages_in_order(search.instance, cand, order)
        costs = search.stage_costs(cand, stages)
        found = good_path(fixed_placement_graph(costs, search.instance.num_layers, fixed))
        if found and (best is None or found[0] < best.value):
            plan = cand.plan(search.partition(cand, found[1].boundaries), stages, modes=costs.modes_of(found[1].boundaries))
            best = Incumbent.of_plan(found[0], cand, plan)
    return best
