"""The terms of a candidate and of its stages, as every cost model prices them.

What does not depend on the devices (memory, eq. H5, H7-H10, H14; per-layer effective times;
volumes) is :class:`CandidateTerms`; a cost model (:mod:`.contract`) turns a candidate on a
placement (the devices of every stage) into a :class:`StageCosts`, which computes the terms of any
stage for any layer range, vectorised, so that the evaluator, the partition DP and the MIPs all
read their numbers from one place.  The iteration-time formula is :mod:`.iteration`'s, the link
rules :mod:`.link_rules`'.  Every search reads these records through one model method,
``candidate_terms`` (``formulations/hetero.md``, "One source of terms").

The module is over 400 lines because every term of ``formulations/hetero.md`` (H1-H19) is a
method of these two records, which share one set of per-layer prefix arrays; split by term, each
part would rebuild those arrays or reach into the other's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import InputError
from .iteration import BACKWARD_SHARE, FORWARD_SHARE, pipeline_weights
from ..plan import Candidate, Stages



def communicator_sizes(cand) -> tuple[int, ...]:
    """The ranks of each NCCL communicator a rank of the candidate's plan uses (eq. H14): its
    tensor-parallel group, its context-parallel ring, its gradient group (the R = dp*cp replicas)
    and, with a pipeline, the point-to-point pair to its neighbours; groups of one rank need none."""
    sizes = (cand.tp, cand.cp, cand.replicas, 2 if cand.pp > 1 else 1)
    return tuple(size for size in sizes if size > 1)


def framework_bytes(training, cand) -> float:
    """Bytes per device the framework holds outside the caching allocator (eq. H14): the fixed
    reserve (CUDA context, kernels, workspaces) and the NCCL buffers of every communicator used."""
    pair, group = training.communicator_bytes
    return training.memory_reserve + sum(pair if size == 2 else group for size in communicator_sizes(cand))


def state_bytes_per_param(training, replicas: int, zero_stage: int) -> float:
    """Bytes of model state per parameter on a rank (eq. H9): weights, gradients and optimizer
    states, each sharded over the ``replicas`` from its ZeRO stage on, and the gradient
    reduction's buffers when there are replicas (calibration C7)."""
    R, z, tr = replicas, zero_stage, training
    return (tr.weight_bytes / (R if z >= 3 else 1) + tr.gradient_bytes / (R if z >= 2 else 1)
            + tr.optimizer_bytes / (R if z >= 1 else 1) + (tr.gradient_buffer_bytes_per_param if R > 1 else 0.0))


def overlap_share(instance) -> float:
    """The share of a stage's layer seconds its gradient reduction overlaps (eq. H18): the
    backward share where the engine overlaps it (``training.overlap_grad_reduce``), else 0."""
    return BACKWARD_SHARE if instance.training.overlap_grad_reduce else 0.0


def memory_bandwidth(instance, device_types) -> float:
    """Bytes/s of the slowest device memory among ``device_types`` (eq. H15); inf when none
    states one (the optimizer step is then not priced)."""
    known = [instance.device_types[t].memory_bandwidth for t in device_types]
    known = [b for b in known if b]
    return min(known) if known else float("inf")


def stage_order(partition, pp: int) -> tuple[np.ndarray, tuple[int, ...]]:
    """Layers in stage order and the stages' boundaries in it: with interleaving (pp*v chunks,
    chunk j on stage j mod pp) a stage's chunks are made contiguous (eq. H11).

    Examples
    --------
    >>> order, boundaries = stage_order((0, 2, 4, 6, 8), 2)  # 4 chunks on 2 stages
    >>> order.tolist(), boundaries
    ([0, 1, 4, 5, 2, 3, 6, 7], (0, 4, 8))
    """
    chunks = [(partition[j], partition[j + 1]) for j in range(len(partition) - 1)]
    order, boundaries = [], [0]
    for s in range(pp):
        for k, l in chunks[s::pp]:
            order.extend(range(k, l))
        boundaries.append(len(order))
    return np.array(order, dtype=int), tuple(boundaries)


def kept_bytes(per, factor: float) -> dict[str, np.ndarray]:
    """H7: per layer, the bytes kept per sample for backward by recomputation mode ("none",
    "selective", "full": each recomputed layer keeps its input, at most what it would keep
    anyway), from a :class:`~amp_opt.model.tables.LayerArrays` times the activation ``factor``."""
    act, scores, full = per.activations * factor, per.scores * factor, per.kept_full * factor
    return {"none": act, "selective": act - np.where(per.recomputes, scores, 0.0),
            "full": np.where(per.recomputes, full, act)}


class CandidateTerms:
    """What a candidate's stages need whatever their devices (``formulations/hetero.md``):
    micro-batches and the ones in flight, bytes per parameter of model state (ZeRO, H9),
    bytes kept per layer (activations under recomputation, sequence and context
    parallelism, H7, H8, H10), effective seconds per layer, the p2p bytes after each layer,
    and the communication a stage adds to its compute per micro-batch (H10).

    Per-layer arrays are in stage order (:func:`stage_order`; the layer order itself
    without interleaving).  ``modes`` overrides the recomputation of each stage.  A
    ``per_stage`` candidate's stages each recompute in full or not at all: which one is
    decided by the search (per range, the faster mode that fits: ``capacity`` arguments).

    What a subclass may change (a cost model's :meth:`CostModel.candidate_terms` returns it, and
    every search reads it): :meth:`layer_seconds` (a layer's effective seconds on a device type),
    and :attr:`instance`, the instance as priced: the links, capacities, step overheads and memory
    bandwidths every row reads come from it, so a subclass may set it to a copy with other numbers
    there: the same nodes, devices and layers, nodes identical in the caller's instance identical
    in it (:func:`priced_instance` checks); layer times are looked up by each node's intra link in
    it, so a copy keeps those, or overrides :meth:`layer_seconds` to match.
    """

    def __init__(self, tables, cand: Candidate, *, chunks=None, modes: tuple[str, ...] | None = None):
        inst = tables.instance
        self.tables, self.instance, self.cand = tables, inst, cand
        self.tp, self.dp, self.pp, self.micro_batch = cand.tp, cand.dp, cand.pp, cand.micro_batch
        self.n_micro = cand.n_micro(inst)
        self.modes = modes or (cand.recompute,) * cand.pp
        self.order = None if chunks is None or cand.virtual_stages == 1 else stage_order(chunks, cand.pp)[0]
        self.sums = tables.layer_sums(cand.tp, self.order)
        m, sp, cp = cand.tp, cand.sequence_parallel, cand.cp
        per = tables.layer_arrays(m, sp, self.order)
        factor = inst.training.activation_factor / cp  # calibrated activation bytes (C6), split over cp ranks
        act = per.activations * factor
        self.recomputes = per.recomputes
        self.kept = kept_bytes(per, factor)
        # H8: a layer's extra compute, as a share of its forward+backward time.
        self.extra = {"none": np.zeros(len(act)), "selective": per.selective_share,
                      "full": np.where(self.recomputes, FORWARD_SHARE, 0.0)}
        self.volume = cand.micro_batch * (per.sent / cp)
        self.kv = cand.micro_batch * (per.kv / cp)
        self.activations = act  # bytes per sample of each layer without recomputation
        # What full recomputation rebuilds at once (one layer, the largest member of a block),
        # and one layer's parameters (what ZeRO-3 gathers at once).
        self.recomputed_activations = np.where(self.recomputes, per.rebuilt, 0.0) * factor
        self.largest_params = per.largest_params
        self._count = np.concatenate([[0], np.cumsum(self.recomputes)])  # recomputing layers before each position
        self._max: dict[str, np.ndarray] = {}
        self._kept_prefixes: dict[str, np.ndarray] = {}
        tr = inst.training
        # H14: the framework's bytes outside the allocator, and the allocator's fragmentation; H9: model state.
        self.framework_bytes = framework_bytes(tr, cand)
        self.allocator_scale = 1.0 + tr.fragmentation
        self.state_bytes_per_param = state_bytes_per_param(tr, cand.replicas, cand.zero_stage)

    def in_flight(self, s: int) -> float:
        """Micro-batches stage s keeps activations for: min(p - s, n) under 1F1B; interleaved
        (H11), Megatron's warm-up 2(p-s-1) + (v-1)p chunks plus the one in progress, over v."""
        p, n, v = self.pp, self.n_micro, self.cand.virtual_stages
        if v == 1:
            return min(p - s, n)
        return min(2 * (p - s - 1) + (v - 1) * p + 1, n * v) / v

    @property
    def block(self) -> bool:
        """Whether only the first ``recompute_layers`` transformer layers of a stage recompute."""
        return self.cand.recompute_layers > 0

    @property
    def per_stage(self) -> bool:
        """Whether each stage recomputes in full or not at all, as the search decides."""
        return self.cand.per_stage and self.modes[0] == "full"

    def split(self, s: int, k, l, capacity: float | None = None):
        """Where stage s's recomputed layers end in [k, l): after the first ``recompute_layers``
        transformer layers from k (Megatron's block method), l when all recompute, k when none do.
        Per stage (:attr:`per_stage`): k where the range fits ``capacity`` bytes without
        recomputation (the faster mode), else l."""
        k, l = np.asarray(k), np.asarray(l)
        if self.per_stage:
            if capacity is None:
                raise ValueError("a per-stage recomputation choice needs the stage's capacity")
            return np.where(self.memory_in(s, k, l, "none") <= capacity, k, l)
        if self.modes[s] != "full" or not self.block:
            return l if self.modes[s] != "none" else k
        end = np.searchsorted(self._count, self._count[k] + self.cand.recompute_layers)
        return np.minimum(l, end)

    def block_start(self) -> np.ndarray:
        """Per layer l in stage order (block method): the latest start a stage holding l may have for l
        to be among its first ``recompute_layers`` recomputing layers (a layer that does not recompute: 0).
        A stage starting at k recomputes l exactly when k >= block_start()[l]; the MIPs use this."""
        r, c = self.cand.recompute_layers, self._count
        latest = np.searchsorted(c, c[1:] - r, side="left")  # count of recomputing layers in [k, l] <= r
        return np.where(self.recomputes, latest, 0)

    def base_mode(self, s: int) -> str:
        """The mode every layer of stage s is priced in before the block method's first layers: the
        stage's mode, or "none" when only a block of its first layers recomputes."""
        return "none" if self.modes[s] == "full" and (self.block or self.per_stage) else self.modes[s]

    def layer_bytes(self, s: int) -> np.ndarray:
        """Bytes kept per sample by each layer on stage s in its base mode (:meth:`base_mode`)."""
        return self.kept[self.base_mode(s)]

    def memory(self, s: int, k, l, capacity: float | None = None):
        """Bytes per device of stage s for layers [k, l) in stage order (eq. H5, H7, H9).  Per stage
        (:attr:`per_stage`): in the mode :meth:`split` picks for ``capacity``; without it, the
        least of the two modes (whether some mode fits)."""
        k, l = np.asarray(k), np.asarray(l)
        if self.per_stage and capacity is None:
            return np.minimum(self.memory_in(s, k, l, "none"), self.memory_in(s, k, l, "full"))
        return self._bytes(s, k, l, self.split(s, k, l, capacity), rebuilt=self.modes[s] == "full")

    def memory_in(self, s: int, k, l, mode: str):
        """Bytes per device of stage s for layers [k, l) with every layer in ``mode``: "none", or
        the stage's own mode (all of its layers, not a block of them)."""
        k, l = np.asarray(k), np.asarray(l)
        if mode == "none":
            return self._bytes(s, k, l, k, rebuilt=False)
        if mode != self.modes[s]:
            raise ValueError(f"stage {s} recomputes {self.modes[s]!r}, not {mode!r}")
        return self._bytes(s, k, l, l, rebuilt=mode == "full")

    def memory_floor(self, s: int, k, l):
        """Bytes per device stage s needs at least for layers [k, l), growing with the range: its
        memory (:meth:`memory`), except under the block method and per-stage choice, whose memory
        need not grow with the range: there every layer counted in full mode (H7: a recomputing
        layer keeps only its input, no more than without recomputation) and the rebuilt buffer
        left out."""
        if not ((self.block or self.per_stage) and self.modes[s] == "full"):
            return self.memory(s, k, l)
        k, l = np.asarray(k), np.asarray(l)
        return self._bytes(s, k, l, l, rebuilt=False)

    def _bytes(self, s: int, k, l, mid, *, rebuilt: bool):
        """Eq. H5 for layers [k, l) of stage s: model state, the layers [k, mid) kept in the stage's
        mode and [mid, l) without recomputation; with ``rebuilt`` the largest layer rebuilt in
        [k, mid) (H7); under ZeRO-3 one layer's gathered weights and gradients (H9); all of it
        through the allocator (x (1 + fragmentation)), plus the framework's own bytes (H14)."""
        kept = self._kept_prefix(self.modes[s])
        rest = self._kept_prefix("none")
        out = (self.sums.params_in(k, l) * self.state_bytes_per_param
               + self.in_flight(s) * self.micro_batch * ((kept[mid] - kept[k]) + (rest[l] - rest[mid])))
        if rebuilt:  # the recomputed layer's activations while its backward runs
            out = out + self.micro_batch * self._range_max("recomputed", k, mid)
        if self.cand.zero_stage >= 3:
            tr = self.instance.training
            out = out + self._range_max("params", k, l) * (tr.weight_bytes + tr.gradient_bytes)
        return out * self.allocator_scale + self.framework_bytes

    def _kept_prefix(self, mode: str) -> np.ndarray:
        """Prefix sums of :attr:`kept` in ``mode``, computed once (every memory query reads them)."""
        if mode not in self._kept_prefixes:
            self._kept_prefixes[mode] = _prefix(self.kept[mode])
        return self._kept_prefixes[mode]

    def _range_max(self, what: str, k, l):
        """max of a per-layer array over [k, l) for every pair of the broadcast ranges (0 when empty);
        one range directly (the table of every range is (L+1)^2 cells: 75 GiB at 10^5 layers)."""
        values = self.recomputed_activations if what == "recomputed" else self.largest_params
        if np.ndim(k) == 0 and np.ndim(l) == 0:
            return float(values[int(k):int(l)].max()) if int(l) > int(k) else 0.0
        if what not in self._max:
            L = len(values)
            table = np.zeros((L + 1, L + 1))
            for start in range(L):
                table[start, start + 1:] = np.maximum.accumulate(values[start:])
            self._max[what] = table
        return self._max[what][k, l]

    def layer_seconds(self, device_type: str, intra: float, mode: str, latency: float = 0.0) -> np.ndarray:
        """Effective forward+backward seconds per layer of one micro-batch (eq. H2, H8): the
        measured or estimated time on a tp group whose link has bandwidth ``intra`` and
        ``latency`` (H19), plus what recomputation ``mode`` runs again, over cp ranks."""
        times = self.tables.layer_times(device_type, intra, self.tp, self.micro_batch, latency=latency)
        seconds = times.seconds if self.order is None else times.seconds[self.order]
        return seconds * (1.0 + self.extra[mode]) / self.cand.cp

    def estimated(self, device_type: str, intra: float, latency: float = 0.0) -> bool:
        return self.tables.layer_times(device_type, intra, self.tp, self.micro_batch, latency=latency).estimated

    def comm_layer_bytes(self, mode: str) -> np.ndarray:
        """Per layer, the bytes per rank a context-parallel ring moves per micro-batch in recomputation
        ``mode`` (eq. H10): (cp-1)/cp of the layer's K and V, forward, twice in backward (K/V and
        their gradients), once more when full recomputation repeats the layer's forward."""
        cp = self.cand.cp
        if cp == 1:
            return np.zeros(len(self.kv))
        again = self.recomputes if mode == "full" else np.zeros(len(self.kv), dtype=bool)
        return (3 + again) * (cp - 1) * self.kv

    def comm_layer_messages(self, mode: str) -> np.ndarray:
        """Per layer, the messages a rank sends one after the other on its stage's ring per micro-batch
        in recomputation ``mode`` (eq. H19 on H10's traffic): (cp-1) steps per K/V pass of an attention
        layer (the passes of :meth:`comm_layer_bytes`), and under ZeRO-3 3 (R-1) per layer with
        parameters (its two all-gathers and its reduce-scatter)."""
        cp, R = self.cand.cp, self.cand.replicas
        out = np.zeros(len(self.kv))
        if cp > 1:
            again = self.recomputes if mode == "full" else np.zeros(len(self.kv), dtype=bool)
            out = out + np.where(self.kv > 0, (3 + again) * (cp - 1), 0.0)
        if self.cand.zero_stage >= 3 and R > 1:
            out = out + np.where(self.sums.params > 0, 3.0 * (R - 1), 0.0)
        return out

    def stage_comm_messages(self, s: int, k, l, mid=None):
        """Messages stage s sends on its ring per micro-batch for layers [k, l) (eq. H19), the layers
        [k, mid) recomputing (default :meth:`split`), as :meth:`stage_comm_bytes` counts bytes."""
        k, l = np.asarray(k), np.asarray(l)
        mid = self.split(s, k, l) if mid is None else mid
        own, rest = _prefix(self.comm_layer_messages(self.modes[s])), _prefix(self.comm_layer_messages(self.base_mode(s)))
        return own[mid] - own[k] + rest[l] - rest[mid]

    def comm_param_bytes(self) -> float:
        """Bytes per parameter ZeRO-3 moves per micro-batch on the ring (eq. H10): the weights
        gathered twice (forward, backward) and the gradients reduce-scattered, (R-1)/R of each."""
        if self.cand.zero_stage < 3:
            return 0.0
        tr, R = self.instance.training, self.cand.replicas
        return (R - 1) / R * (2 * tr.weight_bytes + tr.gradient_bytes)

    def stage_comm_bytes(self, s: int, k, l, mid=None):
        """Bytes per rank stage s moves on its data-parallel ring per micro-batch, on top of its
        compute (eq. H10): :meth:`comm_layer_bytes` over [k, l) plus :meth:`comm_param_bytes` per
        parameter; the layers [k, mid) recompute (default :meth:`split`)."""
        k, l = np.asarray(k), np.asarray(l)
        mid = self.split(s, k, l) if mid is None else mid
        kv, rest = _prefix(self.comm_layer_bytes(self.modes[s])), _prefix(self.comm_layer_bytes(self.base_mode(s)))
        return kv[mid] - kv[k] + rest[l] - rest[mid] + self.comm_param_bytes() * self.sums.params_in(k, l)

    def optimizer_bytes_per_param(self) -> float:
        """Bytes of device memory per parameter of a stage that its slowest rank's optimizer step
        reads and writes (eq. H15): the optimizer states read and written (2o), the gradient read
        (g) and the new weight written (w); over the R replicas from ZeRO stage 1 on, where each
        rank steps its shard of the states."""
        tr, R = self.instance.training, self.cand.replicas
        return (2 * tr.optimizer_bytes + tr.gradient_bytes + tr.weight_bytes) / (R if self.cand.zero_stage >= 1 else 1)

    def allreduce_messages(self) -> int:
        """Messages a rank of a stage sends in sequence in its gradient synchronisation (eq. H19): a
        ring over the R replicas takes 2 (R-1) steps (reduce-scatter then all-gather, also ZeRO-1/2's
        pair); none for one replica or under ZeRO-3 (whose traffic is per micro-batch, H10)."""
        R = self.cand.replicas
        return 0 if self.cand.zero_stage >= 3 or R == 1 else 2 * (R - 1)

    def allreduce_bytes_per_param(self) -> float:
        """Bytes per parameter a stage's gradient synchronisation moves once per iteration, as a ring
        over the R = dp*cp replicas (eq. H4, H9): 2 (R-1)/R times the gradient bytes (an allreduce,
        or ZeRO-1/2's reduce-scatter plus all-gather); ZeRO-3 moves them per micro-batch instead."""
        R = self.cand.replicas
        if self.cand.zero_stage >= 3 or R == 1:
            return 0.0
        return 2 * (R - 1) / R * self.instance.training.allreduce_bytes_per_param


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


def _prefix(values: np.ndarray) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(values)])


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
        return (_prefix(self.terms.layer_seconds(device_type, intra, mode, latency)),
                _prefix(self.terms.layer_seconds(device_type, intra, "none", latency)),
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
