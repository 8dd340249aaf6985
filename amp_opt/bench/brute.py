"""The ground truth on tiny instances: every raw plan the evaluator accepts, scored by it.

Written apart from the search on purpose: it knows nothing of candidates, node classes,
groupings, bounds or dominance rules.  It walks every tp, cp, dp, pp, virtual-stage count
and micro-batch that the instance's ``search`` section lists (dp and pp over every value the
device count allows), every training setting listed there (sequence parallelism, each
recomputation mode, per-stage modes where the section allows stages to choose, block counts,
ZeRO stages), every partition, and every placement of the plan's tensor-parallel groups on
any subset of the devices, each group inside one node as the search keeps them (the
evaluator also prices groups that span nodes, ``formulations/hetero.md`` H16); it lets :func:`amp_opt.evaluate` reject what the instance or the
engine does not allow, and keeps the best feasible plans.  Its cost grows as n! in the device
count and as the number of partitions in the layer count: it is meant for a handful of
devices and layers (the tests' random instances, ``benchmarks/exactness.py``).

A tensor-parallel group is placed as a set of devices (its devices in increasing order): the
evaluator prices a group by the node it sits on, whatever its ranks' order.
``tests/test_brute.py`` checks that claim on the instances it draws.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from ..errors import InputError
from ..model.evaluate import Evaluation, evaluate
from ..model.instance import idle_level
from ..model.plan import PER_STAGE_MODES, parse_plan
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
    def rec(left: tuple[int, ...], k: int):
        if k == 0:
            yield ()
            return
        for group in itertools.combinations(left, tp):
            rest = tuple(d for d in left if d not in group)
            for tail in rec(rest, k - 1):
                yield (group,) + tail
    yield from rec(tuple(range(devices)), groups)


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
                    if any(len({int(instance.device_node[d]) for d in g}) > 1 for g in stages):
                        continue  # the search keeps tensor-parallel groups inside a node (hetero.md H16)
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
    for doc in raw_plans(instance):
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
