"""The configurations of plans whose stages and replicas differ, one per symmetry class.

A configuration fixes the number of stages, the pipeline micro-batch M and, per stage, its
tp and its replicas as (node, share) pairs (``formulations/uneven-search.md``).  Everything
else of a plan (the layer partition, the training settings) is searched on top of it
(:mod:`.uneven`).  Two symmetries leave every cost term unchanged (eq. U1-U4 read a replica
only through its node and share, and a stage only through the set of them): the order of a
stage's replicas, and a permutation of identical nodes (same type, size and links); each
configuration is listed once per class of both.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterator

from ..model.classes import class_of_node
from ..model.instance import idle_level

Replicas = tuple[tuple[int, int], ...]  # (node, share) per replica, sorted
WORK_PER_CONFIGURATION = 200  # multisets the listing may look at per configuration it may return


@dataclass(frozen=True)
class Configuration:
    """Stages' tp and replicas (node, share) in a pipeline of M samples per micro-batch."""

    M: int
    tps: tuple[int, ...]
    replicas: tuple[Replicas, ...]

    @property
    def pp(self) -> int:
        return len(self.tps)

    @property
    def uniform(self) -> bool:
        """Whether the plans of this configuration are uniform (one tp, one dp, equal shares)."""
        shares = {b for stage in self.replicas for _, b in stage}
        return len(set(self.tps)) == 1 and len({len(r) for r in self.replicas}) == 1 and len(shares) == 1

    def stages(self, instance) -> tuple[tuple[tuple[int, ...], ...], ...]:
        """Device ids per stage and replica: each node's devices handed out in order."""
        used = [0] * len(instance.nodes)
        out = []
        for tp, stage in zip(self.tps, self.replicas):
            groups = []
            for node, _ in stage:
                first = instance.node_first_device[node] + used[node]
                groups.append(tuple(range(first, first + tp)))
                used[node] += tp
            out.append(tuple(groups))
        return tuple(out)

    def plan_doc(self, instance) -> dict:
        """The plan fields this configuration fixes (the partition and settings are added)."""
        return {"tp": list(self.tps), "dp": [len(r) for r in self.replicas], "pp": self.pp,
                "shares": [[b for _, b in stage] for stage in self.replicas],
                "stages": [[list(g) for g in stage] for stage in self.stages(instance)]}


def _compositions(total: int, parts: int, most: int) -> Iterator[tuple[int, ...]]:
    """Non-increasing tuples of ``parts`` integers in [1, most] summing to ``total``."""
    if parts == 0:
        if total == 0:
            yield ()
        return
    for first in range(min(most, total - parts + 1), 0, -1):
        for rest in _compositions(total - first, parts - 1, first):
            yield (first,) + rest


class _TooMany(Exception):
    """The listing went past its work budget."""


class _Budget:
    """Steps of the listing (every multiset looked at) left before it gives up."""

    def __init__(self, steps: int):
        self.left = steps

    def spend(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise _TooMany


def _stage_choices(nodes_free: list[int], tp: int, dp: int, M: int, most: int, budget: _Budget) -> Iterator[Replicas]:
    """Every multiset of dp (node, share) pairs with shares summing to M, each at most ``most``,
    and at most the node's free devices used on each node."""
    top = min(most, M - dp + 1)
    items = [(j, b) for j in range(len(nodes_free)) if nodes_free[j] >= tp for b in range(1, top + 1)]
    for combo in itertools.combinations_with_replacement(items, dp):
        budget.spend()
        if sum(b for _, b in combo) != M:
            continue
        per_node: dict[int, int] = {}
        for j, _ in combo:
            per_node[j] = per_node.get(j, 0) + tp
        if all(nodes_free[j] >= used for j, used in per_node.items()):
            yield combo


def _key(instance, classes: list[int], conf: Configuration) -> tuple:
    """The configuration up to a permutation of identical nodes."""
    sig = [tuple(tuple(sorted(b for j, b in stage if j == node)) for stage in conf.replicas)
           for node in range(len(instance.nodes))]
    per_class: dict[int, list] = {}
    for node, c in enumerate(classes):
        per_class.setdefault(c, []).append(sig[node])
    return conf.M, conf.tps, tuple(sorted((c, tuple(sorted(v))) for c, v in per_class.items()))


def _idle_ok(instance, level: str, used: list[int], classes: list[int]) -> bool:
    """Whether the devices left idle are allowed by ``search.idle``."""
    full = [used[j] == n.devices for j, n in enumerate(instance.nodes)]
    if level == "none":
        return all(full)
    if level == "nodes":
        return all(f or used[j] == 0 for j, f in enumerate(full))
    if level == "classes":
        members: dict[int, list[int]] = {}
        for j, c in enumerate(classes):
            members.setdefault(c, []).append(j)
        return all(all(full[j] for j in js) or not any(used[j] for j in js) for js in members.values())
    return True


def configurations(instance, *, limit: int) -> tuple[list[Configuration], bool]:
    """Every non-uniform configuration of the instance's search section, one per symmetry class,
    and whether that is all of them (False once more than ``limit`` were found, or once the
    listing looked at more than WORK_PER_CONFIGURATION * ``limit`` multisets of replicas).

    Stages: 1 to min(max_pp, layers, devices); tp per stage from ``search.tp``; M over the
    divisors of the global batch; shares at most the largest of ``search.micro_batches``."""
    space, batch = instance.search, instance.training.global_batch
    level = idle_level(space.idle)
    classes = class_of_node(instance)
    most = max(space.micro_batches)
    seen: set = set()
    out: list[Configuration] = []
    budget = _Budget(WORK_PER_CONFIGURATION * limit)
    try:
        for pp in range(1, min(space.max_pp, instance.num_layers, instance.num_devices) + 1):
            for M in (m for m in range(1, batch + 1) if batch % m == 0):
                for tps in itertools.product(space.tp, repeat=pp):
                    for conf in _walk(instance, tps, M, most, budget):
                        if conf.uniform or not _idle_ok(instance, level, _used(instance, conf), classes):
                            continue
                        key = _key(instance, classes, conf)
                        if key in seen:
                            continue
                        seen.add(key)
                        out.append(conf)
                        if len(out) > limit:
                            return out, False
    except _TooMany:
        return out, False
    return out, True


def _used(instance, conf: Configuration) -> list[int]:
    used = [0] * len(instance.nodes)
    for tp, stage in zip(conf.tps, conf.replicas):
        for j, _ in stage:
            used[j] += tp
    return used


def _walk(instance, tps: tuple[int, ...], M: int, most: int, budget: _Budget) -> Iterator[Configuration]:
    """Every configuration of these stage tps (before the symmetry classes are taken)."""
    free0 = [n.devices for n in instance.nodes]

    def rec(s: int, free: list[int], chosen: tuple) -> Iterator[Configuration]:
        if s == len(tps):
            yield Configuration(M, tps, chosen)
            return
        for dp in range(1, min(M, sum(free) // tps[s]) + 1):
            for stage in _stage_choices(free, tps[s], dp, M, most, budget):
                left = list(free)
                for j, _ in stage:
                    left[j] -= tps[s]
                yield from rec(s + 1, left, chosen + (stage,))

    yield from rec(0, free0, ())
