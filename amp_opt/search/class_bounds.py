"""Lower bounds on every plan of a configuration of the class-stage space R (S7-S14, S16).

``formulations/uneven-search.md``: S7 bounds the pipeline's compute (a fractional knapsack of the
layers' reference seconds over the blocks, with a floor, each block's limit in layers and in
memory (S9) and the least seconds of the slowest stage), S8 the end of the iteration (the stages'
reductions and optimizer steps), S10 ties the end to the work a block holds, S11 prices one
order of the blocks, S12 rules out blocks whose stages cannot each hold a layer that fits, and
S13 counts the runs of consecutive layers the blocks hold, S14 the layer a recomputing stage
rebuilds, and S16 the pipeline positions a block's stages can take.  :class:`Bounds` prices one
configuration, with S7's, S8's, S10's and S16's pieces from :mod:`.class_program` (which the walk's
key, :mod:`.class_walk`, relaxes), S9, S12 and S14 from :mod:`.class_memory`, S13 from
:mod:`.class_windows` and S11's programs from :mod:`.class_order`.
"""

from __future__ import annotations

import numpy as np

from ..model.classes import node_classes
from ..model.costs.contract import library_priced
from ..model.costs.iteration import pipeline_weights
from ..model.ranges import INF, grid, range_table
from ..model.plan import Candidate
from .class_memory import BlockMemory
from .class_order import block_weights, partitioned
from .class_program import balanced, bottleneck, ending, heaviest, positioned, positions, spread, with_end
from .class_stages import Block, configuration, zero_stages
from .class_windows import disjoint_windows


class Bounds:
    """Lower bounds (S7-S14, S16) on the iteration seconds of every plan of an R configuration under a
    cost ``model`` (hetero).  They read the layer tables, which a caller's own pricing may not
    follow: under such a model (``holds`` false) every bound is 0."""

    def __init__(self, instance, tables, model):
        self.instance, self.tables, self.model, self.schedule = instance, tables, model, model.schedule
        self.holds = library_priced(model)
        self.classes = node_classes(instance)
        self.spread = spread(instance, tables)
        self._times: dict = {}
        self._factors: dict = {}
        self._ranges: dict = {}  # S11's tables per block (:meth:`_range_tables`)
        self._fits: dict = {}  # S11's usable ranges per block and flight (:meth:`usable`)
        self.memory = BlockMemory(instance, tables, model, self.classes, self.holds)  # S9, S12
        self._last: tuple = (None, (0.0, None))
        self.positions = True  # S16 here and in the walk's key (a switch for the tests and benchmark that compare)

    def times(self, b: Block) -> tuple[np.ndarray, float]:
        """Per layer, the seconds of one micro-batch at the block's (type, link, tp, share) without
        recomputation (H2: no setting makes a layer faster), and the type's fixed step seconds."""
        c = self.classes[b.cls]
        key = (*c.compute_key, b.tp, b.share)
        if key not in self._times:
            t = np.asarray(self.tables.layer_times(c.device_type, c.intra, b.tp, b.share, latency=c.intra_latency).seconds,
                           dtype=float)
            self._times[key] = (t, float(self.instance.device_types[c.device_type].step_overhead or 0.0))
        return self._times[key]

    def end_factor(self, b: Block) -> float:
        """S8's c: the least seconds per parameter per rank of the block's first stage's end of
        iteration over the ZeRO stages a configuration may take (that stage has the fastest ring of
        the block's)."""
        key = (b.cls, b.tp, b.dp)
        if key not in self._factors:
            first = configuration(self.instance, b.dp * b.share, (Block(b.cls, 1, b.tp, b.dp, b.share),))
            stages = first.stages(self.instance)
            self._factors[key] = min(
                (self.model.stage_costs(self.tables, Candidate(b.tp, b.dp, 1, b.share, zero_stage=z), stages)
                 .least_end_factor(0) for z in zero_stages(self.instance)), default=0.0)
        return self._factors[key]

    def end_capacity(self, b: Block) -> float:
        """The block's k stages in S8: k * tp / c (:meth:`end_factor`); INF where c is 0."""
        factor = self.end_factor(b)
        return b.stages * b.tp / factor if factor > 0 else INF

    def end(self, blocks) -> float:
        """S8's least end of the iteration over the blocks' stages (:func:`ending` of their end
        capacities)."""
        return ending(self.spread, sum(self.end_capacity(b) for b in blocks))

    def coupling(self, b: Block, ref: np.ndarray) -> tuple[float, float]:
        """S10's (gamma, zeta) of the block against reference ``ref``: the slowest stage's end of
        iteration is at least gamma * (R_b - zeta), R_b the reference seconds the block holds;
        gamma = c * kappa / k with kappa the least parameters per rank per reference second of a
        layer outside the tie groups, zeta the tie groups' reference seconds."""
        lean, tied = self.memory.lean(b.tp)
        use = (ref > 0) & ~tied
        if not use.any():
            return 0.0, 0.0
        kappa = float((lean[use] / ref[use]).min())
        return self.end_factor(b) * kappa / b.stages, self.tied_seconds(ref)

    def tied_seconds(self, ref: np.ndarray) -> float:
        """S10's zeta: the reference seconds of the layers in tie groups."""
        return float(ref[self.memory.lean(self.instance.search.tp[0])[1]].sum())

    def consecutive(self, blocks, ref: np.ndarray, *, weights=None) -> tuple[float, float]:
        """S13 for a set of blocks (one per class): each holds a run of at least k consecutive layers,
        the runs disjoint.  (What the blocks add to S7's floor F over the reference's seconds of
        their layers: k sigma each plus the least excess over ``ref`` of disjoint windows of k
        consecutive layers, ``ref`` at most each block's seconds on every layer; the least seconds
        of the slowest stage: over disjoint windows, the slowest layer of a window plus sigma.)
        With ``weights`` (one per block) the blocks are in this order, their windows too, and the
        second is the largest weighed slowest layer (S13 in order)."""
        rows = [self.times(b) for b in blocks]
        ks, in_order = [b.stages for b in blocks], weights is not None
        weights = [1.0] * len(blocks) if weights is None else weights
        excess = disjoint_windows([np.maximum(t - ref, 0.0) for t, _ in rows], ks, in_order=in_order)
        slowest = disjoint_windows([w * (t + sigma) for w, (t, sigma) in zip(weights, rows)], ks, worst=True,
                                   in_order=in_order)
        return sum(b.stages * sigma for b, (_, sigma) in zip(blocks, rows)) + excess, slowest

    def alpha(self, b: Block, ref: np.ndarray) -> float:
        """The least ratio of the block's layer seconds to the reference's (1 where the reference
        is zero; positive where ``ref`` is at most every block's seconds)."""
        t = self.times(b)[0]
        pos = ref > 0
        return float((t[pos] / ref[pos]).min()) if pos.any() else 1.0

    def group(self, b: Block, ref: np.ndarray, *, alpha: float | None = None) -> tuple[float, float, float, float]:
        """The block's k stages in S7's program against reference ``ref``: (alpha, the capacity
        k / alpha (reference seconds held per second of E), the step seconds sigma, the fixed
        seconds k sigma); ``alpha`` when the caller has it (it does not depend on k)."""
        alpha = self.alpha(b, ref) if alpha is None else alpha
        sigma = self.times(b)[1]
        return alpha, (b.stages / alpha if alpha > 0 else INF), sigma, b.stages * sigma

    def __call__(self, M: int, order: tuple[Block, ...]) -> float:
        """The largest over the blocks taken as reference of S7's program (the least over the
        slowest stage's seconds E of least * E + fill * (the least sum of the stages' seconds with
        none above E)), plus S8's end of the iteration (``formulations/uneven-search.md``).  It does
        not depend on the order of the blocks, which the walk yields one after another: the last
        combination is kept."""
        return self._bounds(M, order, strong=True)[1]

    def below(self, M: int, order: tuple[Block, ...], value: float) -> bool:
        """Whether the bound is below ``value``: first with the least E of one layer's stage, only
        when that is below with the least E of S7's bottleneck (:func:`bottleneck`), and only when
        that is below with the order of the blocks (S13 in order, :meth:`in_order`, then S11,
        :meth:`ordered`)."""
        return (self._bounds(M, order, strong=False)[0] < value and self(M, order) < value
                and self.in_order(M, order) < value and self.ordered(M, order, value) < value)

    def in_order(self, M: int, order: tuple[Block, ...]) -> float:
        """S13 with the blocks in this order (their windows in that order too): the slowest window
        weighed by the least pipeline weight of its block's positions, plus fill times S13's floor,
        plus S8's end of the iteration; a cheap bound to try before :meth:`ordered`."""
        if not self.holds:
            return 0.0
        ks = [b.stages for b in order]
        pipe = pipeline_weights(self.instance.training.global_batch // M, sum(ks), 1, self.schedule)
        least_t = np.min([self.times(b)[0] for b in order], axis=0)
        added, lead = self.consecutive(order, least_t, weights=block_weights(pipe.bottleneck, ks))
        floor = float(least_t.sum()) + added
        return lead + pipe.fill * floor + self.end(order)

    def ordered(self, M: int, order: tuple[Block, ...], value: float = INF) -> float:
        """S11: a bound on the plans of the blocks in this order, over every partition of the layers
        into its stages, each stage priced at its layers' seconds without recomputation and its
        step seconds (E_s), at c times its parameters per rank (X_s, S8's c), and +inf where its
        model state and the activations of its micro-batches in flight pass its room (S9);
        :func:`partitioned` solves it (``value``: the caller's
        incumbent, where its grid ends)."""
        if not self.holds:
            return 0.0
        stages = [b for b in order for _ in range(b.stages)]
        n = self.instance.training.global_batch // M
        pipe = pipeline_weights(n, len(stages), 1, self.schedule)
        ranges: dict = {}
        per_stage = []
        for i, b in enumerate(stages):  # E_s and X_s of a stage holding [k, l) (rows k, columns l)
            flight = min(len(stages) - i, n)  # micro-batches whose activations the stage keeps (H5, 1F1B)
            key = (b.cls, b.tp, b.dp, b.share, flight)
            if key not in ranges:
                seconds, end = self._range_tables(b)
                usable = self.usable(b, flight)
                ranges[key] = (np.where(usable, seconds, INF), np.where(usable, end, INF))
            per_stage.append(ranges[key])
        return partitioned([e for e, _ in per_stage], [x for _, x in per_stage], pipe.bottleneck, pipe.fill,
                           value)

    def _range_tables(self, b: Block) -> tuple[np.ndarray, np.ndarray]:
        """S11's tables of a block's stage over every range [k, l) (INF where k >= l): its seconds
        (layers plus step) and end (c times its parameters per rank); kept per (class, tp, dp,
        share) across the orders the walk yields, which share them."""
        key = (b.cls, b.tp, b.dp, b.share)
        if key not in self._ranges:
            if len(self._ranges) >= RANGE_TABLES:
                self._ranges.clear()
            g = grid(self.instance.num_layers)
            t, sigma = self.times(b)
            params = self.tables.layer_sums(b.tp).params_in(g.start, g.stop)  # computed once per tp
            self._ranges[key] = (range_table(t) + sigma, np.where(g.nonempty, self.end_factor(b) * params, INF))
        return self._ranges[key]

    def usable(self, b: Block, flight: int) -> np.ndarray:
        """S11 (and S15): the ranges [k, l) (rows k, columns l) a stage of the block with ``flight``
        micro-batches in flight may hold: its parameters per rank and its activations' least bytes
        (S14) within its room (S9); the block's stage count is not read."""
        key = (b.cls, b.tp, b.dp, b.share, flight)
        if key not in self._fits:
            if len(self._fits) >= USABLE_MASKS:
                self._fits.clear()
            g = grid(self.instance.num_layers)
            params = self.tables.layer_sums(b.tp).params_in(g.start, g.stop)
            held = np.where(g.nonempty, params, INF) + self.memory.kept_in(b, flight)
            self._fits[key] = held <= self.memory.room(b) * (1 + 1e-12)  # False off the grid (INF there)
        return self._fits[key]

    def _bounds(self, M: int, order: tuple[Block, ...], *, strong: bool) -> tuple[float, float | None]:
        """(the bound without the bottleneck, with it: None until asked), per combination."""
        combination = (M, frozenset(order))
        if self._last[0] != combination:
            self._last = (combination, (self._program(M, order, strong=False), None))
        weak, full = self._last[1]
        if strong and full is None:
            full = max(weak, self._program(M, order, strong=True))
            self._last = (combination, (weak, full))
        return weak, full

    def _program(self, M: int, order: tuple[Block, ...], *, strong: bool) -> float:
        if not self.holds:
            return 0.0
        if self.memory.crowded(M, order):
            return INF  # S12: no order of these blocks fits
        p = sum(b.stages for b in order)
        L = self.instance.num_layers
        pipe = pipeline_weights(self.instance.training.global_batch // M, p, 1, self.schedule)
        rows = [self.times(b) for b in order]
        t = np.stack([r[0] for r in rows])
        least_t = t.min(axis=0)
        added, held = self.consecutive(order, least_t)  # S13
        floor = float(least_t.sum()) + added
        limits = [min(L, L - p + b.stages) for b in order]  # layers a block holds at most
        if strong:
            slowest = bottleneck(t + np.array([[r[1]] for r in rows]), limits)
        else:
            slowest = float(least_t.max()) + min(r[1] for r in rows)  # the stage holding the slowest layer
        slowest = max(slowest, held)
        best = coupled = pipe.fill * floor
        room = positions(pipe) if self.positions else None
        total = INF if room is None else float(room[-1])
        for ref in t:
            if not (ref > 0).any():
                continue
            tops = heaviest(ref)
            groups = [(*self.group(b, ref), min(tops[n], self.memory.held(b, ref))) for b, n in zip(order, limits)]
            if room is not None:  # S16
                groups = [positioned(g, b.stages, room[b.stages]) for g, b in zip(groups, order)]
            if all(g[0] > 0 for g in groups):
                work = float(ref.sum())
                best = max(best, balanced(pipe.least, pipe.fill, work, groups, floor, slowest, total))
                for j, b in enumerate(order):
                    coupled = max(coupled, with_end(pipe.least, pipe.fill, work, groups, floor, slowest, j,
                                                    *self.coupling(b, ref)))
        return max(best + self.end(order), coupled)


# Blocks whose S11 tables (two (L+1)^2 arrays each), and blocks and flights whose usable ranges
# (one (L+1)^2 mask each), are kept at most: memory caps, past which they are built again as the
# walk asks (a walk reads a few dozen blocks again and again).
RANGE_TABLES = 128
USABLE_MASKS = 2048
