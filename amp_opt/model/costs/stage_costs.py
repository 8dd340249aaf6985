"""The cost terms of one candidate on one placement (:class:`StageCosts`), as a cost model prices
them: per stage its compute classes' layer seconds, each boundary's and ring's factors, the
reduction and the optimizer step, vectorised over layer ranges, so that the evaluator, the
partition DP and the MIPs read their numbers from one place.  What does not depend on the devices
is :class:`~amp_opt.model.costs.terms.CandidateTerms`, which every record here reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import InputError
from .iteration import pipeline_weights
from ..plan import Stages
from .terms import CandidateTerms, prefix_sums


def priced_instance(terms: CandidateTerms, instance):
    """``terms.instance``, the instance as a model prices it, checked against the caller's
    ``instance``: the same nodes and devices, and nodes identical there identical in it (the
    searches tie identical nodes by the caller's node classes); InputError naming cost_model else."""
    priced = terms.instance
    if priced is instance:
        return priced
    same = [n.devices for n in priced.nodes] == [n.devices for n in instance.nodes]
    if not same or [c.nodes for c in priced.node_classes] != [c.nodes for c in instance.node_classes]:
        raise InputError("cost_model", "candidate_terms priced an instance with other nodes, or identical nodes "
                                       "differently: change the instance itself to price one node apart")
    return priced




@dataclass(frozen=True)
class StagePlacement:
    """What the cost of a stage depends on, derived from its device groups."""

    nodes: tuple[int, ...]  # node of each group (of its first device)
    device_types: tuple[str, ...]  # sorted distinct types in the stage
    groups: tuple[tuple[int, ...], ...] = ()  # the nodes each group spans (one, unless tp spans nodes: H16)

    @property
    def all_nodes(self) -> tuple[int, ...]:
        """Every node the stage's devices sit on."""
        return tuple(dict.fromkeys(j for group in self.groups for j in group)) or self.nodes


class StageCosts:
    """The cost terms of one candidate on one placement.

    A cost model's subclass fills, in ``_price``: per stage the prefix sums of its compute
    classes' layer times (E_s is the slowest), the factor (seconds per byte) of each
    boundary, the ring factor (seconds per byte) of each stage and the allreduce factor
    (seconds per parameter) of each stage.  Methods take layer ranges [k, l) in stage
    order as integers or broadcastable arrays.

    Examples
    --------
    >>> import amp_opt
    >>> from amp_opt.model.evaluate import stage_costs
    >>> from amp_opt.model.plan import check_plan
    >>> inst = amp_opt.load_instance("instances/amp_het_cluster.json")
    >>> plan = check_plan(inst, amp_opt.parse_plan({"tp": 1, "dp": 4, "pp": 4, "micro_batch": 1,
    ...                                             "partition": [0, 7, 14, 20, 30]}))
    >>> costs = stage_costs(inst, plan, "amp")  # the AMP model's StageCosts
    >>> [round(float(costs.compute(s, plan.partition[s], plan.partition[s + 1])), 4) for s in range(4)]
    [0.0649, 0.0899, 0.0785, 0.0897]
    """

    def __init__(self, model, tables, cand, stages: Stages, *, chunks=None, modes=None):
        # Every term from the model's one source (module doc): links and devices as it prices them.
        self.terms = model.candidate_terms(tables, cand, chunks=chunks, modes=modes)
        instance = priced_instance(self.terms, tables.instance)
        self.model, self.tables, self.instance = model, tables, instance
        self.cand = cand
        self.tp, self.dp, self.pp, self.micro_batch = cand.tp, cand.dp, cand.pp, cand.micro_batch
        self.n_micro = self.terms.n_micro
        self.pipeline = pipeline_weights(self.n_micro, cand.pp, cand.virtual_stages, model.schedule)
        self.sums = self.terms.sums
        self.stages = stages
        self.estimated = False  # whether any compute time came from FLOPs
        node_of = instance.device_node
        self.placement = tuple(
            StagePlacement(
                nodes=tuple(int(node_of[group[0]]) for group in stage),
                device_types=tuple(sorted({instance.nodes[node_of[d]].device_type for group in stage for d in group})),
                groups=tuple(tuple(dict.fromkeys(int(node_of[d]) for d in group)) for group in stage),
            )
            for stage in stages
        )
        types = instance.device_types
        self.capacity = [min(types[t].capacity for t in place.device_types) for place in self.placement]
        # Per stage and compute class: prefix sums of layer seconds in the stage's recomputation
        # mode and without recomputation (the layers after a block of recomputed ones), and the
        # class's fixed seconds per micro-batch.
        self._compute_prefixes: list[list[tuple[np.ndarray, np.ndarray, float]]] = []
        self._volume = self.terms.volume
        self._p2p_factor: list[float] = []
        self._p2p_latency: list[float] = [0.0] * cand.pp  # seconds per micro-batch of each boundary's messages (H19)
        self._allreduce_latency: list[float] = [0.0] * cand.pp  # seconds of each stage's ring steps (H19)
        self._ring_factor: list[float] = [0.0] * cand.pp  # seconds per byte on each stage's ring (H10)
        self._ring_latency: list[float] = [0.0] * cand.pp  # seconds per message on each stage's ring (H19)
        self._allreduce_factor: list[float] = []
        self._optimizer_factor: list[float] = [0.0] * cand.pp  # seconds per parameter of the step (H15)
        self.overlap_share = 0.0  # share of a stage's layer seconds its reduction overlaps (H18; 0: none)
        self._price()

    def _price(self) -> None:  # pragma: no cover - every cost model defines it
        raise NotImplementedError

    def _class_prefixes(self, device_type: str, intra: float, latency: float,
                        s: int) -> tuple[np.ndarray, np.ndarray, float]:
        """Prefix sums of a compute class's layer seconds on stage s: its mode's, and without
        recomputation; and the class's fixed seconds per micro-batch (calibrated step overhead, C3)."""
        self.estimated |= self.terms.estimated(device_type, intra, latency)
        mode = self.terms.modes[s]
        return (prefix_sums(self.terms.layer_seconds(device_type, intra, mode, latency)),
                prefix_sums(self.terms.layer_seconds(device_type, intra, "none", latency)),
                self.instance.device_types[device_type].step_overhead)

    @property
    def enforces_memory(self) -> bool:
        return self.model.enforces_memory

    @property
    def state_bytes_per_param(self) -> float:
        return self.terms.state_bytes_per_param

    def in_flight(self, s: int) -> float:
        return self.terms.in_flight(s)

    # -- the terms ----------------------------------------------------------
    def split(self, s: int, k, l):
        """Where stage s's recomputed layers end in [k, l) (:meth:`CandidateTerms.split`, at the
        stage's capacity)."""
        return self.terms.split(s, k, l, self.capacity[s])

    def modes_of(self, boundaries) -> tuple[str, ...]:
        """Each stage's recomputation mode in a plan with these stage boundaries (stage order):
        the candidate's, or per stage the faster one that fits (:meth:`split`)."""
        if not self.terms.per_stage:
            return tuple(self.terms.modes)
        return tuple("full" if int(self.split(s, boundaries[s], boundaries[s + 1])) > boundaries[s] else "none"
                     for s in range(self.pp))

    def compute(self, s: int, k, l):
        """E_s: seconds of one micro-batch through layers [k, l) on stage s (slowest replica),
        with the communication the stage adds per micro-batch (H10)."""
        k, l = np.asarray(k), np.asarray(l)
        mid = self.split(s, k, l)
        out = None
        for mode, none, step in self._compute_prefixes[s]:
            time = (mode[mid] - mode[k]) + (none[l] - none[mid]) + step
            out = time if out is None else np.maximum(out, time)
        if self._ring_factor[s]:
            out = out + self.terms.stage_comm_bytes(s, k, l, mid) * self._ring_factor[s]
        if self._ring_latency[s]:
            out = out + self.terms.stage_comm_messages(s, k, l, mid) * self._ring_latency[s]
        return out

    def p2p(self, s: int, l):
        """Seconds to send one micro-batch from stage s (ending before layer l) to s+1: its bytes over
        the link (H3) and its messages' latency (H19)."""
        return self._volume[np.asarray(l) - 1] * self._p2p_factor[s] + self._p2p_latency[s]

    def allreduce(self, s: int, k, l):
        """Seconds of stage s's end of iteration for layers [k, l): its gradient synchronisation
        that the backward pass does not hide (:meth:`exposed_reduction`, eq. H18) and then its
        optimizer step (:meth:`optimizer_step`, eq. H15)."""
        if not self.overlap_share:
            return self.sums.params_in(k, l) * self.allreduce_factor(s) + self._allreduce_latency[s]
        return self.exposed_reduction(s, k, l) + self.optimizer_step(s, k, l)

    def exposed_reduction(self, s: int, k, l):
        """Seconds of stage s's gradient synchronisation left after the overlap (eq. H18):
        max(0, reduction - overlap_window)."""
        if not self.overlap_share:
            return self.reduction(s, k, l)
        return np.maximum(0.0, self.reduction(s, k, l) - self.overlap_window(s, k, l))

    def overlap_window(self, s: int, k, l):
        """Seconds of stage s's last backward pass a reduction can hide in (eq. H18): the backward
        share of its layers' seconds (recomputation included) on its fastest compute class."""
        k, l = np.asarray(k), np.asarray(l)
        mid = self.split(s, k, l)
        out = None
        for mode, none, _ in self._compute_prefixes[s]:
            time = (mode[mid] - mode[k]) + (none[l] - none[mid])
            out = time if out is None else np.minimum(out, time)
        return self.overlap_share * out

    def reduction(self, s: int, k, l):
        """Seconds of stage s's gradient synchronisation for layers [k, l) (eq. H4, its ring steps' latency H19)."""
        return self.sums.params_in(k, l) * self._allreduce_factor[s] + self._allreduce_latency[s]

    def optimizer_step(self, s: int, k, l):
        """Seconds of stage s's optimizer step for layers [k, l) (eq. H15)."""
        return self.sums.params_in(k, l) * self._optimizer_factor[s]

    def memory(self, s: int, k, l):
        """Bytes per device of stage s for layers [k, l) (eq. H5)."""
        return self.terms.memory(s, k, l, self.capacity[s])

    def fits(self, s: int, k, l):
        return self.memory(s, k, l) <= self.capacity[s]

    # -- per-layer coefficients, for the MIPs (sums of these are the terms above) ----
    def layer_times(self, s: int) -> list[np.ndarray]:
        """Per compute class present in stage s: seconds of each layer for one micro-batch in the
        stage's base mode (:meth:`CandidateTerms.base_mode`)."""
        block = self.terms.base_mode(s) != self.terms.modes[s]
        return [np.diff(none if block else mode) for mode, none, _ in self._compute_prefixes[s]]

    def recompute_times(self, s: int) -> list[np.ndarray]:
        """Per compute class (as :meth:`layer_times`): the seconds a layer adds when it is among the
        first layers the block method recomputes on stage s (zeros without the block method)."""
        block = self.terms.base_mode(s) != self.terms.modes[s]
        return [np.diff(mode) - np.diff(none) if block else np.zeros(len(mode) - 1)
                for mode, none, _ in self._compute_prefixes[s]]

    def step_overheads(self, s: int) -> list[float]:
        """Per compute class of stage s (as :meth:`layer_times`): its fixed seconds per micro-batch."""
        return [step for _, _, step in self._compute_prefixes[s]]

    def p2p_volume(self) -> np.ndarray:
        """Per layer: what p2p_factor multiplies when a boundary follows the layer."""
        return self._volume

    def p2p_factor(self, s: int) -> float:
        return self._p2p_factor[s]

    def p2p_latency(self, s: int) -> float:
        """Seconds boundary s adds to :meth:`p2p` whatever its bytes: its messages' latency (H19)."""
        return self._p2p_latency[s]

    def ring_latency(self, s: int) -> float:
        """Seconds per message on stage s's ring (H19): what its per-micro-batch ring messages
        (:meth:`CandidateTerms.stage_comm_messages`) cost each."""
        return self._ring_latency[s]

    def allreduce_latency(self, s: int) -> float:
        """Seconds stage s's gradient synchronisation adds whatever its bytes: its ring steps' latency
        (H19); the MIPs add it to the stage's row as a constant."""
        return self._allreduce_latency[s]

    def ring_factor(self, s: int) -> float:
        """Seconds per byte of stage s's per-micro-batch ring traffic (H10); 0 when there is none."""
        return self._ring_factor[s]

    def allreduce_factor(self, s: int) -> float:
        """Seconds per parameter of stage s's end of iteration: reduction and optimizer step (H4, H15)."""
        return self._allreduce_factor[s] + self._optimizer_factor[s]

    def optimizer_factor(self, s: int) -> float:
        """Seconds per parameter of stage s's optimizer step (H15); 0 under a model without it."""
        return self._optimizer_factor[s]

    def least_end_factor(self, s: int) -> float:
        """Seconds per parameter stage s's end of iteration (:meth:`allreduce`) takes at least,
        whatever its layers: reduction and optimizer step, or only the step where the backward pass
        may hide the reduction (H18); the ring steps' latency left out (a bound reads it)."""
        return self.optimizer_factor(s) if self.overlap_share else self.allreduce_factor(s)
