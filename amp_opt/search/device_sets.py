"""The sets of devices a plan may use, up to symmetry, and the bound that rules one out.

A plan may leave devices idle (``search.idle``): slow or small GPUs that only drag the
pipeline or cannot hold a stage, or devices beyond what the batch divides.  Every set of
devices is a sub-instance of its own, searched over the plans that use all of it; identical
devices of a node and identical nodes of a class are interchangeable, so each set is taken
once (``formulations/exactness.md``, X1-X4).  :func:`throughput_bound` (eq. B6) says what no
plan on a set beats.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np

from ..errors import InputError
from ..model.candidates import MAX_CHUNKINGS, interleaving_narrowed
from ..model.classes import node_classes
from ..model.instance import IDLE_SPACES, idle_level
from ..model.plan import Plan

WITHIN = {"nodes": "plans on whole nodes", "classes": "plans on whole node classes",
          "none": "plans that use every device"}  # what a narrower space leaves in, for "optimal within ..."
# Sets of devices searched at most, each a search of its own (cut off by B6, or run): past this
# the space narrows to the next of IDLE_SPACES and the result says so ("optimal within ...").
# 512: the paper's 16-GPU cluster (4 nodes of 4 GPUs, tp 1, 2, 4) has 174 sets and is solved in
# about 1.5 s (benchmarks/results/paper_timing.md); two classes of 4 nodes of 8 GPUs have 245,024.
MAX_SETS = 512


@dataclasses.dataclass(frozen=True)
class DeviceSet:
    """Devices a plan may use, as an instance of their own: per node class, how many of
    each of its nodes' devices (``key[c]``, non-increasing over the class's nodes in order)."""

    key: tuple[tuple[int, ...], ...]
    instance: object  # the instance of these devices (a partly used node keeps its first ones)
    devices: tuple[int, ...]  # global id of every device of the sub-instance
    rate: float | None  # USD per second of all its devices, None without prices

    @property
    def classes(self) -> tuple[int, ...]:
        """The node classes it uses (a device of each, at least)."""
        return tuple(c for c, counts in enumerate(self.key) if any(counts))

    def to_global(self, plan: Plan) -> Plan:
        """The plan with the sub-instance's device ids turned into the whole cluster's."""
        stages = tuple(tuple(tuple(self.devices[d] for d in group) for group in stage) for stage in plan.stages)
        return dataclasses.replace(plan, stages=stages)


def _node_counts(instance, cls, space: str) -> list[int]:
    """The device counts one node of ``cls`` may give a plan under ``space`` (0: idle): every
    count some tensor-parallel degree of the search divides (a plan's groups are whole)."""
    g = cls.devices
    if space == "devices":
        return [u for u in range(g, -1, -1) if u == 0 or any(u % tp == 0 for tp in instance.search.tp)]
    return [g, 0] if space == "nodes" else [g]


def _keys(instance, space: str):
    """Every sub-cluster key of ``space``, the whole cluster first (a generator)."""
    classes = node_classes(instance)
    if space == "classes":
        for r in range(len(classes), 0, -1):
            for chosen in itertools.combinations(range(len(classes)), r):
                yield tuple((c.devices,) * len(c.nodes) if c.index in chosen else (0,) * len(c.nodes) for c in classes)
        return
    per_class = [list(itertools.combinations_with_replacement(_node_counts(instance, c, space), len(c.nodes)))
                 for c in classes]
    whole = tuple((c.devices,) * len(c.nodes) for c in classes)
    yield whole  # always, even when no tp divides its nodes: its search says why nothing fits
    tps = instance.search.tp
    for key in itertools.product(*per_class):
        used = [u for counts in key for u in counts if u]
        if key != whole and used and any(all(u % tp == 0 for u in used) for tp in tps):
            yield key


def count_device_sets(instance, space: str) -> int:
    """How many sub-clusters ``space`` holds (at most: keys with no common tp are dropped later)."""
    classes = node_classes(instance)
    if space == "none":
        return 1
    if space == "classes":
        return 2 ** len(classes) - 1
    return math.prod(math.comb(len(c.nodes) + len(_node_counts(instance, c, space)) - 1, len(c.nodes))
                     for c in classes) - 1


def device_sets(instance, model) -> tuple[list[DeviceSet], str | None]:
    """The sub-clusters a plan may use, the whole cluster first, and what the search leaves out:
    None when every device subset the evaluator accepts is searched, else a phrase for "optimal
    within ..." (the instance narrowed ``search.idle``, or its space held more than MAX_SETS).
    The others come by decreasing peak FLOP/s (an order only: the cutoffs keep the search exact)."""
    asked = space = idle_level(instance.search.idle) if model.idle else "none"
    while count_device_sets(instance, space) > MAX_SETS:
        space = IDLE_SPACES[IDLE_SPACES.index(space) + 1]
    keys = list(_keys(instance, space))
    peak = {c.index: instance.device_types[c.device_type].peak_flops or 0.0 for c in node_classes(instance)}
    keys = keys[:1] + sorted(keys[1:], key=lambda k: (-sum(peak[c] * sum(u) for c, u in enumerate(k)), k))
    parts = []
    if not model.idle and idle_level(instance.search.idle) != "none":
        parts.append(f"{WITHIN['none']} (the {model.name} cost model prices every device of the cluster)")
    elif space != "devices" and asked != space:
        count = count_device_sets(instance, asked)
        parts.append(f"{WITHIN[space]} (search.idle {asked!r} holds {count:,}" if count < 10**9 else
                     f"{WITHIN[space]} (search.idle {asked!r} holds about {count:.1e}")
        parts[-1] += f" sets of devices, more than {MAX_SETS})"
    elif space != "devices":
        parts.append(f"{WITHIN[space]} (search.idle {asked!r})")
    if instance.search.tp_across_nodes and len(instance.nodes) > 1:
        parts.append("plans whose tensor-parallel groups sit inside one node (search.tp_across_nodes: the "
                     "search does not place a group across nodes yet)")
    if interleaving_narrowed(instance, model):
        parts.append(f"plans whose interleaved chunks are the engine's even split (more than {MAX_CHUNKINGS} "
                     "chunkings of the layers)")
    return [device_set(instance, key) for key in keys], "; ".join(parts) or None


def device_set(instance, key) -> DeviceSet:
    """The sub-cluster of a key (per node class, each node's device count, non-increasing): its
    nodes keep their first devices (X3); the searches over device sets and P1's splits use it."""
    counts = {j: u for c, cls in zip(key, node_classes(instance)) for j, u in zip(cls.nodes, c)}
    nodes = [j for j in range(len(instance.nodes)) if counts[j]]
    devices = tuple(instance.node_first_device[j] + q for j in nodes for q in range(counts[j]))
    whole = len(devices) == instance.num_devices
    sub = instance if whole else dataclasses.replace(
        instance, nodes=tuple(dataclasses.replace(instance.nodes[j], devices=counts[j]) for j in nodes))
    prices = [instance.device_types[instance.nodes[j].device_type].price_per_hour for j in nodes]
    rate = None if any(p is None for p in prices) else sum(p * counts[j] for p, j in zip(prices, nodes)) / 3600.0
    return DeviceSet(key, sub, devices, rate)


def throughput_bound(instance, tables) -> dict:
    """A bound on the iteration time when every device is busy all the time (eq. B6 of
    ``formulations/mip.md``).  With d_t(l) = min over tp and micro-batch b of tp * t(l, t, tp, b) / b
    (device-seconds per sample of layer l on a device of class t; every tp of the search that fits
    a node of the class, since a partly used node may take one its whole node does not divide;
    recomputation and context parallelism only add), a reference r(l) = min_t d_t(l) and
    rho_t = min_l d_t(l) / r(l), a set of devices S needs ``global_batch * sum_l r(l) /
    sum_{d in S} 1 / rho_t(d)`` seconds at least: a device of class t does at most T / rho_t
    reference-seconds of work in time T.  Returned as ``{"work": ..., c: 1 / rho_c}`` per class
    (reference-seconds per second of one device); ``{}`` when no class can be priced."""
    B = instance.training.global_batch
    per_class: dict[int, np.ndarray] = {}
    for c in node_classes(instance):
        best = None
        for tp in instance.search.tp:
            if tp > c.devices:
                continue
            for b in instance.search.micro_batches:
                try:
                    seconds = tables.layer_times(c.device_type, c.intra, tp, b, latency=c.intra_latency).seconds
                except InputError:
                    continue
                d = seconds * tp / b
                best = d if best is None else np.minimum(best, d)
        if best is not None:
            per_class[c.index] = best
    if not per_class:
        return {}
    ref = np.min(list(per_class.values()), axis=0)
    safe = np.where(ref > 0, ref, 1.0)
    out: dict = {"work": B * float(ref.sum())}
    for c in node_classes(instance):
        if c.index in per_class:
            ratio = np.where(ref > 0, per_class[c.index] / safe, np.inf)
            rho = float(ratio.min()) if np.isfinite(ratio).any() else 1.0
            out[c.index] = 1.0 / rho if rho > 0 else math.inf
    return out


def set_bound(part: DeviceSet, shares: dict) -> float:
    """Seconds per iteration no plan on ``part``'s devices beats (:func:`throughput_bound`)."""
    if not shares:
        return 0.0
    speed = sum(shares.get(c, 0.0) * sum(counts) for c, counts in enumerate(part.key))
    return shares["work"] / speed if speed > 0 else math.inf
