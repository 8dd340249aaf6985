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
        per_m[M] = _Walk(options, _references(bounds, options), pipe.least, pipe.fill, top)
        start = (0,) * len(options)
        heapq.heappush(heap, (per_m[M].key(start, 0), M, start, 0))
    while heap:
        key, M, idx, last = heapq.heappop(heap)
        walk = per_m[M]
        for i in range(last, len(idx)):
            if idx[i] + 1 < len(walk.order[i]):
                nxt = idx[:i] + (idx[i] + 1,) + idx[i + 1:]
                nxt_key = walk.key(nxt, i)
                if nxt_key < limit():  # INF: every combination it leads to has too many stages
                    heapq.heappush(heap, (nxt_key, M, nxt, i))
        used = tuple(b for b in (walk.options[c][walk.order[c][j]] for c, j in enumerate(idx)) if b is not None)
        if not used or sum(b.stages for b in used) > top or len({(b.tp, b.dp) for b in used}) == 1:
            yield key, M, None  # no stage, too many, or a uniform plan: none, but the caller may stop here
            continue
        for blocks_in_order in _orders(used):
            yield key, M, blocks_in_order


def _references(bounds: Bounds, options) -> list[tuple[list, float]]:
    """S7's references for one M's walk, each as (per class, per option its group or None; W_r):
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
            out.append((groups, float(ref.sum())))
    return out


class _Walk:
    """One M's share of the walk: per class its options (None or a block) in the order the heap
    takes them (capacity k / alpha under the first reference first) and, per reference of S7
    (:func:`_references`), per class, per position, per stage budget K, the largest capacity and
    least alpha and fixed seconds of the class's options from there on with at most K stages
    (``tails``), and their fewest stages (``fewest``)."""

    def __init__(self, options, references, least: float, fill: float, top: int):
        self.options, self.least, self.fill, self.top = options, least, fill, top
        first = references[0][0]
        self.order = [sorted(range(len(o)), key=lambda i, g=g: (-(0.0 if g[i] is None else g[i][1]), i))
                      for o, g in zip(options, first)]
        self.fewest = []
        for c, order in enumerate(self.order):
            fewest, least_k = [0] * len(order), INF
            for pos in range(len(order) - 1, -1, -1):
                b = options[c][order[pos]]
                least_k = min(least_k, 0 if b is None else b.stages)
                fewest[pos] = least_k
            self.fewest.append(fewest)
        self.references = [(groups, work, self._tails(groups)) for groups, work in references]

    def _tails(self, groups) -> list[np.ndarray]:
        """Per class an array [position, K, (capacity, alpha, fixed)] over its options from each
        position on with at most K stages (0, INF, INF where none)."""
        tails = []
        for c, order in enumerate(self.order):
            tail = np.empty((len(order), self.top + 1, 3))
            row = np.array([(0.0, INF, INF)] * (self.top + 1))
            for pos in range(len(order) - 1, -1, -1):
                b, g = self.options[c][order[pos]], groups[c][order[pos]]
                k = 0 if b is None else b.stages
                cap, alpha, fixed = (0.0, INF, 0.0) if g is None else (g[1], g[0], g[3])
                if k <= self.top:
                    row[k:, 0] = np.maximum(row[k:, 0], cap)
                    row[k:, 1] = np.minimum(row[k:, 1], alpha)
                    row[k:, 2] = np.minimum(row[k:, 2], fixed)
                tail[pos] = row
            tails.append(tail)
        return tails

    def key(self, idx, last: int) -> float:
        """The largest over the references of S7's program relaxed over every combination this
        heap entry leads to: a class before ``last`` keeps its option's group; a later one may
        still take any option from its position on that fits the stages the others leave it, so it
        gets the largest capacity, least alpha and least fixed seconds of those, and no step
        seconds in its capacity.  INF where no combination it leads to has few enough stages."""
        kept = [self.order[c][idx[c]] for c in range(last)]
        left = self.top - sum(0 if self.options[c][i] is None else self.options[c][i].stages for c, i in enumerate(kept))
        left -= sum(self.fewest[c][idx[c]] for c in range(last, len(idx)))
        if left < 0:
            return INF
        best = 0.0
        for n, (groups, work, tails) in enumerate(self.references):
            relaxed = [groups[c][i] for c, i in enumerate(kept) if groups[c][i] is not None]
            for c in range(last, len(idx)):
                cap, alpha, fixed = tails[c][idx[c], min(self.top, left + self.fewest[c][idx[c]])].tolist()
                if fixed == INF:
                    return INF  # no option left to this class fits
                if cap > 0:
                    relaxed.append((alpha, cap, 0.0, fixed))
            if not relaxed:
                return INF
            floor = work if n == 0 else 0.0  # F >= W_r for the least over every block option only
            best = max(best, balanced(self.least, self.fill, work, relaxed, floor))
        return best


class Bounds:
    """Lower bounds (S7) on the iteration seconds of every plan of an R configuration."""

    def __init__(self, instance, tables, schedule: str):
        self.instance, self.tables, self.schedule = instance, tables, schedule
        self.classes = node_classes(instance)
        self._times: dict = {}
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
        """The largest over the blocks taken as reference of S7's program: the least over the
        slowest stage's seconds E of least * E + fill * (the least sum of the stages' seconds with
        none above E) (``formulations/uneven-search.md``, S7).  It does not depend on the order
        of the blocks, which the walk yields one after another: the last combination is kept."""
        combination = (M, frozenset(order))
        if self._last[0] != combination:
            self._last = (combination, self._program(M, order))
        return self._last[1]

    def _program(self, M: int, order: tuple[Block, ...]) -> float:
        p = sum(b.stages for b in order)
        pipe = pipeline_weights(self.instance.training.global_batch // M, p, 1, self.schedule)
        rows = [self.times(b) for b in order]
        t = np.stack([r[0] for r in rows])
        floor = float(t.min(axis=0).sum()) + sum(b.stages * r[1] for b, r in zip(order, rows))
        best = pipe.fill * floor
        for ref in t:
            if not (ref > 0).any():
                continue
            groups = [self.group(b, ref) for b in order]
            if all(g[0] > 0 for g in groups):
                best = max(best, balanced(pipe.least, pipe.fill, float(ref.sum()), groups, floor))
        return best


def balanced(least: float, fill: float, work: float, groups, floor: float) -> float:
    """S7's program: min over E >= every sigma of least * E + fill * max(g(E), floor), where g(E) is
    the fixed seconds plus the least sum of alpha * R over shares R of ``work``, each group holding
    at most capacity * (E - sigma) (``groups``: (alpha, capacity, sigma, fixed) each).  g is
    convex, piecewise linear and non-increasing in E, so the least is at a breakpoint of g or where
    g meets the floor.

    Examples
    --------
    One stage holding 3 s of work, 4 micro-batches (least 3, fill 1): 3 * 3 + 3.

    >>> balanced(3.0, 1.0, 3.0, [(1.0, 1.0, 0.0, 0.0)], 0.0)
    12.0
    """
    groups = sorted(groups)
    fixed = sum(g[3] for g in groups)

    def g(E: float) -> float:
        left, cost = work, fixed
        for alpha, cap, sigma, _ in groups:
            take = min(left, cap * (E - sigma))
            cost, left = cost + alpha * take, left - take
        return cost

    breaks, held, offset = [], 0.0, 0.0  # E_j: the first j groups hold the work exactly
    for _, cap, sigma, _ in groups:
        held, offset = held + cap, offset + cap * sigma
        breaks.append((work + offset) / held if held > 0 else INF)
    low = max(min(breaks), max(g[2] for g in groups))
    points = sorted({low, *(e for e in breaks if low < e < INF)})
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
