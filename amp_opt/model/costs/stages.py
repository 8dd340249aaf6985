"""Pricing plans whose stages and replicas differ (``formulations/hetero.md``, "Stages and
replicas that differ"): per-stage tp and dp, replicas on different GPU types, uneven shares.

No new per-layer arithmetic lives here: every replica of stage s is priced as one group of
the uniform candidate (tp_s, dp_s, micro-batch = its share) in a pipeline of M samples per
micro-batch (:meth:`~amp_opt.model.plan.Plan.stage_candidate`), through the cost model's own
:class:`~amp_opt.model.costs.StageCosts`, and the terms are combined:

- U1 compute: E_s = max over replicas r of the replica's time at its share (the slowest);
- U2 boundary: the largest bytes any one device of stage s or s+1 sends or receives (its
  replica's share of the boundary activation, at its stage's tp) over the slowest link of the
  two stages;
- U3 gradients: stage s's ring over its dp_s replicas of its 1/tp_s shards (H4);
- U4 memory: each device by its own replica's share (H5), against its own type's capacity.

A uniform plan priced here gives exactly the numbers of the uniform path (the tests hold it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import InputError
from .hetero import HeteroModel
from .iteration import pipeline_weights
from .link_rules import link_latency, ring_link, tp_link
from .stage_costs import StageCosts, StagePlacement


@dataclass(frozen=True)
class Replica:
    """One data-parallel replica of a stage: its share, its groups and the view that prices it."""

    share: int
    groups: tuple[tuple[int, ...], ...]  # its cp tensor-parallel groups
    view: StageCosts  # the uniform candidate (tp_s, dp_s, share) with this replica on every stage


class UnevenCosts:
    """The stage terms of a checked plan whose stages or replicas differ (the methods of
    :class:`~amp_opt.model.costs.StageCosts` the evaluator reads, per stage).

    Examples
    --------
    >>> import amp_opt
    >>> from amp_opt.model.tables import Tables
    >>> from amp_opt.model.plan import check_plan
    >>> from amp_opt.model.generate import generate_instance
    >>> doc = generate_instance(3, nodes=4, devices_per_node=1, device_types=2, layers=4, global_batch=8)
    >>> doc["search"]["engine"] = "amp_opt"
    >>> inst = amp_opt.parse_instance(doc)
    >>> plan = check_plan(inst, amp_opt.parse_plan({"tp": 1, "dp": [2, 1], "pp": 2, "shares": [[3, 1], [4]],
    ...                                             "partition": [0, 2, 4]}))
    >>> costs = UnevenCosts(amp_opt.model.costs.HETERO, Tables(inst), plan)
    >>> bool(costs.compute(0, 0, 2) == max(r.view.compute(0, 0, 2) for r in costs.replicas[0]))
    True
    """

    def __init__(self, model, tables, plan, *, cache: dict | None = None):
        if not isinstance(model, HeteroModel):
            raise InputError("plan", f"the {model.name} cost model prices uniform plans only (one tp and dp, equal "
                                     "shares): use --cost-model hetero")
        self.model, self.tables, self.plan, self.pp = model, tables, plan, plan.pp
        inst = tables.instance
        self.n_micro = inst.training.global_batch // plan.pipeline_micro_batch
        self.pipeline = pipeline_weights(self.n_micro, plan.pp, 1, model.schedule)
        # ``cache``: views shared between the plans of one search (a view depends only on its key)
        views: dict = {} if cache is None else cache
        self.replicas = tuple(tuple(self._replica(views, s, r) for r in range(plan.dp_at(s))) for s in range(plan.pp))
        # a stage's distinct replica views: the maxima below read each once (a class stage of a large
        # cluster has hundreds of replicas and one view)
        self.distinct = tuple(tuple({id(r.view): r.view for r in stage}.values()) for stage in self.replicas)
        self.stage_views = tuple(self._stage_view(views, s) for s in range(plan.pp))
        node_of = inst.device_node
        self.placement = tuple(
            StagePlacement(nodes=tuple(int(node_of[g[0]]) for g in stage),
                           device_types=tuple(sorted({inst.nodes[node_of[g[0]]].device_type for g in stage})))
            for stage in plan.stages)
        self.capacity = [min(inst.device_types[t].capacity for t in p.device_types) for p in self.placement]
        self.estimated = any(r.view.estimated for stage in self.replicas for r in stage)
        self.sums = tuple(v.sums for v in self.stage_views)

    def _replica(self, views: dict, s: int, r: int) -> Replica:
        """Replica r of stage s, its view shared with every replica of the same candidate and
        compute classes (device types and tp link, its bandwidth and latency)."""
        plan, inst = self.plan, self.tables.instance
        share, cp = plan.shares_at(s)[r], plan.cp
        groups = plan.stages[s][r * cp:(r + 1) * cp]
        cand = plan.stage_candidate(s, share)
        # The view prices the replica's compute by each group's device types and tp link (H2, H16,
        # H19) and the ring its cp groups share per micro-batch (H10): replicas alike in these
        # share it, whatever nodes they sit on.
        node_of = inst.device_node
        nodes = [tuple(sorted({int(node_of[d]) for d in group})) for group in groups]
        compute = tuple(sorted({(inst.nodes[j].device_type, tp_link(inst, n), link_latency(inst, n))
                                for n in nodes for j in n}))
        every = sorted({j for n in nodes for j in n})
        ring = (ring_link(inst, every, cand.tp), link_latency(inst, every))
        key = (self.model.name, "replica", cand, s, compute, ring)
        if key not in views:
            views[key] = self.model.stage_costs(self.tables, cand, (groups,) * plan.pp)
        return Replica(share, groups, views[key])

    def _stage_view(self, views: dict, s: int) -> StageCosts:
        """Stage s's view on its own devices and the next stage's: its ring (U3) and its boundary
        link (U2), which read only those two stages' nodes."""
        plan, node_of = self.plan, self.tables.instance.device_node
        nxt = min(s + 1, plan.pp - 1)
        cand = plan.stage_candidate(s)
        key = (self.model.name, "stage", cand, s, tuple(int(node_of[g[0]]) for g in plan.stages[s]),
               tuple(int(node_of[g[0]]) for g in plan.stages[nxt]))
        if key not in views:
            stages = tuple(plan.stages[nxt] if i == s + 1 else plan.stages[s] for i in range(plan.pp))
            views[key] = self.model.stage_costs(self.tables, cand, stages)
        return views[key]

    @staticmethod
    def forget_stage_views(cache: dict) -> None:
        """Drop the stage views from a search's ``cache``: a stage's view reads its own nodes and
        the next stage's, which other configurations rarely share (kept, they fill the memory);
        the replica views, shared widely, stay."""
        for key in [k for k in cache if k[1] == "stage"]:
            del cache[key]

    def replica_compute(self, s: int, k, l) -> list:
        """Each replica's seconds per micro-batch through layers [k, l) of stage s at its share."""
        return [r.view.compute(s, k, l) for r in self.replicas[s]]

    def compute(self, s: int, k, l):
        """U1: the slowest replica of stage s."""
        return np.max(np.array([v.compute(s, k, l) for v in self.distinct[s]]), axis=0)

    def p2p(self, s: int, l):
        """U2: seconds to reshard one pipeline micro-batch from stage s (ending before layer l) to s+1."""
        if s == self.pp - 1:
            return 0.0 * np.asarray(l)
        at = np.asarray(l) - 1
        sent = [v.p2p_volume()[at] for stage in (s, s + 1) for v in self.distinct[stage]]
        view = self.stage_views[s]
        return np.max(np.array(sent), axis=0) * view.p2p_factor(s) + view.p2p_latency(s)  # (one message's latency, H19)

    def allreduce(self, s: int, k, l):
        """U3: stage s's gradient ring over its dp_s replicas (H4)."""
        return self.stage_views[s].allreduce(s, k, l)

    def optimizer_step(self, s: int, k, l):
        """Stage s's optimizer step (H15), the part of :meth:`allreduce` after its reduction."""
        return self.stage_views[s].optimizer_step(s, k, l)

    @property
    def overlap_share(self) -> float:
        """H18's share of a stage's backward pass its reduction may hide in (0: not overlapped)."""
        return self.stage_views[0].overlap_share

    def overlap_window(self, s: int, k, l):
        """Stage s's seconds of last backward pass a reduction may hide in (H18), over its devices."""
        return self.stage_views[s].overlap_window(s, k, l)

    def replica_memory(self, s: int, k, l) -> list[tuple[float, float]]:
        """U4: per distinct replica view of stage s, (bytes per device, its devices' capacity)."""
        return [(v.memory(s, k, l), v.capacity[s]) for v in self.distinct[s]]

    def tightest(self, s: int, k: int, l: int) -> tuple[float, float]:
        """(bytes, capacity) of stage s's replica with the least room: what the stage report shows."""
        return max(((float(m), c) for m, c in self.replica_memory(s, k, l)), key=lambda mc: mc[0] - mc[1])

    def memory(self, s: int, k, l):
        return self.tightest(s, k, l)[0]

    def fits(self, s: int, k, l) -> bool:
        return all(m <= c for m, c in self.replica_memory(s, k, l))
