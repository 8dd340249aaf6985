"""The walk over the class-stage space R: its configurations best bound first (S7-S16).

A heap over the product of the node classes' options (no block, or a block) per pipeline
micro-batch M, keyed by a relaxation of :mod:`.class_bounds`' program that holds for every
combination an entry leads to (``formulations/uneven-search.md``, "The walk's key"), so that the
search stops with a proof once the key reaches its incumbent.
"""

from __future__ import annotations

import heapq
import itertools

import numpy as np

from ..model.costs.iteration import pipeline_weights
from ..model.ranges import INF
from .class_bounds import Bounds
from .class_program import balanced, ending, heaviest, positioned, positions, with_end
from .class_reach import reaches
from .class_stages import Block, blocks, depth

# Options of the last class keyed (one program each) between two chances for the caller to read its
# clock while an entry is expanded: a time limit overshoots by at most that many programs there.
YIELD_EVERY = 16


def _orders(blocks_used: tuple[Block, ...]):
    """Every order of the blocks (one per class, so no two orders are the same configuration)."""
    return itertools.permutations(blocks_used)


def ranked(instance, bounds: Bounds, *, limit=None, stop=None):
    """Every non-uniform configuration of R as (key, M, blocks in stage order), in non-decreasing
    key, lazily; the key (S7's and S8's program over every combination the heap entry leads to) is at most
    the iteration seconds of every plan of that configuration and of every one listed after it.  A
    combination of blocks that is no configuration of R, and an entry whose only open class is the
    last (expanded into one entry per option left), yield (key, M, None), so that the caller can
    stop (key, clock) between any two.  ``limit()``: the caller's incumbent, which only falls;
    entries whose key is at or above it are not kept (the caller stops there anyway), which keeps
    the heap small.  A micro-batch M at which no configuration fits in memory (S15,
    :func:`.class_reach.reaches`) is dropped whole when the walk first reaches it; ``stop()`` (the
    caller's clock) cuts that check short, which then drops nothing."""
    limit = (lambda: INF) if limit is None else limit
    batch = instance.training.global_batch
    top = depth(instance)
    heap, per_m = [], {}
    for M in (m for m in range(1, batch + 1) if batch % m == 0):
        options = blocks(instance, M)
        if not all(options):
            continue
        pipe = pipeline_weights(batch // M, top, 1, bounds.schedule)
        options = _weightiest_first(bounds, options, pipe.least, pipe.fill)
        per_m[M] = _Walk(M, options, _references(bounds, options), bounds, pipe.fill, top)
        start = (0,) * len(options)
        heapq.heappush(heap, (per_m[M].key(start, 0), M, start, 0))
    while heap:
        key, M, idx, last = heapq.heappop(heap)
        walk, n = per_m[M], len(idx)
        if walk.fits is None:  # S15, once per M, when the walk first reaches it (its root entry)
            walk.fits = reaches(bounds, M, walk.options, top, stop=stop)
            if not walk.fits:  # no configuration at M fits: the entry and all it leads to are dropped
                yield key, M, None  # the caller may stop here
                continue
        if last == n - 1:  # only the last class open: each option left becomes an entry of its own
            for j in range(idx[-1], len(walk.order[-1])):
                leaf = idx[:-1] + (j,)
                if _used(walk, leaf, top) is not None:
                    leaf_key = max(walk.key(leaf, n, limit()), key)  # its own program, every class kept
                    if leaf_key < limit():
                        heapq.heappush(heap, (leaf_key, M, leaf, n))
                if (j - idx[-1]) % YIELD_EVERY == YIELD_EVERY - 1:
                    yield key, M, None  # the caller may stop (key still bounds every entry left)
            yield key, M, None  # no configuration yet, but the caller may stop here
            continue
        for i in range(last, n):
            if idx[i] + 1 < len(walk.order[i]):
                nxt = idx[:i] + (idx[i] + 1,) + idx[i + 1:]
                nxt_key = max(walk.key(nxt, i, limit()), key)  # its combinations are some of this entry's
                if nxt_key < limit():  # INF: every combination it leads to has too many stages
                    heapq.heappush(heap, (nxt_key, M, nxt, i))
        used = _used(walk, idx, top)
        if used is None:
            yield key, M, None  # no stage, too many, or a uniform plan: none, but the caller may stop here
            continue
        for blocks_in_order in _orders(used):
            yield key, M, blocks_in_order


def _used(walk, idx, top: int) -> tuple[Block, ...] | None:
    """The blocks of a combination, None where it is no configuration of R (no stage, more than
    ``top`` stages, or one tp and dp on every stage: a uniform plan)."""
    used = tuple(b for b in (walk.options[c][walk.order[c][j]] for c, j in enumerate(idx)) if b is not None)
    if not used or sum(b.stages for b in used) > top or len({(b.tp, b.dp) for b in used}) == 1:
        return None
    return used


def _weightiest_first(bounds: Bounds, options, least: float, fill: float) -> list:
    """The classes' options in the order the walk fixes them: the class whose absence would raise
    S7's program most first (``least`` times the rise of W_r / (sum of the classes' largest
    capacities k / alpha), plus ``fill`` times the rise of the floor's sum of each layer's least
    seconds), then the fastest.  A class left open enters the key with the best of all its
    options, so fixing the weightiest classes first tightens the keys soonest."""
    times = [[bounds.times(b)[0] for b in opts if b is not None] for opts in options]
    own = [np.min(t, axis=0) if t else np.full(bounds.instance.num_layers, INF) for t in times]
    ref = np.min(own, axis=0)
    caps = [max((b.stages / a for b in opts if b is not None for a in [bounds.alpha(b, ref)] if a > 0), default=0.0)
            for opts in options]
    work, total = float(ref.sum()), sum(caps)

    def weight(c: int) -> tuple[float, float]:
        others = [own[d] for d in range(len(options)) if d != c]
        floor = float(np.min(others, axis=0).sum()) if others else INF
        rest = total - caps[c]
        capacity = 0.0 if least == 0 else (least * (work / rest - work / total) if rest > 0 else INF)
        rise = capacity + fill * (floor - work)
        return -rise, float(own[c].sum())
    return [options[c] for c in sorted(range(len(options)), key=weight)]


def _references(bounds: Bounds, options) -> list[tuple[list, float, np.ndarray, float]]:
    """S7's references for one M's walk, each as (per class, per option its group with its memory
    limit (S9) and S10's gamma, or None; W_r; :func:`heaviest` of it; S10's zeta):
    the least seconds per layer over every block option (every alpha at least 1), and over each
    class's own options; a reference under which some block has alpha 0 is left out."""
    real = [[b for b in opts if b is not None] for opts in options]
    refs = [np.min([bounds.times(b)[0] for b in sum(real, [])], axis=0)]
    refs += [np.min([bounds.times(b)[0] for b in own], axis=0) for own in real if own]
    out = []
    for ref in refs:
        alphas: dict = {}  # alpha does not depend on a block's stages: one per (class, tp, share)
        groups = []
        for opts in options:
            row = []
            for b in opts:
                if b is not None and (b.cls, b.tp, b.share) not in alphas:
                    alphas[b.cls, b.tp, b.share] = bounds.alpha(b, ref)
                row.append(None if b is None else (*bounds.group(b, ref, alpha=alphas[b.cls, b.tp, b.share]),
                                                   bounds.memory.held(b, ref), bounds.coupling(b, ref)[0]))
            groups.append(row)
        if all(g is None or g[0] > 0 for row in groups for g in row):
            out.append((groups, float(ref.sum()), heaviest(ref), bounds.tied_seconds(ref)))
    return out


class _Walk:
    """One M's share of the walk: per class its options (None or a block) in the order the heap
    takes them (capacity k / alpha under the first reference first) and, per reference of S7
    (:func:`_references`), per class, per position, per stage budget K, the largest capacity and
    memory limit (S9) and least alpha, fixed seconds and S10's gamma of the class's options from
    there on with at most K stages (``tails``, and ``plain`` for the columns no reference changes: fixed seconds
    and the largest end capacity of S8), per class and position the least seconds of each layer
    over the options from there on (``reach``), and the options' fewest and most stages (``fewest``,
    ``most``)."""

    def __init__(self, M: int, options, references, bounds: Bounds, fill: float, top: int):
        self.M, self.options, self.bounds, self.spread = M, options, bounds, bounds.spread
        self.fits = None  # S15's verdict on M (:func:`.class_reach.reaches`), once the walk reaches M
        self.fill, self.top = fill, top
        self._weights: dict = {}  # stage count -> its pipeline's least weight and S16's rooms (:meth:`depth_of`)
        self.ends = [[0.0 if b is None else bounds.end_capacity(b) for b in opts] for opts in options]
        first = references[0][0]
        self.order = [sorted(range(len(o)), key=lambda i, g=g: (-(0.0 if g[i] is None else g[i][1]), i))
                      for o, g in zip(options, first)]
        self.fewest, self.most, self.reach = [], [], []
        L = bounds.instance.num_layers
        for c, order in enumerate(self.order):
            fewest, most, least_k, most_k = [0] * len(order), [0] * len(order), INF, 0
            reach, least_t = np.empty((len(order), L)), np.full(L, INF)
            for pos in range(len(order) - 1, -1, -1):
                b = options[c][order[pos]]
                least_k = min(least_k, 0 if b is None else b.stages)
                most_k = max(most_k, 0 if b is None else b.stages)
                fewest[pos], most[pos] = least_k, most_k
                if b is not None:
                    least_t = np.minimum(least_t, bounds.times(b)[0])
                reach[pos] = least_t
            self.fewest.append(fewest)
            self.most.append(most)
            self.reach.append(reach)
        self.references = [(groups, work, tops, zeta, self._tails(groups)) for groups, work, tops, zeta in references]
        self.plain = self._tails(None)  # the columns that do not depend on the reference

    def depth_of(self, stages: int) -> tuple[float, np.ndarray | None]:
        """For every pipeline of at most ``stages`` stages at this M: a least weight no larger than
        its own (the least weight only falls as the pipeline deepens, H13; constant in the closed
        form) and S16's rooms no smaller (:func:`.class_program.positions`: each 1/w only rises)."""
        if stages not in self._weights:
            n = self.bounds.instance.training.global_batch // self.M
            pipe = pipeline_weights(n, max(1, stages), 1, self.bounds.schedule)
            self._weights[stages] = (pipe.least, positions(pipe) if self.bounds.positions else None)
        return self._weights[stages]

    def _tails(self, groups) -> list[np.ndarray]:
        """Per class an array [position, K, (capacity, alpha, fixed, end capacity, memory limit,
        gamma)] over its options from each position on with at most K stages (0, INF, INF, 0, 0,
        INF where none): the largest capacity, end capacity and limit, the least alpha, fixed
        seconds and S10's gamma."""
        tails = []
        for c, order in enumerate(self.order):
            tail = np.empty((len(order), self.top + 1, 6))
            row = np.array([(0.0, INF, INF, 0.0, 0.0, INF)] * (self.top + 1))
            for pos in range(len(order) - 1, -1, -1):
                i = order[pos]
                b = self.options[c][i]
                g = None if groups is None else groups[c][i]
                k = 0 if b is None else b.stages
                cap, alpha, most, gamma = (0.0, INF, 0.0, INF) if g is None else (g[1], g[0], g[4], g[5])
                fixed = 0.0 if b is None else b.stages * self.bounds.times(b)[1]  # k sigma, whatever the reference
                if k <= self.top:
                    row[k:, 0] = np.maximum(row[k:, 0], cap)
                    row[k:, 1] = np.minimum(row[k:, 1], alpha)
                    row[k:, 2] = np.minimum(row[k:, 2], fixed)
                    row[k:, 3] = np.maximum(row[k:, 3], self.ends[c][i])
                    row[k:, 4] = np.maximum(row[k:, 4], most)
                    row[k:, 5] = np.minimum(row[k:, 5], gamma)
                tail[pos] = row
            tails.append(tail)
        return tails

    def _least(self, idx, kept: list) -> np.ndarray | None:
        """Per layer q, the least seconds of the kept blocks and of the options left to the later
        classes (None where some layer has none: the entry leads to no configuration)."""
        least = np.min([self.bounds.times(self.options[c][i])[0] for c, i in enumerate(kept)
                        if self.options[c][i] is not None]
                       + [self.reach[c][idx[c]] for c in range(len(kept), len(idx))], axis=0)
        return None if np.isinf(least).any() else least

    def _floor(self, kept: list, least: np.ndarray, fixed: float) -> tuple[float, float]:
        """S7's floor F over every combination an entry leads to, and the least E: F is the sum of
        :meth:`_least`'s q plus the kept blocks' add-on (:meth:`Bounds.consecutive`, S13) and the
        later classes' least fixed seconds ``fixed``, and E is at least the largest q (the stage
        holding that layer) and S13's slowest stage of the kept blocks."""
        blocks = [self.options[c][i] for c, i in enumerate(kept) if self.options[c][i] is not None]
        if not blocks:
            return float(least.sum()) + fixed, float(least.max())
        added, held = self.bounds.consecutive(blocks, least)  # S13 on the kept blocks
        return float(least.sum()) + added + fixed, max(float(least.max()), held)

    def _relaxed(self, reference, idx, last: int, kept: list, budget: list, fewest_p: int, room):
        """One reference's groups of the relaxed program (S7) and S10's gamma per group, or None
        where no option left to some class fits or no group holds work; a kept block's k stages
        hold at most S16's ``room[k]`` (None: k)."""
        groups, _, tops, _, tails = reference
        L = len(self.reach[0][0])
        own = [(groups[c][i], self.options[c][i].stages) for c, i in enumerate(kept) if groups[c][i] is not None]
        relaxed = [(*g[:4], min(g[4], tops[min(L, L - fewest_p + k)])) for g, k in own]
        if room is not None:
            relaxed = [positioned(g, k, room[k]) for g, (_, k) in zip(relaxed, own)]
        ties = [g[5] for g, _ in own]  # S10's gamma per group (zeta: the reference's tied seconds)
        for c in range(last, len(idx)):
            cap, alpha, fixed, _, most, gamma = tails[c][idx[c], budget[c]].tolist()
            if fixed == INF:
                return None  # no option left to this class fits
            if cap > 0:
                relaxed.append((alpha, cap, 0.0, fixed, most))
                ties.append(gamma)  # the least gamma of the options left (no block: R = 0, no term)
        return (relaxed, ties) if relaxed else None

    def key(self, idx, last: int, limit: float = INF) -> float:
        """The largest over the references of S7's program relaxed over every combination this
        heap entry leads to: a class before ``last`` keeps its option's group; a later one may
        still take any option from its position on that fits the stages the others leave it, so it
        gets the largest capacity and memory limit (S9), least alpha and least fixed seconds of
        those, and no step seconds in its capacity; the floor F of :meth:`_floor`; plus S8's end of
        the iteration with each later class at the largest end capacity of those options; or, larger,
        S10's program for some group (a later class at the least gamma of those options).  INF
        where no combination it leads to has few enough stages, or fits in memory, or where the kept
        blocks break S12.  Once a term reaches ``limit`` the rest are not computed: the value
        returned is then at least ``limit`` and at most the key (the caller drops the entry)."""
        kept = [self.order[c][idx[c]] for c in range(last)]
        held = sum(0 if self.options[c][i] is None else self.options[c][i].stages for c, i in enumerate(kept))
        left = self.top - held - sum(self.fewest[c][idx[c]] for c in range(last, len(idx)))
        if left < 0:
            return INF
        budget = [min(self.top, left + self.fewest[c][idx[c]]) for c in range(len(idx))]
        ends = sum(self.ends[c][i] for c, i in enumerate(kept))
        ends += sum(float(self.plain[c][idx[c], budget[c], 3]) for c in range(last, len(idx)))
        fewest_p = self.top - left  # stages of every combination the entry leads to, at least
        # ... and at most: the kept blocks' and, per later class, its largest option left that fits
        # the stages the others leave it; the least weight at that depth holds for all of them (S16;
        # without it, the deepest pipeline allowed).
        deepest = min(self.top, held + sum(min(budget[c], self.most[c][idx[c]]) for c in range(last, len(idx))))
        weight, room = self.depth_of(deepest if self.bounds.positions else self.top)
        total = INF if room is None else float(room[-1])
        later_fixed = sum(float(self.plain[c][idx[c], budget[c], 2]) for c in range(last, len(idx)))
        if later_fixed == INF:
            return INF  # no option left to some class fits
        least = self._least(idx, kept)  # it does not depend on the reference
        if least is None:
            return INF
        if not self.bounds.holds:  # a caller's pricing: the layer tables bound nothing
            return 0.0
        end = ending(self.spread, ends)
        first = self._relaxed(self.references[0], idx, last, kept, budget, fewest_p, room)
        if first is None:
            return INF
        if limit < INF:  # first the cheap program: S13's add-on left out of F and E (smaller, a bound)
            quick = balanced(weight, self.fill, self.references[0][1], first[0],
                             float(least.sum()) + later_fixed, float(least.max()), total)
            if quick + end >= limit:
                return quick + end
        if self.bounds.memory.crowded(self.M, [self.options[c][i] for c, i in enumerate(kept)]):
            return INF  # S12 on the kept blocks: every combination adds stages to them
        floor, slowest = self._floor(kept, least, later_fixed)
        best = coupled = 0.0
        programs = []
        for i, reference in enumerate(self.references):
            prepared = first if i == 0 else self._relaxed(reference, idx, last, kept, budget, fewest_p, room)
            if prepared is None:
                return INF
            programs.append((reference[1], reference[3], *prepared))
            best = max(best, balanced(weight, self.fill, reference[1], prepared[0], floor, slowest, total))
            if best + end >= limit:
                return best + end
        for work, zeta, relaxed, ties in programs:  # S10 for each group
            for j, gamma in enumerate(ties):
                coupled = max(coupled, with_end(weight, self.fill, work, relaxed, floor, slowest, j, gamma, zeta))
                if coupled >= limit:
                    return coupled
        return max(best + end, coupled)
