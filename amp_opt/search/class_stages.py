"""The class-stage space: a narrower space of plans whose stages differ, searched exactly at scale.

Where the whole uneven space (:mod:`.uneven_space`) is too large to list, the search narrows it
to the *class-stage* space R (``formulations/uneven-search.md``, S6): every stage sits on the
nodes of one node class, the stages of one class form one block with one tp and dp (its own per
class) and even shares M / dp, each block takes its class's tensor-parallel groups in node order,
and the blocks follow each other in any order.  Per configuration a lower bound (S7:
:func:`bound`) on every plan of it, whatever its partition and setting, lets the search visit
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


def ranked(instance, bounds: Bounds):
    """Every non-uniform configuration of R as (key, M, blocks in stage order), in non-decreasing
    key, lazily; the key (S7, the capacity form) is at most the iteration seconds of every plan of
    that configuration and of every one listed after it.  A combination of blocks that is no
    configuration of R yields (key, M, None), so that the caller can stop (key, clock) between any two."""
    batch = instance.training.global_batch
    top = depth(instance)
    heap, per_m = [], {}
    for M in (m for m in range(1, batch + 1) if batch % m == 0):
        options = blocks(instance, M)
        if not all(options):
            continue
        ref = np.min([bounds.times(b)[0] for opts in options for b in opts if b is not None] or [np.zeros(1)], axis=0)
        least = pipeline_weights(batch // M, top, 1, bounds.schedule).least
        caps = [[0.0 if b is None else b.stages * bounds.speed(b, ref) for b in opts] for opts in options]
        order = [sorted(range(len(o)), key=lambda i, c=c: (-c[i], i)) for o, c in zip(options, caps)]
        per_m[M] = (options, caps, order, least, float(ref.sum()))
        heapq.heappush(heap, (_key(per_m[M], (0,) * len(options)), M, (0,) * len(options), 0))
    while heap:
        key, M, idx, last = heapq.heappop(heap)
        options, caps, order, least, _ = per_m[M]
        for i in range(last, len(idx)):
            if idx[i] + 1 < len(order[i]):
                nxt = idx[:i] + (idx[i] + 1,) + idx[i + 1:]
                heapq.heappush(heap, (_key(per_m[M], nxt), M, nxt, i))
        used = tuple(b for b in (options[c][order[c][j]] for c, j in enumerate(idx)) if b is not None)
        if not used or sum(b.stages for b in used) > top or len({(b.tp, b.dp) for b in used}) == 1:
            yield key, M, None  # no stage, too many, or a uniform plan: none, but the caller may stop here
            continue
        for blocks_in_order in _orders(used):
            yield key, M, blocks_in_order


def _key(entry, idx) -> float:
    """least * W_ref / (total capacity) + W_ref: S7 with a reference shared by every block of M."""
    _, caps, order, least, w_ref = entry
    speed = sum(caps[c][order[c][j]] for c, j in enumerate(idx))
    return INF if speed <= 0 else least * w_ref / speed + w_ref


class Bounds:
    """Lower bounds (S7) on the iteration seconds of every plan of an R configuration."""

    def __init__(self, instance, tables, schedule: str):
        self.instance, self.tables, self.schedule = instance, tables, schedule
        self.classes = node_classes(instance)
        self._times: dict = {}

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

    def speed(self, b: Block, ref: np.ndarray) -> float:
        """1 / alpha: the least ratio of the block's layer seconds to the reference's, inverted
        (unbounded where some layer costs nothing on the block but something on the reference)."""
        t = self.times(b)[0]
        pos = ref > 0
        if not pos.any():
            return INF
        alpha = float((t[pos] / ref[pos]).min())
        return INF if alpha <= 0 else 1.0 / alpha

    def __call__(self, M: int, order: tuple[Block, ...]) -> float:
        """least * W_ref / sum_s 1/alpha_s + fill * (sum_l min_s t_s(l) + sum_s step_s), the largest
        over the blocks taken as reference (``formulations/uneven-search.md``, S7)."""
        p = sum(b.stages for b in order)
        pipe = pipeline_weights(self.instance.training.global_batch // M, p, 1, self.schedule)
        rows = [self.times(b) for b in order]
        t = np.stack([r[0] for r in rows])
        fastest = t.min(axis=0).sum() + sum(b.stages * r[1] for b, r in zip(order, rows))
        best_x = 0.0
        for ref in t:
            pos = ref > 0
            if not pos.any():
                continue
            alpha = (t[:, pos] / ref[pos]).min(axis=1)
            if (alpha <= 0).any():
                continue
            speed = sum(b.stages / a for b, a in zip(order, alpha))
            best_x = max(best_x, float(ref.sum()) / speed)
        return pipe.least * best_x + pipe.fill * float(fastest)


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
