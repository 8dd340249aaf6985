"""The ``hetero`` cost model (``formulations/hetero.md``) and its candidate bound (``formulations/mip.md`` B2-B3).

Each stage runs at its slowest replica's device speed (H1), a boundary's p2p and a
stage's ring allreduce use the slowest link they cross (H3, H4), and every device must
hold its stage (H5, enforced).  Any placement can be priced: AMP's rank order or the
search's free grouping.

The module is a little over 400 lines because the model and its bound read the same per-class
tables (:func:`compute_classes`, the allreduce tables); apart, the bound would rebuild them.
"""

from __future__ import annotations

import math

import numpy as np

from ..classes import node_classes
from ..ranges import INF, grid, min_max_chain, min_max_step, min_sum_step, range_table, stage_room, start_row
from ..ranges import weighted as _weighted
from ..engines import even_partition
from .link_rules import hetero_link, link_latency, ring_link, tp_link
from .contract import CostModel
from .stage_costs import StageCosts
from .terms import CandidateTerms, memory_bandwidth, overlap_share, stage_order

LABELLED_BUDGET = 1.5e8  # cells of the labelled DP (B2) before falling back to B3


class HeteroCosts(StageCosts):
    """Stage terms of the hetero model."""

    def _price(self) -> None:
        nodes, v = self.instance.nodes, self.cand.virtual_stages
        for s, place in enumerate(self.placement):
            # Compute classes: each device's type at its group's tp link (H16: the slowest
            # inter-node link when the group spans nodes, else its node's intra link), bandwidth
            # and latency (H19).
            keys = sorted({(nodes[j].device_type, tp_link(self.instance, group), link_latency(self.instance, group))
                           for group in place.groups for j in group})
            self._compute_prefixes.append([self._class_prefixes(t, bw, lat, s) for t, bw, lat in keys])
        # H3: one micro-batch's boundary activation over the slowest link of the two stages;
        # interleaved, every boundary is crossed v times (H11).
        self._p2p_factor = [v / self.boundary_bandwidth(s) for s in range(self.pp - 1)] + [0.0]
        # H19: and one message each crossing, at the latency of that link.
        self._p2p_latency = [v * link_latency(self.instance, a.all_nodes + b.all_nodes)
                             for a, b in zip(self.placement, self.placement[1:])] + [0.0]
        # H4, H10: the stage's ring (gradients, and per micro-batch K/V or ZeRO-3 traffic) over its slowest link.
        sync = self.terms.allreduce_bytes_per_param()
        self._allreduce_factor = [sync / self.ring_bandwidth(s) for s in range(self.pp)]
        self._ring_factor = [1.0 / self.ring_bandwidth(s) for s in range(self.pp)]
        self._ring_latency = [link_latency(self.instance, p.all_nodes) for p in self.placement]  # H19
        steps = self.terms.allreduce_messages()  # the gradient ring's steps, each at the ring's latency
        self._allreduce_latency = [steps * lat for lat in self._ring_latency]
        # H15: the optimizer step, a pass over the stage's states at its slowest device memory.
        step = self.terms.optimizer_bytes_per_param()
        self._optimizer_factor = [step / memory_bandwidth(self.instance, place.device_types) for place in self.placement]
        # H18: the reduction overlaps the last backward pass where the engine does it.
        self.overlap_share = overlap_share(self.instance)

    def ring_bandwidth(self, s: int) -> float:
        """Bytes/s of stage s's data-parallel ring (eq. H4, H17)."""
        return ring_link(self.instance, self.placement[s].all_nodes, self.tp)

    def boundary_bandwidth(self, s: int) -> float:
        """Bytes/s between stage s and s+1 (eq. H3)."""
        return hetero_link(self.instance, self.placement[s].all_nodes + self.placement[s + 1].all_nodes)


class ComputeClass:
    """Groups of one compute class (device type, intra link) at a candidate's (tp, micro-batch)."""

    def __init__(self, times: np.ndarray, groups: int, capacity: float, link: float, step: float = 0.0,
                 bandwidth: float = math.inf, window: np.ndarray | None = None):
        self.times, self.groups, self.capacity, self.link, self.step = times, groups, capacity, link, step
        self.bandwidth = bandwidth  # bytes/s of the class's device memory (H15; inf: not stated)
        # Per layer, the most seconds a layer takes on the class (every recomputing layer
        # recomputing): what bounds the overlap window of H18 from above.
        self.window = times if window is None else window


def compute_classes(terms: CandidateTerms) -> list[ComputeClass]:
    """Per compute class, fastest first: per-layer effective times (eq. H8, the candidate's
    recomputation, with the ring traffic of H10 over the class's fastest ring), groups, memory
    capacity and the fastest ring link a stage holding such a group can have (its node's, if a
    node can hold the stage)."""
    inst, cand = terms.instance, terms.cand
    info: dict[tuple[str, float, float], list] = {}
    for c in node_classes(inst):
        link = max(c.ring_inter(cand.tp), c.intra if c.groups_per_node(cand.tp) >= cand.replicas else 0.0)
        entry = info.setdefault(c.compute_key, [0, 0.0])
        entry[0] += c.groups(cand.tp)
        entry[1] = max(entry[1], link)
    ring = _ring_bytes_per_layer(terms)
    # Per layer, the base mode's times: exact for a whole-stage mode, a lower bound under the
    # block method (whose first layers recompute on top).
    out = [ComputeClass(terms.layer_seconds(t, bw, terms.base_mode(0), lat) + ring / link, g, inst.device_types[t].capacity,
                        link, inst.device_types[t].step_overhead, memory_bandwidth(inst, (t,)),
                        terms.layer_seconds(t, bw, cand.recompute, lat))
           for (t, bw, lat), (g, link) in info.items()]
    return sorted(out, key=lambda c: float(c.times.sum()))


def _ring_bytes_per_layer(terms: CandidateTerms) -> np.ndarray:
    """Per layer, at least the bytes a stage holding it moves on its ring per micro-batch (eq.
    H10): the context-parallel K/V passes and ZeRO-3's traffic on the layer's own parameters
    (a tied tensor not counted, since a stage holding both ends moves it once)."""
    params = terms.sums.params.copy()
    for members, shared in terms.sums.ties:
        params[members] -= shared
    return terms.comm_layer_bytes(terms.base_mode(0)) + terms.comm_param_bytes() * np.maximum(params, 0.0)


class HeteroModel(CostModel):
    """The hetero model under a schedule: ``hetero`` (H13, the 1F1B order's position weights)
    or ``hetero-closed`` (AMP's closed form H6, for comparison with the plans of before H13)."""

    enforces_memory = True
    placements = ("free", "rank-order")

    def __init__(self, name: str = "hetero", schedule: str = "1f1b", description: str = ""):
        self.name, self.schedule = name, schedule
        self.description = description or "per-device speeds, the slowest links a stage uses, memory limits"

    def prices(self, cand) -> bool:
        return True

    def stage_costs(self, tables, cand, stages, *, chunks=None, modes=None) -> HeteroCosts:
        return HeteroCosts(self, tables, cand, stages, chunks=chunks, modes=modes)

    def lower_bound(self, tables, cand, *, labelled: bool = True, enough: float = INF) -> float:
        """time >= T_lb + S_lb (+ U_lb under B2), T_lb a bound on the weighted bottleneck
        max_s w_s E_s (each stage at its own weight where the DP knows the stage, else the least
        weight times a bound on max_s E_s); p2p otherwise left out.

        A stage's label is the slowest compute class among its groups; at most
        floor((G_1 + ... + G_k) / dp) stages carry one of the k fastest labels.  B2: DPs over
        (labels used so far, layer position), with memory, when small enough (``labelled``);
        else B3: a fractional speed bound and the min-max partition of the fastest times.
        The parts are computed cheapest first, and once one reaches ``enough`` (a caller's
        cutoff: nothing at or above it matters to it) that part is returned, a valid bound.
        """
        v, p = cand.virtual_stages, cand.pp
        chunks = None
        if v > 1:  # B5: the chunks fix every stage's layers (Megatron's even ones by default)
            chunks = cand.chunks or even_partition(tables.instance, p * v, exact=True)
            if chunks is None:
                return INF
        terms = self.candidate_terms(tables, cand, chunks=chunks)  # the one source (terms.py)
        weight = self.pipeline(tables, cand).least
        # Every stage pays at least the smallest calibrated step overhead (C3) per micro-batch.
        inst = terms.instance
        step = min(inst.device_types[c.device_type].step_overhead for c in node_classes(inst))
        overhead = weight * step + p * step / v
        if v > 1:
            return overhead + _fixed_partition_bound(terms, chunks, enough - overhead)
        return overhead + self._bound(terms, labelled, enough - overhead)

    def _bound(self, terms: CandidateTerms, labelled: bool, enough: float) -> float:
        tables, cand = terms.tables, terms.cand
        classes = compute_classes(terms)  # on the instance as priced (terms.instance)
        caps = _caps(classes, cand.replicas, cand.pp)
        pipe = self.pipeline(tables, cand)
        w, p, L = pipe.least, cand.pp, tables.instance.num_layers
        fastest = np.min([c.times for c in classes], axis=0)
        # The fractional speed bound takes microseconds; on a subset of the cluster searched
        # below the whole cluster's plan it rules out most candidates before their memory check.
        speed = _fractional_speed_bound(classes, caps, p)
        floor = w * speed + float(fastest.sum())
        if floor >= enough:
            return floor
        if not fits_somewhere(terms, max(c.capacity for c in classes)):
            return INF
        if labelled:
            vectors = _label_vectors(caps, int(LABELLED_BUDGET // (len(classes) * (L + 1) ** 2)))
            if vectors is not None:
                return _labelled_bound(terms, classes, caps, vectors, pipe.bottleneck)
        # B3's bottleneck: the larger of the speed bound (at the least weight) and the min-max
        # partition of the fastest times, each stage's at its own weight (H13).
        fast = range_table(fastest)
        chain = min_max_chain([fast] * p, weights=pipe.bottleneck)
        floor = max(w * speed, chain) + float(fastest.sum())
        if floor >= enough:
            return floor
        return floor + _allreduce_floor(terms, max(c.link for c in classes), max(c.bandwidth for c in classes),
                                        np.max([c.window for c in classes], axis=0))


HETERO = HeteroModel()
HETERO_CLOSED = HeteroModel("hetero-closed", "closed", "the hetero model's terms under AMP's closed-form "
                            "iteration time (H6) instead of the 1F1B schedule's (H13)")


def fits_somewhere(terms: CandidateTerms, capacity: float) -> bool:
    """Whether some partition may put every stage within ``capacity`` bytes per device (the largest
    any device has), by its memory floor (:meth:`CandidateTerms.memory_floor`, the memory itself
    except under the block method and per-stage choice, where it is a necessary condition).

    First a greedy (each stage the longest range that fits and leaves a layer for every later
    stage): a partition it finds fits.  When it finds none, a reachability DP over stage
    boundaries decides exactly: the greedy alone is not exact, because a stage's memory depends
    on its index (micro-batches in flight), so a boundary pushed far ahead can leave a large
    layer to a stage that holds more micro-batches than the stage that could have held it."""
    if _greedy_fits(terms, capacity):
        return True
    p, L = terms.pp, terms.instance.num_layers
    reach = np.array([0])
    for s in range(p):
        ends = np.arange(s + 1, L - (p - 1 - s) + 1) if s < p - 1 else np.array([L])
        k, l = (a.ravel() for a in np.meshgrid(reach, ends, indexing="ij"))
        ok = (k < l) & (terms.memory_floor(s, k, np.maximum(l, k + 1)) <= capacity)
        reach = ends[ok.reshape(len(reach), len(ends)).any(axis=0)]
        if len(reach) == 0:
            return False
    return True


def _greedy_fits(terms: CandidateTerms, capacity: float) -> bool:
    """fits_somewhere's fast path: True when the greedy partition fits (False says nothing)."""
    p, L = terms.pp, terms.instance.num_layers
    k = 0
    for s in range(p):
        last = L - (p - 1 - s)
        if s == p - 1:
            return bool(terms.memory_floor(s, k, L) <= capacity)
        ends = np.arange(k + 1, last + 1)
        fit = np.flatnonzero(terms.memory_floor(s, np.full(len(ends), k), ends) <= capacity)
        if len(fit) == 0:
            return False
        k = int(ends[fit[-1]])
    return True


def _caps(classes, dp: int, p: int) -> list[int]:
    """Most stages whose slowest class is among the k fastest, k = 1..C."""
    total, caps = 0, []
    for c in classes:
        total += c.groups
        caps.append(min(p, total // dp))
    caps[-1] = p
    return caps


def _label_vectors(caps: list[int], limit: int) -> list[tuple[int, ...]] | None:
    """Stages per label, v, with every prefix sum v_1 + ... + v_k <= caps[k] (caps[-1] = p), in
    lexicographic order; None as soon as there are more than ``limit`` (listed one by one, so
    that a large count costs no more than the limit)."""
    out: list[tuple[int, ...]] = []
    v: list[int] = []

    def rec(i: int, total: int) -> bool:
        if i == len(caps):
            out.append(tuple(v))
            return len(out) <= limit
        for x in range(caps[i] - total + 1):
            v.append(x)
            going = rec(i + 1, total + x)
            v.pop()
            if not going:
                return False
        return True

    return out if rec(0, 0) else None


def _labelled_bound(terms: CandidateTerms, classes, caps, vectors, weights) -> float:
    """Eq. B2: DPs over (labels used so far, layer position), with memory.

    Stage s labelled c holds a group of class c, so it runs no faster than c (E >= range
    time of c), fits no more memory than c's capacity, and reduces its gradients no faster
    than c's best ring link.  The three terms are minimised separately, which keeps their
    sum a valid bound.  The largest compute is taken at each stage's bottleneck weight
    (``weights[s]``, :attr:`Pipeline.bottleneck`): the DP knows the stage index.
    """
    p = terms.pp
    L, C = terms.instance.num_layers, len(classes)
    g = grid(L)
    compute = [range_table(c.times) for c in classes]
    allreduce = [_allreduce_table(terms, c.link, c.bandwidth, c.window) for c in classes]
    scaled: dict = {}  # (class, weight) -> the class's range times at that weight

    def lead(c: int, weight: float) -> np.ndarray:
        if (c, weight) not in scaled:
            scaled[c, weight] = _weighted(compute[c], weight)
        return scaled[c, weight]

    fits = []
    for s in range(p):
        memory = terms.memory(s, g.start, g.stop)
        room = stage_room(L, p, s)
        fits.append([room & (memory <= c.capacity) for c in classes])

    def ok(v):
        return all(sum(v[: i + 1]) <= caps[i] for i in range(C))

    start = start_row(L)
    best = {(0,) * C: (start, start, start)}  # min max E, min sum E, min max AR
    for v in sorted(vectors, key=sum):
        if v not in best or sum(v) == p:
            continue
        s = sum(v)
        bmax, bsum, bar = best[v]
        for c in range(C):
            w = v[:c] + (v[c] + 1,) + v[c + 1:]
            if not ok(w):
                continue
            mask = fits[s][c]
            rows = (min_max_step(bmax, lead(c, weights[s]), mask), min_sum_step(bsum, compute[c], mask),
                    min_max_step(bar, allreduce[c], mask))
            best[w] = tuple(np.minimum(a, b) for a, b in zip(best[w], rows)) if w in best else rows
    finals = [rows for v, rows in best.items() if sum(v) == p]
    if not finals:
        return INF
    t_lb = min(r[0][L] for r in finals)
    s_lb = min(r[1][L] for r in finals)
    u_lb = min(r[2][L] for r in finals)
    if not np.isfinite(t_lb):
        return INF
    return float(t_lb + s_lb + u_lb)


def _fixed_partition_bound(terms: CandidateTerms, chunks, enough: float = INF) -> float:
    """B5, with interleaving (``chunks``, the candidate's or Megatron's even ones, fix every stage's
    layers, eq. H11; ``terms`` the model's at those chunks):

        (n - 1/v) max_s E_s + (1/v) sum_s E_s + max_s AR_s

    with each stage's E_s no less than on the fastest compute class and its AR_s no less than
    over the fastest ring; and since at most caps[k] stages hold only groups of the k+1
    fastest classes (B2's nesting), when caps[k] < p some stage runs on a class slower than
    k, so max_s E_s is at least the least time any stage takes on such a class.  inf when a
    stage fits no device's memory.  The time terms come first: once they reach ``enough`` they
    are returned without the memory check."""
    cand = terms.cand
    classes = compute_classes(terms)
    boundaries = stage_order(chunks, cand.pp)[1]
    p = cand.pp
    # work[c, s]: stage s's time on class c (classes fastest first)
    work = np.array([[float(c.times[boundaries[s]:boundaries[s + 1]].sum()) for s in range(p)] for c in classes])
    fastest = work.min(axis=0)
    slowest = float(fastest.max())
    caps = _caps(classes, cand.replicas, p)
    for k in range(len(classes) - 1):
        if caps[k] < p:
            slowest = max(slowest, float(work[k + 1:].min()))
    # Each stage's gradients over the fastest ring any stage can have, its optimizer step (H15)
    # at the fastest device memory.
    # H18: less the most its backward pass can hide (every layer at its slowest class).
    link, bandwidth = max(c.link for c in classes), max(c.bandwidth for c in classes)
    window = overlap_share(terms.instance) * np.max([c.window for c in classes], axis=0)
    ends = []
    for s in range(p):
        params = float(terms.sums.params_in(boundaries[s], boundaries[s + 1]))
        hidden = float(window[boundaries[s]:boundaries[s + 1]].sum())
        ends.append(max(0.0, params * terms.allreduce_bytes_per_param() / link - hidden)
                    + params * terms.optimizer_bytes_per_param() / bandwidth)
    v = cand.virtual_stages
    bound = (terms.n_micro - 1 / v) * slowest + float(fastest.sum()) / v + max(ends)
    if bound >= enough:
        return bound
    capacity = max(c.capacity for c in classes)
    if any(terms.memory(s, boundaries[s], boundaries[s + 1]) > capacity for s in range(p)):
        return INF
    return bound


def _allreduce_table(terms: CandidateTerms, link: float, bandwidth: float = math.inf, window=None) -> np.ndarray:
    """Seconds of a stage's gradient synchronisation over a ring of ``link`` bytes/s and its
    optimizer step at ``bandwidth`` bytes/s of device memory (H15), for every range of layers
    (tied tensors once; inf where empty): B2's and B3's allreduce terms.  Where the reduction
    overlaps the backward pass (H18), less the overlap share of ``window`` (per layer, seconds no
    less than the stage's fastest class takes), at least 0."""
    g = grid(terms.instance.num_layers)
    params = terms.sums.params_in(g.start, g.stop)
    reduction = params * (terms.allreduce_bytes_per_param() / link)
    kappa = overlap_share(terms.instance)
    if kappa and window is not None:
        with np.errstate(invalid="ignore"):
            reduction = np.maximum(0.0, reduction - kappa * range_table(window))
    return np.where(g.nonempty, reduction + params * (terms.optimizer_bytes_per_param() / bandwidth), INF)


def _allreduce_floor(terms: CandidateTerms, link: float, bandwidth: float = math.inf, window=None) -> float:
    """B3's allreduce term: max_s (AR_s + O_s) is at least the min-max partition of the stages'
    gradient bytes over the fastest ring any stage can have, ``link`` bytes/s, with their
    optimizer step at the fastest device memory, ``bandwidth`` bytes/s (H15), and under H18 less
    what ``window`` (per layer, the most any class takes) lets the backward pass hide."""
    if terms.allreduce_bytes_per_param() / link + terms.optimizer_bytes_per_param() / bandwidth == 0.0:
        return 0.0
    return min_max_chain([_allreduce_table(terms, link, bandwidth, window)] * terms.pp)


def _fractional_speed_bound(classes, caps, p: int) -> float:
    """B3's fractional speed bound on the bottleneck: the reference work over the most speed
    p stages can have under the nested caps (0 when it cannot be priced)."""
    reference = classes[0].times
    safe = np.where(reference > 0, reference, 1.0)
    ratios = [float(np.min(np.where(reference > 0, c.times / safe, np.inf))) if np.any(reference > 0) else 1.0
              for c in classes]
    # A stage labelled k runs at most 1/rho_k of the reference speed; taking the suffix maximum
    # makes the speeds non-increasing in k, so filling the fastest labels first maximises the
    # total speed under the nested caps (and only over-estimates it, which keeps the bound valid).
    speeds = [1.0 / rho if rho > 0 and math.isfinite(rho) else math.inf for rho in ratios]
    speeds = [max(speeds[k:]) for k in range(len(speeds))]
    taken, speed = 0, 0.0
    for cap, v in zip(caps, speeds):
        count = max(0, min(cap, p) - taken)
        speed += count * v
        taken += count
    work = float(reference.sum())
    return work / speed if 0 < speed < math.inf else 0.0
