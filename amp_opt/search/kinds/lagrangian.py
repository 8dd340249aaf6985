"""Stage kinds of a candidate and their Lagrangian DP (``formulations/mip.md`` eq. K1-K4, K7).

Under the hetero model with free grouping a stage's cost depends on its groups only
through the set S of node classes it uses (its *kind*): compute is the slowest class's
range time, memory the smallest capacity, the ring and p2p links the slowest
inter-node link (or, for a kind of one class whose node can hold a whole stage,
possibly the intra-node link).  What couples the stages is the supply of groups per
class.  Pricing that supply with multipliers lambda_c (a Lagrangian relaxation), and
the rounding rows (at most floor(G_B / d) stages inside a class set B, eq. K7) with
multipliers mu_B, leaves a shortest-path DP over layer positions:
:meth:`KindModel.sweep`.  The bound built on it is in :mod:`.bound`, the plans built
from it in :mod:`.construct`, and the phase of the MIP driver that runs both in
:mod:`.refine`.

The module is over 400 lines because :class:`KindModel` is one DP: its tables (compute,
allreduce, memory fit per kind and range) and the sweep that reads them share their layout, and
split apart each half would have to restate it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from ...model.classes import node_classes
from ...model.costs import HETERO, CandidateTerms, CostModel
from ...model.costs.terms import memory_bandwidth, overlap_share, stage_order
from ...model.engines import PER_STAGE_MODES
from ...model.ranges import INF, backtrack, band_min_sum_step, chain_window, grid, min_max_chain
from ...model.ranges import weighted as _weighted
from ..tuning import MAX_KINDS


@dataclass(frozen=True)
class KindPath:
    """A DP solution: the kind and layer range of every stage."""

    kinds: tuple[int, ...]
    boundaries: tuple[int, ...]


def band_layout(usable: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ranges stored by (end l, length - 1) up to the longest one ``usable`` ((L+1, L+1) bool,
    [k, l]) allows: the start of each (l, j) cell, clipped to 0, and whether it is a real range."""
    first, last = np.nonzero(usable)
    band = max(1, int((last - first).max())) if len(first) else 1
    starts = np.arange(usable.shape[1])[:, None] - 1 - np.arange(band)[None, :]
    valid = starts >= 0
    return np.where(valid, starts, 0), valid


class KindModel:
    """Per-kind range tables of one candidate (eq. K1-K3), and the Lagrangian DP over them (K4).

    Tables are indexed [kind, k, l] over layer ranges [k, l): ``compute`` (seconds of one
    micro-batch, the slowest class of the kind), ``allreduce`` (seconds), ``fits_at(f)`` (bool:
    the range fits the kind's capacity with f micro-batches in flight).  For a ``per_stage``
    candidate a kind is a class set and a recomputation mode (``mode``: none or full; the
    stage takes the faster that fits); ``siblings[i]`` lists the kinds of kind i's class set,
    ``canonical[i]`` the first of them.
    """

    def __init__(self, tables, cand, chunks=None, cost_model: CostModel = HETERO):
        # The model's one source of terms (terms.py): its layer seconds, and the instance as it
        # prices it (links, capacities, step overheads), which every table below reads.
        terms = cost_model.candidate_terms(tables, cand, chunks=chunks)
        instance = terms.instance
        self.tables, self.instance, self.cand, self.chunks = tables, instance, cand, chunks
        self.cost_model = cost_model  # a hetero model: its stage terms, its schedule's weights
        m, d = cand.tp, cand.replicas
        pipe = cost_model.pipeline(tables, cand)
        self.fill = pipe.fill  # the weight of a stage's compute in the sum (H11)
        # Thresholds T are on the weighted stage compute w_f E (H13: a stage's bottleneck weight
        # depends on its position only through its micro-batches in flight f, so the weight of f
        # is exact; were it not, the least weight of f keeps every bound valid).  ``w`` is the
        # threshold's weight in the bound (1, or 0 when there is no bottleneck term).
        self.pipe = pipe
        self.w, self.w_top = (1.0 if max(pipe.bottleneck) > 0 else 0.0), max(pipe.bottleneck)
        self.classes = node_classes(instance)
        C, self.L = len(self.classes), instance.num_layers
        self.supply = np.array([c.groups(m) for c in self.classes], dtype=float)
        sets = [S for r in range(1, min(C, d) + 1) for S in itertools.combinations(range(C), r)
                if sum(self.supply[c] for c in S) >= d]
        modes = PER_STAGE_MODES if cand.per_stage else (cand.recompute,)
        self.kinds = [S for S in sets for _ in modes]
        self._member = np.array([[c in S for c in range(C)] for S in self.kinds], dtype=bool).reshape(-1, C)
        self.mode = [m for _ in sets for m in modes]
        self.canonical = np.array([i - i % len(modes) for i in range(len(self.kinds))])
        self.siblings = [list(range(int(c), int(c) + len(modes))) for c in self.canonical]
        params = self._tables(terms)
        self._memory(terms)
        # Kinds that behave the same (tables, capacity, link) share a representative: the
        # multiset DP only needs to tell behaviours apart.
        seen: dict[tuple, int] = {}
        self.representative = np.array([
            seen.setdefault((tuple(self.compute[j].tobytes() for j in self.siblings[i]), self.allreduce[i].tobytes(),
                             self.capacity[i], self.send(S), self.mode[i]), i)
            for i, S in enumerate(self.kinds)])
        # K3: a boundary at position k costs volume[k] over the slower of its two stages' links,
        # so the DP remembers the link level of the previous stage.
        # An interleaved boundary is crossed v times (H11); under 1F1B each boundary is paid twice (H13).
        self.volume = (cand.virtual_stages * pipe.p2p) * np.concatenate([[0.0], terms.volume[:-1], [0.0]])
        self.links = np.array(sorted({self.send(S) for S in self.kinds}))
        self.link_of = np.array([int(np.searchsorted(self.links, self.send(S))) for S in self.kinds])
        self._level_kinds = [np.flatnonzero(self.link_of == b) for b in range(len(self.links))]
        self.p2p_factor = 1.0 / np.minimum(self.links[:, None], self.links[None, :])  # [previous, next]
        self.ceiling = self._ceiling(params)
        self._cuts()

    def _tables(self, terms: CandidateTerms) -> np.ndarray:
        """Compute (with the stage's ring traffic, H10) and allreduce of every kind over every range
        (eq. K1, K2), layers in stage order; returns the parameters per range."""
        L = self.L
        g = grid(L)
        ranges, traffic, layers, messages = {}, {}, {}, {}
        for mode in sorted(set(self.mode)):
            # Where the recomputed layers end: every stage recomputes alike (the block method's first
            # layers), or per stage in the kind's mode (all of them, or none).
            mid = terms.split(0, g.start, g.stop) if not terms.per_stage else g.stop if mode == "full" else g.start
            ranges[mode], layers[mode] = [], []
            for c in self.classes:
                own, base = (np.concatenate([[0.0], np.cumsum(terms.layer_seconds(c.device_type, c.intra, m,
                                                                                   c.intra_latency))])
                             for m in (self.cand.recompute, terms.base_mode(0)))
                layers[mode].append((own[mid] - own[g.start]) + (base[g.stop] - base[mid]))
                ranges[mode].append(layers[mode][-1] + self.instance.device_types[c.device_type].step_overhead)
            traffic[mode] = terms.stage_comm_bytes(0, g.start, g.stop, mid)
            messages[mode] = terms.stage_comm_messages(0, g.start, g.stop, mid)  # (H19)
        params = terms.sums.params_in(g.start, g.stop)
        sync, step = terms.allreduce_bytes_per_param(), terms.optimizer_bytes_per_param()
        kappa = overlap_share(self.instance)
        K = len(self.kinds)
        self.compute = np.full((K, L + 1, L + 1), INF)
        self.allreduce = np.full((K, L + 1, L + 1), INF)
        self.capacity = np.zeros(K)
        steps = terms.allreduce_messages()
        for i, S in enumerate(self.kinds):
            link = self.ring(S)
            alpha = self.ring_latency(S)  # H19: the least latency the ring can have
            lam = steps * alpha
            # The factors as the evaluator forms them (StageCosts), so that both give the same floats.
            mode = self.mode[i]
            self.compute[i] = np.where(g.nonempty, np.max([ranges[mode][c] for c in S], axis=0)
                                       + traffic[mode] * (1.0 / link) + messages[mode] * alpha, INF)
            # H15: and the optimizer step at the kind's slowest device memory, as StageCosts.allreduce_factor.
            bandwidth = memory_bandwidth(self.instance, {self.classes[c].device_type for c in S})
            if kappa:  # H18: what the fastest class's backward pass leaves exposed, then the step
                exposed = np.maximum(0.0, params * (sync / link) + lam
                                     - kappa * np.min([layers[mode][c] for c in S], axis=0))
                self.allreduce[i] = np.where(g.nonempty, exposed + params * (step / bandwidth), INF)
            else:  # the same floats as StageCosts.allreduce
                self.allreduce[i] = np.where(g.nonempty, params * (sync / link + step / bandwidth) + lam, INF)
            self.capacity[i] = min(self.instance.device_types[self.classes[c].device_type].capacity for c in S)
        return params

    def _memory(self, terms: CandidateTerms) -> None:
        """Which ranges fit each kind (eq. H5), by micro-batches in flight, the only way the
        stage index enters memory; only ranges some stage of a p-stage partition can take.
        (About 60 lines: one vectorised pass over the ranges, each step feeding the next.)"""
        g = grid(self.L)
        # A stage of a p-stage partition holds at most L - p + 1 layers (the others one each).
        allowed = g.nonempty & (g.l - g.k <= self.L - self.cand.pp + 1)
        if self.chunks is not None:  # interleaving: the stages' ranges are fixed (and tile the layers)
            allowed = np.zeros_like(g.nonempty)
            boundaries = stage_order(self.chunks, self.cand.pp)[1]
            for s in range(self.cand.pp):
                allowed[boundaries[s], boundaries[s + 1]] = True
        self.in_flight = [terms.in_flight(s) for s in range(self.cand.pp)]
        self.weight: dict = {}  # micro-batches in flight f -> the least bottleneck weight of a stage with f
        for s, f in enumerate(self.in_flight):
            self.weight[f] = min(self.weight.get(f, INF), self.pipe.bottleneck[s])
        # Memory grows with the micro-batches in flight (H5), so a range that fits a kind with f in
        # flight fits it with fewer: per kind and range, how many of the distinct in-flight counts
        # (smallest first) it fits, ``fit_rank``, stands for every f's table (``fits_at``).
        # Kinds of the same capacity (and mode) are compared once.
        self.flights = sorted(set(self.in_flight))
        self.flight_rank = {f: r + 1 for r, f in enumerate(self.flights)}
        first_stage = {f: self.in_flight.index(f) for f in self.flights}
        groups: dict = {}
        for i in range(len(self.kinds)):
            groups.setdefault((self.capacity[i], self.mode[i] if terms.per_stage else None), []).append(i)
        rank = np.zeros((len(groups), self.L + 1, self.L + 1), dtype=np.int32)
        for r, f in enumerate(self.flights, start=1):
            s = first_stage[f]
            if terms.per_stage:
                need = {m: terms.memory_in(s, g.start, g.stop, m) for m in set(self.mode)}
            else:
                need = terms.memory(s, g.start, g.stop)
            for j, (capacity, mode) in enumerate(groups):
                # only where it fitted every smaller count: the ranks count from the smallest up
                fits = allowed & ((need[mode] if terms.per_stage else need) <= capacity) & (rank[j] == r - 1)
                rank[j][fits] = r
        self.fit_rank = np.empty((len(self.kinds), self.L + 1, self.L + 1), dtype=np.int32)
        for j, members in enumerate(groups.values()):
            self.fit_rank[members] = rank[j]
        self.fitting = self.fit_rank > 0  # (K, k, l): fits at some stage
        # For the sweep's arcs (:meth:`_arcs`): the least weight (the loosest threshold test) and the
        # tables in the sweep's layout, by (end l, length - 1) up to the L - p + 1 layers a stage can
        # hold, computed once: compute (also at the least weight), allreduce, fit and fit ranks.
        self._least = min(self.weight.values())
        room = max(1, self.L - self.cand.pp + 1)
        starts = np.arange(self.L + 1)[:, None] - 1 - np.arange(room)[None, :]
        valid = starts >= 0
        take = (slice(None), np.where(valid, starts, 0), np.arange(self.L + 1)[:, None])
        # Each band is (end l, length - 1, kind), the kind innermost: the cheapest kind of a cell is
        # a reduction over contiguous memory, and a cell searched again reads its kinds in one row.
        band = lambda table: np.ascontiguousarray(np.moveaxis(table, 0, -1))  # noqa: E731 (gathers: (K, L+1, room))
        self._compute_band = band(np.where(valid, self.compute[take], INF))
        self._least_band = _weighted(self._compute_band, self._least)
        self._allreduce_band = band(np.where(valid, self.allreduce[take], INF))
        self._fitting_band = band(self.fitting[take] & valid)
        self._rank_band = band(np.where(valid, self.fit_rank[take], 0))
        # In-flight counts of the same weight that fit the same ranges (no kind's rank falls between
        # them) share their arcs.
        ranks = np.unique(self.fit_rank)
        groups: dict = {}
        for f in self.flights:
            groups.setdefault((self.weight[f], int(np.searchsorted(ranks, self.flight_rank[f]))), []).append(f)
        self._group_flights = list(groups.values())
        self._group_rank = np.array([self.flight_rank[fs[0]] for fs in self._group_flights])
        self._group_weight = np.array([self.weight[fs[0]] for fs in self._group_flights])

    def fits_at(self, f) -> np.ndarray:
        """(K, k, l): the ranges each kind holds with f micro-batches in flight (eq. H5)."""
        return self.fit_rank >= self.flight_rank[f]

    def _ceiling(self, params: np.ndarray) -> float:
        """A cost above every plan's: each term at its largest over ranges that fit, links at the
        slowest the cluster has.  A bound reaching it proves the candidate has no plan."""
        usable = self.fitting.any(axis=0)
        if not usable.any():
            return 0.0  # nothing fits anywhere
        p = self.cand.pp
        slow = min(min(c.ring_inter(self.cand.tp), c.intra) for c in self.classes)
        sync = 2 * self.instance.training.allreduce_bytes_per_param  # at least the candidate's per parameter
        tr = self.instance.training
        step = (2 * tr.optimizer_bytes + tr.gradient_bytes + tr.weight_bytes) / memory_bandwidth(  # H15, unsharded
            self.instance, {c.device_type for c in self.classes})
        crude = ((self.w_top + p) * float(self.compute[self.fitting].max())
                 + (p - 1) * float(self.volume.max()) / slow
                 + float(params[usable].max()) * (sync / slow + step))
        return 2.0 * crude

    def _cuts(self) -> None:
        """K7: at most floor(G_B / d) stages have kinds inside a class set B.  The supply allows
        G_B / d of them in the relaxation; only the rounding cuts, so only sets where d does
        not divide G_B are kept.  Each cut gets a multiplier mu_B >= 0 beside lambda."""
        C, d = len(self.classes), self.cand.replicas
        totals = {B: int(sum(self.supply[c] for c in B)) for r in range(1, C) for B in itertools.combinations(range(C), r)}
        sets = [B for B, G in totals.items() if G >= d and G % d]
        self.cut_sets = sets
        self.cut_rhs = np.array([totals[B] // d for B in sets], dtype=float)
        self.inside = np.array([[set(S) <= set(B) for B in sets] for S in self.kinds],
                               dtype=float).reshape(len(self.kinds), len(sets))
        self.dims = C + len(sets)  # multipliers: lambda (one per class), then mu (one per cut)

    def ring(self, S) -> float:
        """The fastest link a stage of kind S can reduce over (eq. K1; across nodes, the share of
        a NIC each of its tp rings gets, H17)."""
        return self._link(S, lambda c: c.ring_inter(self.cand.tp))

    def ring_latency(self, S) -> float:
        """The least seconds per message a stage of kind S's ring can have (eq. H19): the largest
        inter-node latency of its classes, or, for one class whose node can hold the stage, the
        smaller of that and its intra-node latency.  (The boundaries' latency is left out of K3,
        which keeps the DP a relaxation.)"""
        if len(S) == 1 and self.classes[S[0]].devices // self.cand.tp >= self.cand.replicas:
            c = self.classes[S[0]]
            return min(c.inter_latency, c.intra_latency)
        return max(self.classes[c].inter_latency for c in S)

    def send(self, S) -> float:
        """The fastest link a stage of kind S can send its boundary on (eq. K3)."""
        return self._link(S, lambda c: c.inter)

    def _link(self, S, inter) -> float:
        d = self.cand.replicas
        if len(S) == 1:
            c = self.classes[S[0]]
            if c.devices // self.cand.tp >= d:
                return max(inter(c), c.intra)
        return min(inter(self.classes[c]) for c in S)

    def prices(self, y: np.ndarray) -> np.ndarray:
        """What a stage of each kind pays under multipliers y = (lambda, mu): its cheapest groups
        (``compositions``) plus mu_B for every cut set B (eq. K7) that holds the kind; (K,)."""
        C = len(self.classes)
        return self.compositions(y[:C])[0] + self.inside @ y[C:]

    def subgradient(self, path: KindPath, y: np.ndarray) -> np.ndarray:
        """The relaxed constraints' excess at a path: groups taken minus the supply (lambda),
        stages inside each cut set minus its limit (mu)."""
        C = len(self.classes)
        inside = self.inside[list(path.kinds)].sum(axis=0)
        return np.concatenate([self.usage(path, y[:C]) - self.supply, inside - self.cut_rhs])

    def constant(self, y: np.ndarray) -> float:
        """The multipliers' constant term: lambda . G + mu . floor(G_B / d)."""
        C = len(self.classes)
        return float(y[:C] @ self.supply + y[C:] @ self.cut_rhs)

    def compositions(self, lam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per kind, the cheapest groups per class under prices ``lam`` (one of each class of
        the kind, the rest from the cheapest ones up to their supply): prices (K,), counts (K, C)."""
        counts = self._member.astype(float)
        left = self.cand.replicas - self._member.sum(axis=1)
        for c in np.argsort(lam, kind="stable"):  # classes cheapest first, ties to the first
            take = np.where(self._member[:, c], np.minimum(left, int(self.supply[c]) - 1), 0)
            counts[:, c] += take
            left -= take
        return counts @ lam, counts

    def _arcs(self, y: np.ndarray, T: np.ndarray, U: np.ndarray, paths: bool = True):
        """The arcs of the sweep: per (micro-batches in flight f, link level b), the cheapest kind's
        compute plus price for every (batch, end l, length - 1) whose range is usable under the
        thresholds; ranges are stored by (end, length - 1) up to the longest usable one per level.
        Returns the arc costs (None where no arc exists) and, with ``paths``, the kinds.

        A stage with f in flight may use a subset of the ranges usable at the least weight and in
        the memory of some stage, so the cheapest kind over that superset (the first one, as a
        loop over kinds would pick) is its cheapest wherever that kind is usable at f; only the
        other cells are searched again at f, for every f at once.  Micro-batches in flight of the
        same weight and the same fitting ranges share their arcs.  (About 65 lines: one
        vectorised pass, each step feeding the next.)"""
        batch, B, L = len(T), len(self.links), self.L
        y = np.broadcast_to(y, (batch, self.dims))
        prices = np.array([self.prices(row) for row in y])  # (batch, K)
        Tq, Uq = T[:, None, None, None], U[:, None, None, None]
        # Ranges (batch, end l, length - 1, K) within the thresholds at the least weight and in the
        # memory of some stage, which holds every range some stage can use.
        timely = (self._least_band[None] <= Tq) & (self._allreduce_band[None] <= Uq) & self._fitting_band[None]
        arcs, which = {}, {}
        room, K = self._rank_band.shape[1:]
        spans = timely.any(axis=(0, 1))  # (length - 1, K): some batch and end use the kind's length
        for b in range(B):
            kinds = self._level_kinds[b]
            lengths = np.flatnonzero(spans[:, kinds].any(axis=1))
            width = int(lengths[-1]) + 1 if len(lengths) else 1  # up to the longest usable range
            # Per kind (batch, L+1, width, kinds): usable at the least weight in some stage's memory,
            # and its cost; the cheapest such kind per cell.
            compute = self._compute_band[:, :width][..., kinds]
            loose = timely[:, :, :width][..., kinds]
            cost = np.where(loose, compute[None] * self.fill + prices[:, None, None, kinds], INF)
            first = cost.argmin(axis=-1)  # (batch, L+1, width)
            best = np.take_along_axis(cost, first[..., None], axis=-1)[..., 0]
            open_ = np.isfinite(best)
            base = np.where(open_, best, INF)
            base_kind = kinds[first].astype(np.int16)
            chosen = np.take_along_axis(compute[None], first[..., None], axis=-1)[..., 0]
            # Where each cell's cheapest kind sits in the flattened (L+1, room, K) rank band.
            flat = (np.arange(L + 1)[:, None] * room + np.arange(width)) * K + kinds[first]
            # Per group of in-flight counts (G, batch, L+1, width): where the cheapest kind is
            # usable at the group's memory and weight it is the group's cheapest; elsewhere search again.
            usable = self._rank_band.reshape(-1).take(flat)[None] >= self._group_rank[:, None, None, None]
            tight = self._group_weight != self._least
            if tight.any():
                usable[tight] &= self._group_weight[tight, None, None, None] * chosen[None] <= T[None, :, None, None]
            again = open_[None] & ~usable
            rows = kind = None
            if again.any():
                rows, kind = np.repeat(base[None], len(usable), axis=0), np.repeat(base_kind[None], len(usable), axis=0)
                g, j, l, w = np.nonzero(again)
                ok = loose[j, l, w] & (self._rank_band[l[:, None], w[:, None], kinds] >= self._group_rank[g][:, None])
                t = tight[g]
                if t.any():
                    ok[t] &= self._group_weight[g[t]][:, None] * compute[l[t], w[t]] <= T[j[t], None]
                options = np.where(ok, cost[j, l, w], INF)
                pick = options.argmin(axis=1)
                rows[g, j, l, w] = options[np.arange(len(g)), pick]
                kind[g, j, l, w] = kinds[pick]
                some = np.isfinite(rows).any(axis=(1, 2, 3))
            else:
                some = np.full(len(usable), bool(open_.any()))
            for gi, members in enumerate(self._group_flights):
                row = base if rows is None else rows[gi]
                for f in members:
                    arcs[f, b] = row if some[gi] else None
                    if paths:  # the first cheapest kind, as a loop over kinds would pick
                        which[f, b] = base_kind if kind is None else kind[gi]
        return arcs, which

    def sweep(self, y: np.ndarray, T: np.ndarray, U: np.ndarray, paths: bool = False):
        """h(T, U) under multipliers y for a batch of thresholds (eq. K4, K7) and, if asked, a
        minimising path each.

        h is the least sum over p stages of E + P + price(kind) with every stage's weighted compute <= T,
        allreduce <= U and memory within its kind's capacity.  States: (link level of the
        previous stage, layer position).  Ranges are stored by (end l, length - 1) up to the
        longest usable one.
        """
        p, L = self.cand.pp, self.L
        batch, B = len(T), len(self.links)
        arcs, which = self._arcs(y, T, U, paths)
        hop = self.volume[None, None, None, :] * self.p2p_factor[None, :, :, None]  # [batch, prev, next, k]
        values = np.full((batch, B, L + 1), INF)
        values[:, 0, 0] = 0.0
        back = []
        for s in range(p):
            f = self.in_flight[s]
            ls = slice(s + 1, L - p + s + 2)  # ends stage s can have
            entry = values[:, :, None, :] + hop  # (batch, prev, next, L+1)
            came = entry.argmin(axis=1)  # (batch, B, L+1)
            entry = entry.min(axis=1)
            new = np.full((batch, B, L + 1), INF)
            span = np.zeros((batch, B, L + 1), dtype=np.int16)
            for b in range(B):
                if arcs[f, b] is not None:
                    new[:, b, ls], span[:, b, ls] = band_min_sum_step(entry[:, b], arcs[f, b], ls)
            if paths:
                back.append((span, came))
            values = new
        ends = values[:, :, L]
        h = ends.min(axis=1)
        if not paths:
            return h, None
        found = []
        for j in range(batch):
            if not np.isfinite(h[j]):
                found.append(None)
                continue

            def step(s, b, end, j=j):
                span, came = back[s]
                width = int(span[j, b, end])
                start = end - 1 - width
                return int(which[self.in_flight[s], b][j, end, width]), start, int(came[j, b, start])

            found.append(KindPath(*backtrack(p, L, int(np.argmin(ends[j])), step)))
        return h, found

    def reach(self, path: KindPath) -> tuple[float, float]:
        """The path's largest weighted stage compute and largest allreduce (the thresholds it needs)."""
        b = path.boundaries
        t = max(self.weight[self.in_flight[s]] * self.compute[k, b[s], b[s + 1]] for s, k in enumerate(path.kinds))
        u = max(self.allreduce[k, b[s], b[s + 1]] for s, k in enumerate(path.kinds))
        return float(t), float(u)

    def usage(self, path: KindPath, lam: np.ndarray) -> np.ndarray:
        """Groups per class the relaxed path takes (the subgradient is this minus the supply)."""
        _, counts = self.compositions(lam)
        return counts[list(path.kinds)].sum(axis=0)


def min_max(model: KindModel, table: np.ndarray, weighted: bool = False) -> float:
    """The least possible largest value of ``table`` (indexed [kind, k, l]; with ``weighted``
    times each stage's bottleneck weight, the thresholds' units) over p-stage paths that fit in
    memory, supply ignored: no plan's maximum is smaller."""
    # The least over the kinds that fit with f in flight is the least over the kinds of rank >= f's:
    # taken rank by rank from the largest down, each (kind, range) entry is read once, and each
    # stage keeps the window of ranges it can take (chain_window).
    L, p = model.L, model.cand.pp
    if p > L:
        return INF
    ranks = model.fit_rank.reshape(-1)
    order = np.argsort(ranks, kind="stable")
    ends = np.searchsorted(ranks[order], np.arange(len(model.flights) + 2))  # entries of rank below r
    values, where = table.reshape(-1)[order], order % (L + 1) ** 2
    least = np.full((L + 1) ** 2, INF)
    square = least.reshape(L + 1, L + 1)
    best_kind = [None] * p
    stages: dict = {}
    for s, f in enumerate(model.in_flight):
        stages.setdefault(model.flight_rank[f], []).append(s)
    for r in range(len(model.flights), 0, -1):
        np.minimum.at(least, where[ends[r]:ends[r + 1]], values[ends[r]:ends[r + 1]])
        for s in stages.get(r, ()):
            best_kind[s] = square[chain_window(L, p, s)].copy()
    weights = [model.weight[f] for f in model.in_flight] if weighted else None
    return min_max_chain(best_kind, weights=weights, windowed=True)


def kind_model(tables, cand, chunks=None, cost_model: CostModel = HETERO) -> KindModel | None:
    """The candidate's kind model; None when there are too many kinds (node classes) for it."""
    classes = len(node_classes(tables.instance))
    return KindModel(tables, cand, chunks, cost_model) if 2 ** classes - 1 <= MAX_KINDS else None
