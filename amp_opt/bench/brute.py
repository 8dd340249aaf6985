"""The ground truth on tiny instances: every raw plan the evaluator accepts, scored by it.

Written apart from the search on purpose: it knows nothing of candidates, node classes,
groupings, bounds or dominance rules.  It walks every tp, cp, dp, pp, virtual-stage count
and micro-batch that the instance's ``search`` section lists (dp and pp over every value the
device count allows), every training setting listed there (sequence parallelism, each
recomputation mode, per-stage modes where the section allows stages to choose, block counts,
ZeRO stages), every partition, and every placement of the plan's tensor-parallel groups on
any subset of the devices (groups that span nodes only where ``search.tp_across_nodes`` puts
them in the space, ``formulations/hetero.md`` H16); it lets :func:`amp_opt.evaluate` reject what the instance or the
engine does not allow, and keeps the best feasible plans.  Its cost grows as n! in the device
count and as the number of partitions in the layer count: it is meant for a handful of
devices and layers (the tests' random instances, ``benchmarks/exactness.py``).

A tensor-parallel group is placed as a set of devices (its devices in increasing order): the
evaluator prices a group by the node it sits on, whatever its ranks' order.
``tests/test_brute.py`` checks that claim on the instances it draws.

On the engine ``"amp_opt"`` it also walks the plans whose stages and replicas differ
(:func:`uneven_plans`): every number of stages, every tp of ``search.tp`` per stage, every dp
per stage that fits the devices, every pipeline micro-batch M dividing the global batch,
every share vector of each stage (dp_s positive integers summing to M, each at most the
largest of ``search.micro_batches``: the bound on the shares), every placement of the
groups, every partition and every setting; such plans are priced with cp 1, no
interleaving and ZeRO at most 2 (the evaluator refuses the others).

:func:`brute_force_pipelines` walks the plans of several pipelines (``formulations/exactness.md``,
X6): every ordered split of the global batch into q positive sample counts and, per pipeline,
every plan above of the instance at that batch, the pipelines on disjoint devices (all of them
with ``search.idle`` "none").  Its cost is the product of the pipelines' plan counts: two or
three single-GPU nodes and a batch of a few samples.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from dataclasses import dataclass

from ..errors import InputError
from ..model.engines import PER_STAGE_MODES, engine_of
from ..model.evaluate import Evaluation, evaluate
from ..model.instance import idle_level
from ..model.plan import parse_plan
from ..model.tables import Tables


@dataclass(frozen=True)
class Best:
    """The best value the brute force found (seconds, or USD per iteration), the plans that
    reach it within ``rel`` and how many plans it scored."""

    value: float
    evaluations: tuple[Evaluation, ...]
    scored: int


def _partitions(layers: int, parts: int):
    for cut in itertools.combinations(range(1, layers), parts - 1):
        yield (0, *cut, layers)


def _placements(devices: int, tp: int, groups: int):
    """Every ordered list of ``groups`` disjoint sets of ``tp`` devices."""
    yield from _sized_placements(devices, (tp,) * groups)


def _sized_placements(devices: int, sizes: tuple[int, ...]):
    """Every ordered list of disjoint sets of devices, the i-th of ``sizes[i]`` devices."""
    def rec(left: tuple[int, ...], k: int):
        if k == len(sizes):
            yield ()
            return
        for group in itertools.combinations(left, sizes[k]):
            rest = tuple(d for d in left if d not in group)
            for tail in rec(rest, k + 1):
                yield (group,) + tail
    yield from rec(tuple(range(devices)), 0)


def _compositions(total: int, parts: int, most: int):
    """Every tuple of ``parts`` integers in [1, most] summing to ``total``."""
    if parts == 1:
        if 1 <= total <= most:
            yield (total,)
        return
    for first in range(1, min(most, total - parts + 1) + 1):
        for rest in _compositions(total - first, parts - 1, most):
            yield (first,) + rest


def _degree_vectors(space, pp: int, devices: int):
    """Every (tp per stage, dp per stage) of ``pp`` stages using at most ``devices`` devices."""
    for tps in itertools.product(space.tp, repeat=pp):
        def rec(s: int, left: int):
            if s == pp:
                yield ()
                return
            for dp in range(1, left // tps[s] + 1):
                for tail in rec(s + 1, left - dp * tps[s]):
                    yield (dp,) + tail
        for dps in rec(0, devices):
            yield tps, dps


def uneven_plans(instance):
    """Every plan document whose stages or replicas differ (per-stage tp or dp, uneven shares)
    that the module docstring lists; with ``search.idle`` false, only those using every device."""
    n_dev, n_layers, batch = instance.num_devices, instance.num_layers, instance.training.global_batch
    space = instance.search
    every = idle_level(space.idle) == "none"
    most = max(space.micro_batches)
    for pp in range(1, min(space.max_pp, n_dev, n_layers) + 1):
        settings = list(_settings(space, pp))
        for tps, dps in _degree_vectors(space, pp, n_dev):
            if every and sum(t * d for t, d in zip(tps, dps)) != n_dev:
                continue
            sizes = tuple(t for t, d in zip(tps, dps) for _ in range(d))
            for M in (m for m in range(1, batch + 1) if batch % m == 0):
                for shares in itertools.product(*(list(_compositions(M, d, most)) for d in dps)):
                    if len(set(tps)) == 1 and len(set(dps)) == 1 and len({b for row in shares for b in row}) == 1:
                        continue  # a uniform plan: raw_plans has it
                    for groups in _sized_placements(n_dev, sizes):
                        it = iter(groups)
                        nested = [[list(next(it)) for _ in range(d)] for d in dps]
                        for partition in _partitions(n_layers, pp):
                            for sp, mode, layers, zero in settings:
                                doc = {"tp": list(tps), "dp": list(dps), "pp": pp, "shares": [list(r) for r in shares],
                                       "partition": list(partition), "stages": nested, "sequence_parallel": sp,
                                       "recompute": mode if isinstance(mode, str) else list(mode), "zero_stage": zero}
                                if layers is not None:
                                    doc["recompute_layers"] = layers
                                yield doc


def _settings(space, pp: int):
    """Every training setting the search section lists: (sequence_parallel, recompute,
    recompute_layers, zero_stage)."""
    modes: list = list(space.recompute)
    if space.per_stage_recompute and pp > 1 and set(PER_STAGE_MODES) <= set(space.recompute):
        modes += [m for m in itertools.product(PER_STAGE_MODES, repeat=pp) if len(set(m)) > 1]
    for sp, mode, zero in itertools.product(space.sequence_parallel, modes, space.zero_stages):
        has_full = "full" in ((mode,) if isinstance(mode, str) else mode)
        for layers in [None] + (list(space.recompute_layers) if has_full else []):
            yield sp, mode, layers, zero


def raw_plans(instance):
    """Every plan document of the instance's search section (the evaluator judges them); with
    ``search.idle`` false, only those that use every device."""
    n_dev, n_layers, batch = instance.num_devices, instance.num_layers, instance.training.global_batch
    space = instance.search
    idle = idle_level(space.idle)
    if idle not in ("devices", "none"):
        raise ValueError(f"the brute force walks every device subset or none: search.idle {space.idle!r}")
    every = idle == "none"  # no device may stay idle
    for tp, cp, v, mb in itertools.product(space.tp, space.cp, space.virtual_stages, space.micro_batches):
        for dp in range(1, n_dev // (tp * cp) + 1):
            if batch % (dp * mb):
                continue
            for pp in range(1, min(space.max_pp, n_dev // (tp * cp * dp)) + 1):
                if pp * v > n_layers or every and tp * cp * dp * pp != n_dev:
                    continue
                settings = list(_settings(space, pp))
                for stages in _placements(n_dev, tp, dp * cp * pp):
                    if not space.tp_across_nodes and any(len({int(instance.device_node[d]) for d in g}) > 1
                                                         for g in stages):
                        continue  # outside the instance's space (search.tp_across_nodes false, hetero.md H16)
                    nested = [[list(g) for g in stages[s * dp * cp:(s + 1) * dp * cp]] for s in range(pp)]
                    for partition in _partitions(n_layers, pp * v):
                        for sp, mode, layers, zero in settings:
                            doc = {"tp": tp, "cp": cp, "dp": dp, "pp": pp, "micro_batch": mb, "virtual_stages": v,
                                   "partition": list(partition), "stages": nested, "sequence_parallel": sp,
                                   "recompute": mode if isinstance(mode, str) else list(mode), "zero_stage": zero}
                            if layers is not None:
                                doc["recompute_layers"] = layers
                            yield doc


def brute_force(instance, *, cost_model="hetero", objective: str = "time", budget: float | None = None,
                rel: float = 1e-9) -> Best | None:
    """The best feasible raw plan of a tiny instance under ``objective`` ("time": seconds per
    iteration, "cost": USD per iteration) and ``budget`` (USD per hour of the used devices);
    None when no raw plan is feasible.

    Examples
    --------
    >>> import amp_opt
    >>> from amp_opt.bench.brute import brute_force
    >>> inst = amp_opt.parse_instance(amp_opt.generate_instance(1, nodes=2, devices_per_node=1, layers=3))
    >>> best = brute_force(inst)
    >>> best is None or best.value > 0
    True
    """
    tables = Tables(instance)
    best, kept, scored = math.inf, [], 0
    docs = raw_plans(instance)
    if engine_of(instance).uneven:
        docs = itertools.chain(docs, uneven_plans(instance))
    for doc in docs:
        try:
            ev = evaluate(instance, parse_plan(doc), cost_model, tables=tables)
        except InputError:
            continue
        scored += 1
        if not ev.feasible:
            continue
        if budget is not None or objective == "cost":
            if ev.cost is None:
                raise InputError("instance.device_types", "the cost objective and budgets need every price")
            rate = ev.cost * 3600.0 / ev.predicted_time
            if budget is not None and rate > budget * (1 + 1e-12):
                continue
        value = ev.cost if objective == "cost" else ev.predicted_time
        if value < best * (1 - rel):
            best, kept = value, [ev]
        elif value <= best * (1 + rel):
            kept.append(ev)
    return None if not kept else Best(best, tuple(kept), scored)


def brute_top(instance, k: int, *, cost_model="hetero", objective: str = "time") -> list[float]:
    """The values of the ``k`` best distinct plans of a tiny instance, best first (fewer when
    fewer exist): every raw plan scored, plans that differ only by interchangeable devices or
    only in how they write the same plan counted once, and plans that a rule of
    ``formulations/exactness.md`` ("The k best plans", D1-D4) replaces left out.  What
    ``solve(top_k=k)`` must list.

    Examples
    --------
    >>> import amp_opt
    >>> from amp_opt.bench.brute import brute_top
    >>> inst = amp_opt.parse_instance(amp_opt.generate_instance(1, nodes=2, devices_per_node=1, layers=3))
    >>> len(brute_top(inst, 2)) <= 2
    True
    """
    tables = Tables(instance)
    scored: dict[str, tuple[float, dict]] = {}
    symmetries = _symmetries(instance)
    for doc in raw_plans(instance):
        ev = _score(instance, doc, cost_model, tables, objective)
        if ev is not None:
            scored.setdefault(_identity(instance, doc, symmetries), (ev, doc))
    values = sorted(value for value, doc in scored.values()
                    if not any(_no_worse(instance, other, value, cost_model, tables, objective)
                               for other in _replacements(instance, doc)))
    return values[:k]


def pipeline_plans(instance, samples: int) -> list[tuple[frozenset, dict]]:
    """Every (devices it uses, plan document with its ``micro_batches``) of one pipeline of a plan
    of several that processes ``samples`` samples: every raw plan of the instance at that batch."""
    sub = dataclasses.replace(instance, training=dataclasses.replace(instance.training, global_batch=samples))
    out = []
    for doc in itertools.chain(raw_plans(sub), uneven_plans(sub)):
        per_micro = sum(doc["shares"][0]) if "shares" in doc else doc["dp"] * doc["micro_batch"]
        used = frozenset(d for stage in doc["stages"] for group in stage for d in group)
        out.append((used, dict(doc, micro_batches=samples // per_micro)))
    return out


def brute_force_pipelines(instance, *, pipelines: int = 2) -> Best | None:
    """The fastest feasible raw plan of ``pipelines`` pipelines of a tiny instance (time
    objective), None when none is feasible."""
    batch, every = instance.training.global_batch, idle_level(instance.search.idle) == "none"
    loose = dataclasses.replace(instance, search=dataclasses.replace(instance.search, idle="devices"))
    per_batch = {s: pipeline_plans(loose, s) for s in range(1, batch)}
    tables = Tables(instance)
    best, kept, scored = math.inf, [], 0

    def disjoint(samples, taken=frozenset()):  # every choice of a plan per pipeline, no device twice
        if not samples:
            yield ()
            return
        for used, doc in per_batch[samples[0]]:
            if not used & taken:
                for rest in disjoint(samples[1:], taken | used):
                    yield ((used, doc),) + rest

    for samples in _compositions(batch, pipelines, batch):
        for chosen in disjoint(samples):
            if every and sum(len(u) for u, _ in chosen) != instance.num_devices:
                continue
            try:
                ev = evaluate(instance, parse_plan({"pipelines": [d for _, d in chosen]}), tables=tables)
            except InputError:
                continue
            scored += 1
            if ev.feasible and ev.predicted_time < best:
                best, kept = ev.predicted_time, [ev]
    return None if not kept else Best(best, tuple(kept), scored)


def _score(instance, doc: dict, cost_model, tables, objective: str) -> float | None:
    """The plan's value, None when the evaluator refuses it or it does not fit."""
    try:
        ev = evaluate(instance, parse_plan(doc), cost_model, tables=tables)
    except InputError:
        return None
    if not ev.feasible:
        return None
    return ev.cost if objective == "cost" else ev.predicted_time


def _no_worse(instance, doc: dict, value: float, cost_model, tables, objective: str) -> bool:
    other = _score(instance, doc, cost_model, tables, objective)
    return other is not None and other <= value * (1 + 1e-9)


def _symmetries(instance) -> list[dict[int, int]]:
    """Every relabelling of the devices that maps each node onto a node of the same type, size and
    links, device by device (the devices of a node are interchangeable)."""
    nodes = instance.nodes
    first = instance.node_first_device

    def kind(j):
        n = nodes[j]
        return (n.device_type, n.devices, n.intra_bandwidth, n.inter_bandwidth, n.nics, n.intra_latency, n.inter_latency)

    out = []
    for image in itertools.permutations(range(len(nodes))):
        if any(kind(j) != kind(i) for j, i in enumerate(image)):
            continue
        for orders in itertools.product(*(itertools.permutations(range(n.devices)) for n in nodes)):
            out.append({first[j] + d: first[image[j]] + orders[j][d] for j, n in enumerate(nodes) for d in range(n.devices)})
    return out


def _identity(instance, doc: dict, symmetries) -> str:
    """One key for the plans that are the same plan: device labels up to symmetry, each stage's
    groups as a set of sets, and a block count that covers every range written as plain full
    recomputation."""
    doc = dict(doc)
    layers = doc.pop("recompute_layers", None)
    if layers is not None and max(_recomputing(instance, k, l) for k, l in zip(doc["partition"], doc["partition"][1:])) > layers:
        doc["recompute_layers"] = layers
    stages = doc.pop("stages")
    layouts = (tuple(tuple(sorted(tuple(sorted(m[d] for d in group)) for group in stage)) for stage in stages)
               for m in symmetries)
    return json.dumps([doc, min(layouts)], sort_keys=True)


def _recomputing(instance, k: int, l: int) -> int:
    return sum(bool(layer.recomputes) for layer in instance.layers[k:l])


def _replacements(instance, doc: dict):
    """The plans that a rule says are at least as good as ``doc`` (D1-D4 of exactness.md): with
    sequence parallelism (tp > 1), at a higher ZeRO stage up to 2 (several replicas) or the lowest
    (one), without selective recomputation where no layer keeps attention scores, a stage without
    full recomputation where stages choose their own."""
    space, replicas = instance.search, doc["dp"] * doc["cp"]
    if doc["tp"] > 1 and not doc["sequence_parallel"] and True in space.sequence_parallel:
        yield {**doc, "sequence_parallel": True}
    z = doc["zero_stage"]
    for other in space.zero_stages:
        if (replicas > 1 and z < other <= 2) or (replicas == 1 and other < z):
            yield {**doc, "zero_stage": other}
    if doc["recompute"] == "selective" and not instance.layer_facts["scores"]:
        yield {**doc, "recompute": "none"}
    if (engine_of(instance).per_stage_recompute and space.per_stage_recompute
            and set(PER_STAGE_MODES) <= set(space.recompute) and "recompute_layers" not in doc):
        modes = [doc["recompute"]] * doc["pp"] if isinstance(doc["recompute"], str) else list(doc["recompute"])
        for s, mode in enumerate(modes):
            if mode == "full":
                less = modes[:s] + ["none"] + modes[s + 1:]
                yield {**doc, "recompute": less[0] if len(set(less)) == 1 else less}
