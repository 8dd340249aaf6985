"""The class-stage space: a narrower space of plans whose stages differ, searched exactly at scale.

Where the whole uneven space (:mod:`.uneven_space`) is too large to list, the search narrows it
to the *class-stage* space R (``formulations/uneven-search.md``, S6): every stage sits on the
nodes of one node class, the stages of one class form one block with one tp and dp (its own per
class) and even shares M / dp, each block takes its class's tensor-parallel groups in node order,
and the blocks follow each other in any order.  Per configuration a lower bound (S7:
:class:`Bounds`) on every plan of it, whatever its partition and setting, lets the search visit
the configurations best bound first and stop at the incumbent.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

import numpy as np

from ..model.classes import node_classes
from ..model.costs.iteration import pipeline_weights
from ..model.instance import idle_level
from ..model.plan import Candidate
from ..model.ranges import INF
from .uneven_space import Configuration

MAX_STAGES = 32  # stages of a configuration of R at most (pricing one grows as the stages squared)


@dataclass(frozen=True)
class Block:
    """The ``stages`` consecutive stages of node class ``cls``: tp, dp and share each."""

    cls: int
    stages: int
    tp: int
    dp: int
    share: int


def _class_ok(level: str, used: int, per_node: int, nodes: int) -> bool:
    """Whether a class whose first ``used`` devices (in node order, whole groups) are busy leaves
    idle only what ``search.idle`` allows."""
    if level == "none" or level == "classes":
        return used == per_node * nodes or (level == "classes" and used == 0)
    if level == "nodes":
        return used % per_node == 0
    return True


def depth(instance) -> int:
    """The most stages a configuration of R may have."""
    return min(instance.search.max_pp, instance.num_layers, instance.num_devices, MAX_STAGES)


def blocks(instance, M: int) -> list[list[Block | None]]:
    """Per node class, the blocks it may hold in a pipeline of M samples per micro-batch (None:
    the class holds no stage, where ``search.idle`` allows it)."""
    space = instance.search
    level, most = idle_level(space.idle), max(space.micro_batches)
    out = []
    for c in node_classes(instance):
        options: list[Block | None] = [None] if _class_ok(level, 0, c.devices, len(c.nodes)) else []
        for tp in (t for t in space.tp if t <= c.devices):
            per_node = c.devices // tp
            for dp in (d for d in range(1, M + 1) if M % d == 0 and M // d <= most):
                for k in range(1, depth(instance) + 1):
                    groups = k * dp
                    if groups > per_node * len(c.nodes):
                        break
                    used = (groups // per_node) * c.devices + (groups % per_node) * tp
                    if per_node * tp != c.devices and level != "devices":
                        used = -1  # a node keeps devices no group can take
                    if used >= 0 and _class_ok(level, used, c.devices, len(c.nodes)):
                        options.append(Block(c.index, k, tp, dp, M // dp))
        out.append(options)
    return out


def configuration(instance, M: int, order: tuple[Block, ...]) -> Configuration:
    """The configuration of blocks in this order: each stage takes its class's next dp groups of
    tp devices, node by node (a class may appear in several blocks, all of one tp)."""
    classes = node_classes(instance)
    tps, replicas, taken = [], [], {}
    for b in order:
        c = classes[b.cls]
        per_node = c.devices // b.tp
        for _ in range(b.stages):
            first = taken.get(b.cls, 0)
            taken[b.cls] = first + b.dp
            tps.append(b.tp)
            replicas.append(tuple((c.nodes[g // per_node], b.share) for g in range(first, first + b.dp)))
    return Configuration(M, tuple(tps), tuple(replicas))


def _orders(blocks_used: tuple[Block, ...]):
    """Every order of the blocks (one per class, so no two orders are the same configuration)."""
    return itertools.permutations(blocks_used)


def ranked(instance, bounds: Bounds, *, limit=None):
    """Every non-uniform configuration of R as (key, M, blocks in stage order), in non-decreasing
    key, lazily; the key (S7's program over every combination the heap entry leads to) is at most
    the iteration seconds of every plan of that configuration and of every one listed after it.  A
    combination of blocks that is no configuration of R yields (key, M, None), so that the caller
    can stop (key, clock) between any two.  ``limit()``: the caller's incumbent, which only falls;
    entries whose key is at or above it are not kept (the caller stops there anyway), which keeps
    the heap small."""
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
        per_m[M] = _Walk(options, _references(bounds, options), bounds, pipe.least, pipe.fill, top)
        start = (0,) * len(options)
        heapq.heappush(heap, (per_m[M].key(start, 0), M, start, 0))
    while heap:
        key, M, idx, last = heapq.heappop(heap)
        walk = per_m[M]
        for i in range(last, len(idx)):
            if idx[i] + 1 < len(walk.order[i]):
                nxt = idx[:i] + (idx[i] + 1,) + idx[i + 1:]
                nxt_key = max(walk.key(nxt, i), key)  # its combinations are some of this entry's
                if nxt_key < limit():  # INF: every combination it leads to has too many stages
                    heapq.heappush(heap, (nxt_key, M, nxt, i))
        used = tuple(b for b in (walk.options[c][walk.order[c][j]] for c, j in enumerate(idx)) if b is not None)
        if not used or sum(b.stages for b in used) > top or len({(b.tp, b.dp) for b in used}) == 1:
            yield key, M, None  # no stage, too many, or a uniform plan: none, but the caller may stop here
            continue
        for blocks_in_order in _orders(used):
            yield key, M, blocks_in_order


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


def _references(bounds: Bounds, options) -> list[tuple[list, float, np.ndarray]]:
    """S7's references for one M's walk, each as (per class, per option its group or None; W_r;
    :func:`heaviest` of it):
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
                row.append(None if b is None else bounds.group(b, ref, alpha=alphas[b.cls, b.tp, b.share]))
            groups.append(row)
        if all(g is None or g[0] > 0 for row in groups for g in row):
            out.append((groups, float(ref.sum()), heaviest(ref)))
    return out


class _Walk:
    """One M's share of the walk: per class its options (None or a block) in the order the heap
    takes them (capacity k / alpha under the first reference first) and, per reference of S7
    (:func:`_references`), per class, per position, per stage budget K, the largest capacity and
    least alpha and fixed seconds of the class's options from there on with at most K stages
    (``tails``, and ``plain`` for the columns no reference changes: fixed seconds and the largest
    end capacity of S8), per class and
    position the least seconds of each layer over the options from there on (``reach``), and the
    options' fewest stages (``fewest``)."""

    def __init__(self, options, references, bounds: Bounds, least: float, fill: float, top: int):
        self.options, self.bounds, self.spread = options, bounds, bounds.spread
        self.least, self.fill, self.top = least, fill, top
        self.ends = [[0.0 if b is None else bounds.end_capacity(b) for b in opts] for opts in options]
        first = references[0][0]
        self.order = [sorted(range(len(o)), key=lambda i, g=g: (-(0.0 if g[i] is None else g[i][1]), i))
                      for o, g in zip(options, first)]
        self.fewest, self.reach = [], []
        L = bounds.instance.num_layers
        for c, order in enumerate(self.order):
            fewest, least_k = [0] * len(order), INF
            reach, least_t = np.empty((len(order), L)), np.full(L, INF)
            for pos in range(len(order) - 1, -1, -1):
                b = options[c][order[pos]]
                least_k = min(least_k, 0 if b is None else b.stages)
                fewest[pos] = least_k
                if b is not None:
                    least_t = np.minimum(least_t, bounds.times(b)[0])
                reach[pos] = least_t
            self.fewest.append(fewest)
            self.reach.append(reach)
        self.references = [(groups, work, tops, self._tails(groups)) for groups, work, tops in references]
        self.plain = self._tails(None)  # the columns that do not depend on the reference

    def _tails(self, groups) -> list[np.ndarray]:
        """Per class an array [position, K, (capacity, alpha, fixed, end capacity)] over its options
        from each position on with at most K stages (0, INF, INF, 0 where none)."""
        tails = []
        for c, order in enumerate(self.order):
            tail = np.empty((len(order), self.top + 1, 4))
            row = np.array([(0.0, INF, INF, 0.0)] * (self.top + 1))
            for pos in range(len(order) - 1, -1, -1):
                i = order[pos]
                b = self.options[c][i]
                g = None if groups is None else groups[c][i]
                k = 0 if b is None else b.stages
                cap, alpha = (0.0, INF) if g is None else (g[1], g[0])
                fixed = 0.0 if b is None else b.stages * self.bounds.times(b)[1]  # k sigma, whatever the reference
                if k <= self.top:
                    row[k:, 0] = np.maximum(row[k:, 0], cap)
                    row[k:, 1] = np.minimum(row[k:, 1], alpha)
                    row[k:, 2] = np.minimum(row[k:, 2], fixed)
                    row[k:, 3] = np.maximum(row[k:, 3], self.ends[c][i])
                tail[pos] = row
            tails.append(tail)
        return tails

    def _floor(self, idx, kept: list, fixed: float) -> tuple[float, float]:
        """S7's floor F over every combination an entry leads to, and the least E: per layer q, the
        least seconds of the kept blocks and of the options left to the later classes; F is their
        sum plus each kept block's add-on (:meth:`Bounds.added`) and the later classes' least fixed
        seconds ``fixed``, and E is at least the largest q (the stage holding that layer)."""
        blocks = [self.options[c][i] for c, i in enumerate(kept) if self.options[c][i] is not None]
        least = np.min([self.bounds.times(b)[0] for b in blocks]
                       + [self.reach[c][idx[c]] for c in range(len(kept), len(idx))], axis=0)
        if np.isinf(least).any():
            return INF, INF  # a layer no option left can run: the entry leads to no configuration
        return float(least.sum()) + sum(self.bounds.added(b, least) for b in blocks) + fixed, float(least.max())

    def key(self, idx, last: int) -> float:
        """The largest over the references of S7's program relaxed over every combination this
        heap entry leads to: a class before ``last`` keeps its option's group; a later one may
        still take any option from its position on that fits the stages the others leave it, so it
        gets the largest capacity, least alpha and least fixed seconds of those, and no step
        seconds in its capacity; the floor F of :meth:`_floor`; plus S8's end of the iteration with
        each later class at the largest end capacity of those options.  INF where no combination it
        leads to has few enough stages."""
        kept = [self.order[c][idx[c]] for c in range(last)]
        left = self.top - sum(0 if self.options[c][i] is None else self.options[c][i].stages for c, i in enumerate(kept))
        left -= sum(self.fewest[c][idx[c]] for c in range(last, len(idx)))
        if left < 0:
            return INF
        budget = [min(self.top, left + self.fewest[c][idx[c]]) for c in range(len(idx))]
        ends = sum(self.ends[c][i] for c, i in enumerate(kept))
        ends += sum(float(self.plain[c][idx[c], budget[c], 3]) for c in range(last, len(idx)))
        fewest_p = self.top - left  # stages of every combination the entry leads to, at least
        L = len(self.reach[0][0])
        later_fixed = sum(float(self.plain[c][idx[c], budget[c], 2]) for c in range(last, len(idx)))
        if later_fixed == INF:
            return INF  # no option left to some class fits
        floor, slowest = self._floor(idx, kept, later_fixed)  # neither depends on the reference
        if floor == INF:
            return INF
        best = 0.0
        for groups, work, tops, tails in self.references:
            relaxed = [(*groups[c][i], tops[min(L, L - fewest_p + self.options[c][i].stages)])
                       for c, i in enumerate(kept) if groups[c][i] is not None]
            for c in range(last, len(idx)):
                cap, alpha, fixed, _ = tails[c][idx[c], budget[c]].tolist()
                if fixed == INF:
                    return INF  # no option left to this class fits
                if cap > 0:
                    relaxed.append((alpha, cap, 0.0, fixed))
            if not relaxed:
                return INF
            best = max(best, balanced(self.least, self.fill, work, relaxed, floor, slowest))
        return best + ending(self.spread, ends)


class Bounds:
    """Lower bounds (S7, S8) on the iteration seconds of every plan of an R configuration under a
    cost ``model`` (hetero)."""

    def __init__(self, instance, tables, model):
        self.instance, self.tables, self.model, self.schedule = instance, tables, model, model.schedule
        self.classes = node_classes(instance)
        self.spread = spread(instance, tables)
        self._times: dict = {}
        self._factors: dict = {}
        self._last: tuple = (None, 0.0)

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

    def end_capacity(self, b: Block) -> float:
        """The block's k stages in S8: k * tp / c, c the least seconds per parameter of its first
        stage's end of iteration over the ZeRO stages the search tries (that stage has the
        fastest ring of the block's); INF where c is 0."""
        key = (b.cls, b.tp, b.dp)
        if key not in self._factors:
            first = configuration(self.instance, b.dp * b.share, (Block(b.cls, 1, b.tp, b.dp, b.share),))
            stages = first.stages(self.instance)
            self._factors[key] = min(
                (self.model.stage_costs(self.tables, Candidate(b.tp, b.dp, 1, b.share, zero_stage=z), stages)
                 .least_end_factor(0) for z in self.instance.search.zero_stages if z <= 2), default=0.0)
        factor = self._factors[key]
        return b.stages * b.tp / factor if factor > 0 else INF

    def added(self, b: Block, ref: np.ndarray) -> float:
        """What the block's k stages add to S7's floor F over the reference's seconds of their layers
        (``ref`` at most the block's seconds on every layer): each stage holds a layer, so at least
        its step seconds and the least excess of one layer, k (sigma + min_l (t_b(l) - ref(l)))."""
        t, sigma = self.times(b)
        return b.stages * (sigma + max(float((t - ref).min()), 0.0))

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
        """Whether the bound is below ``value``: first with the least E of one layer's stage, and
        only when that is below, with the least E of S7's bottleneck (:func:`bottleneck`)."""
        return self._bounds(M, order, strong=False)[0] < value and self(M, order) < value

    def _bounds(self, M: int, order: tuple[Block, ...], *, strong: bool) -> tuple[float, float]:
        """(the bound without the bottleneck, with it: INF until asked), per combination."""
        combination = (M, frozenset(order))
        if self._last[0] != combination:
            self._last = (combination, (self._program(M, order, strong=False), INF))
        weak, full = self._last[1]
        if strong and full == INF:
            full = max(weak, self._program(M, order, strong=True))
            self._last = (combination, (weak, full))
        return weak, full

    def _program(self, M: int, order: tuple[Block, ...], *, strong: bool) -> float:
        p = sum(b.stages for b in order)
        L = self.instance.num_layers
        pipe = pipeline_weights(self.instance.training.global_batch // M, p, 1, self.schedule)
        rows = [self.times(b) for b in order]
        t = np.stack([r[0] for r in rows])
        least_t = t.min(axis=0)
        floor = float(least_t.sum()) + sum(self.added(b, least_t) for b in order)
        limits = [min(L, L - p + b.stages) for b in order]  # layers a block holds at most
        if strong:
            slowest = bottleneck(t + np.array([[r[1]] for r in rows]), limits)
        else:
            slowest = float(least_t.max()) + min(r[1] for r in rows)  # the stage holding the slowest layer
        best = pipe.fill * floor
        for ref in t:
            if not (ref > 0).any():
                continue
            tops = heaviest(ref)
            groups = [(*self.group(b, ref), tops[n]) for b, n in zip(order, limits)]
            if all(g[0] > 0 for g in groups):
                best = max(best, balanced(pipe.least, pipe.fill, float(ref.sum()), groups, floor, slowest))
        return best + ending(self.spread, sum(self.end_capacity(b) for b in order))


def bottleneck(seconds: np.ndarray, limits) -> float:
    """The least E such that every layer sits on a block (``seconds``: a row per block, its seconds
    per layer with its step seconds) within E, block b taking at most ``limits[b]`` layers: a
    bipartite b-matching, decided by Hall's condition over every set of blocks (a set S must be
    able to take the layers no block outside S can run within E), by bisection over the seconds.
    The stage holding a layer has at least that layer's seconds on its block, so the slowest stage
    has at least E.  Blocks beyond 12 fall back to the largest of each layer's least seconds.

    Examples
    --------
    Two layers, a fast block that holds one and a slow one: the slow block runs one of them.

    >>> bottleneck(np.array([[1.0, 2.0], [3.0, 5.0]]), [1, 2])
    3.0
    """
    C, L = seconds.shape
    if C > 12:
        return float(seconds.min(axis=0).max())
    sets = np.arange(1 << C)
    caps = np.array([sum(limits[b] for b in range(C) if S >> b & 1) for S in sets])
    weights = (1 << np.arange(C))[:, None]

    def fits(E: float) -> bool:
        within = np.bincount(((seconds <= E) * weights).sum(axis=0), minlength=1 << C)
        for b in range(C):  # within[S]: layers whose blocks within E are all in S
            has = (sets >> b & 1) == 1
            within[has] += within[sets[has] ^ (1 << b)]
        return bool((within <= caps).all())

    values = np.unique(seconds)
    lo, hi = int(np.searchsorted(values, seconds.min(axis=0).max())), len(values) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(values[mid]):
            hi = mid
        else:
            lo = mid + 1
    return float(values[lo])


def heaviest(ref: np.ndarray) -> np.ndarray:
    """tops[n]: the sum of the n largest entries of ``ref`` (the most reference seconds n layers
    hold; a block of k stages among p holds at most L - p + k layers, every other stage one), and
    INF from n = L on (all of them: no limit)."""
    tops = np.concatenate([[0.0], np.cumsum(np.sort(ref)[::-1])])
    tops[len(ref):] = INF
    return tops


def spread(instance, tables) -> float:
    """S8's W_X: the least, over the tp degrees of ``search.tp``, of tp * parameters per rank per
    layer, summed, less each tie group's shared tensor for all members but one at the most it holds
    at any of those degrees (times tp): a bound on sum_s tp_s * (parameters per rank of stage s)."""
    sums = [(m, tables.layer_sums(m)) for m in instance.search.tp]
    total = float(np.min([m * s.params for m, s in sums], axis=0).sum())
    for i, (members, _) in enumerate(sums[0][1].ties):
        total -= (len(members) - 1) * max(m * s.ties[i][1] for m, s in sums)
    return max(total, 0.0)


def ending(spread: float, capacity: float) -> float:
    """S8: the least max_s (c_s / tp_s) y_s over y_s >= 0 summing to ``spread`` (``capacity``: the
    sum of tp_s / c_s over the stages), a bound on the slowest stage's end of the iteration.

    Examples
    --------
    >>> ending(6.0, 3.0), ending(6.0, float("inf"))
    (2.0, 0.0)
    """
    return spread / capacity if capacity > 0 else INF


def balanced(least: float, fill: float, work: float, groups, floor: float, slowest: float = 0.0) -> float:
    """S7's program: min over E >= every sigma and >= ``slowest`` of least * E + fill * max(g(E),
    floor), where g(E) is the fixed seconds plus the least sum of alpha * R over shares R of
    ``work``, each group holding at most capacity * (E - sigma) and at most its limit (``groups``:
    (alpha, capacity, sigma, fixed[, limit]) each, no limit when left out).  g is convex,
    piecewise linear and non-increasing in E, so the least is at a kink of g (a group reaching
    its limit, or the first j groups holding the work exactly) or where g meets the floor.

    Examples
    --------
    One stage holding 3 s of work, 4 micro-batches (least 3, fill 1): 3 * 3 + 3.

    >>> balanced(3.0, 1.0, 3.0, [(1.0, 1.0, 0.0, 0.0)], 0.0)
    12.0
    """
    # (alpha, capacity, sigma, fixed, the E at which the group reaches its limit)
    groups = sorted((*g[:4], g[2] + g[4] / g[1] if len(g) > 4 and g[4] < INF and g[1] > 0 else INF) for g in groups)
    fixed = sum(g[3] for g in groups)
    base = max(max(g[2] for g in groups), slowest)
    saturate = sorted({full for *_, full in groups if full < INF})

    def held(E: float, upto: int) -> float:
        return sum(cap * (min(E, full) - sigma) for _, cap, sigma, _, full in groups[:upto])

    def holds_all(upto: int) -> float:
        """The least E >= base at which the first ``upto`` groups hold the work (INF: never):
        held is piecewise linear, with kinks where groups reach their limits."""
        lo = base
        for hi in [e for e in saturate if e > base] + [INF]:
            h_lo = held(lo, upto)
            if h_lo >= work * (1 - 1e-12):
                return lo
            rate = sum(cap for _, cap, _, _, full in groups[:upto] if full > lo)
            if rate > 0 and lo + (work - h_lo) / rate <= hi:
                return lo + (work - h_lo) / rate
            lo = hi
        return INF

    def g(E: float) -> float:
        left, cost = work, fixed
        for alpha, cap, sigma, _, full in groups:
            take = min(left, cap * (min(E, full) - sigma))
            cost, left = cost + alpha * take, left - take
        return cost

    ends = [holds_all(j) for j in range(1, len(groups) + 1)]
    low = ends[-1]  # below it the groups cannot hold the work
    if low == INF:
        return INF
    points = sorted({low, *(e for e in ends + saturate if low < e < INF)})
    values = [g(e) for e in points]
    for (a, ga), (b, gb) in zip(zip(points, values), zip(points[1:], values[1:])):
        if ga >= floor >= gb and ga > gb:  # g meets the floor on this piece, where it is linear
            points.append(a + (b - a) * (ga - floor) / (ga - gb))
            values.append(floor)
    return min(least * e + fill * max(v, floor) for e, v in zip(points, values))


def neighbours(instance, plan) -> list[tuple[int, tuple[Block, ...]]]:
    """Configurations next to a uniform plan, to visit first (a good incumbent early; the
    best-first walk over R still follows, so no guarantee depends on them): the plan's stages in
    its order, each on its own node class, every class's stages with one other split of their
    devices (tp * cp * dp) into tp and dp, at the plan's M, twice it and half it.  Empty when a
    stage of the plan spans two classes."""
    classes = node_classes(instance)
    of_node = {j: c.index for c in classes for j in c.nodes}
    runs: list[list[int]] = []  # [class, stages] per run of consecutive stages on one class
    for stage in plan.stages or ():
        owners = {of_node[int(instance.device_node[d])] for group in stage for d in group}
        if len(owners) != 1:
            return []
        c = owners.pop()
        if runs and runs[-1][0] == c:
            runs[-1][1] += 1
        else:
            runs.append([c, 1])
    used = sorted({c for c, _ in runs})
    width = plan.tp * plan.cp * plan.dp
    space, batch, most = instance.search, instance.training.global_batch, max(instance.search.micro_batches)
    out = []
    for M in (plan.pipeline_micro_batch, 2 * plan.pipeline_micro_batch, plan.pipeline_micro_batch // 2):
        if M < 1 or batch % M:
            continue
        per_class = [[tp for tp in space.tp if width % tp == 0 and tp <= classes[c].devices and M % (width // tp) == 0
                      and M // (width // tp) <= most] for c in used]
        for tps in itertools.product(*per_class):
            tp_of = dict(zip(used, tps))
            order = tuple(Block(c, k, tp_of[c], width // tp_of[c], M // (width // tp_of[c])) for c, k in runs)
            stages = {c: sum(k for d, k in runs if d == c) for c in used}
            fits = all(stages[c] * (width // tp_of[c]) <= (classes[c].devices // tp_of[c]) * len(classes[c].nodes)
                       for c in used)
            if fits and len(set(tps)) > 1:
                out.append((M, order))
    return out
