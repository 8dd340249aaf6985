"""The class-stage space: a narrower space of plans whose stages differ, searched exactly at scale.

Where the whole uneven space (:mod:`.uneven_space`) is too large to list, the search narrows it
to the *class-stage* space R (``formulations/uneven-search.md``, S6): every stage sits on the
nodes of one node class, the stages of one class form one block with one tp and dp (its own per
class) and even shares M / dp, each block takes its class's tensor-parallel groups in node order,
and the blocks follow each other in any order.  This module holds the space (its blocks, the
configuration of an order of blocks, the neighbours of a uniform plan); :mod:`.class_bounds`
bounds a configuration's plans (S7-S14, S16), :mod:`.class_reach` drops the micro-batches at which none
fits (S15) and :mod:`.class_walk` lists the configurations best bound first.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from ..model.classes import node_classes
from ..model.engines import engine_of
from ..model.instance import idle_level
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


def zero_stages(instance) -> list[int]:
    """The ZeRO stages of ``search.zero_stages`` a configuration of R may take: at most 2 (U5), and,
    every configuration having two blocks (p >= 2), at most what the engine runs with pp > 1."""
    most = min(2, engine_of(instance).sharded_zero_with_pipeline)
    return [z for z in instance.search.zero_stages if z <= most]


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
