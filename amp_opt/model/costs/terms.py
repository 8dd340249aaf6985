"""The terms of a candidate that do not depend on its devices, as every cost model prices them.

:class:`CandidateTerms` holds memory (eq. H5, H7-H10, H14), per-layer effective times and volumes;
a cost model (:mod:`.contract`) turns a candidate on a placement (the devices of every stage) into
a :class:`~amp_opt.model.costs.stage_costs.StageCosts`, which reads them for any stage and layer
range, so that the evaluator, the partition DP and the MIPs all read their numbers from one place.
The iteration-time formula is :mod:`.iteration`'s, the link rules :mod:`.link_rules`'.  Every
search reads these records through one model method, ``candidate_terms``
(``formulations/hetero.md``, "One source of terms").
"""

from __future__ import annotations

import numpy as np

from .iteration import BACKWARD_SHARE, FORWARD_SHARE
from ..plan import Candidate



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
            self._kept_prefixes[mode] = prefix_sums(self.kept[mode])
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
        own, rest = prefix_sums(self.comm_layer_messages(self.modes[s])), prefix_sums(self.comm_layer_messages(self.base_mode(s)))
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
        kv, rest = prefix_sums(self.comm_layer_bytes(self.modes[s])), prefix_sums(self.comm_layer_bytes(self.base_mode(s)))
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


def prefix_sums(values: np.ndarray) -> np.ndarray:
    """[0, v0, v0 + v1, ...]: the prefix sums every layer-range term reads."""
    return np.concatenate([[0.0], np.cumsum(values)])
