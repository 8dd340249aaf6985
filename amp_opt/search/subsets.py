"""Which node classes a plan uses, and what it optimises: idle GPUs, cost, budgets.

A plan may leave whole node classes idle (``search.idle``): slow or small GPUs that only
drag the pipeline or cannot hold a stage.  The search runs its solver on each subset of
node classes (the whole cluster first), every later subset cut off at the best plan so
far, so the result is as exact as the solver (``formulations/hetero.md``, "Decisions").
With ``objective="cost"`` the plans compare by USD per iteration (the used devices'
$/hour); with a ``budget`` (USD per hour) subsets that cost more are left out.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import sys

from ..errors import InfeasibleError, InputError, NoPlanFound
from ..model.classes import node_classes
from ..model.plan import Plan, describe
from .context import Search
from .result import NoPlanBelow, SolverStats, SolveResult


@dataclasses.dataclass(frozen=True)
class Subset:
    """Some node classes of an instance, as an instance of their own."""

    classes: tuple[int, ...]
    instance: object  # the instance of these classes' nodes
    devices: tuple[int, ...]  # global id of every device of the sub-instance
    rate: float | None  # USD per second of all its devices, None without prices

    def to_global(self, plan: Plan) -> Plan:
        """The plan with the sub-instance's device ids turned into the whole cluster's."""
        stages = tuple(tuple(tuple(self.devices[d] for d in group) for group in stage) for stage in plan.stages)
        return dataclasses.replace(plan, stages=stages)


def subsets(instance, model) -> list[Subset]:
    """The whole cluster, then every other non-empty set of node classes when idle GPUs are
    allowed (by the instance and the cost model), by decreasing peak FLOP/s (a heuristic
    order: the cutoffs keep the search exact)."""
    classes = node_classes(instance)
    if not (instance.search.idle and model.idle) or len(classes) == 1:
        sets = [tuple(c.index for c in classes)]
    else:
        sets = [s for r in range(len(classes), 0, -1) for s in itertools.combinations(range(len(classes)), r)]
        speed = {c.index: len(c.nodes) * c.devices * (instance.device_types[c.device_type].peak_flops or 0.0)
                 for c in classes}
        sets = sets[:1] + sorted(sets[1:], key=lambda s: -sum(speed[c] for c in s))
    return [_subset(instance, classes, s) for s in sets]


def _subset(instance, classes, chosen: tuple[int, ...]) -> Subset:
    nodes = sorted(j for c in chosen for j in classes[c].nodes)
    devices = tuple(d for j in nodes for d in range(instance.node_first_device[j],
                                                    instance.node_first_device[j] + instance.nodes[j].devices))
    sub = instance if len(nodes) == len(instance.nodes) else dataclasses.replace(
        instance, nodes=tuple(instance.nodes[j] for j in nodes))
    prices = [instance.device_types[instance.nodes[j].device_type].price_per_hour for j in nodes]
    rate = None if any(p is None for p in prices) else sum(
        p * instance.nodes[j].devices for p, j in zip(prices, nodes)) / 3600.0
    return Subset(chosen, sub, devices, rate)


def solve_subsets(instance, options, run, started: float | None = None) -> SolveResult:
    """Run ``run(sub_instance, options, started)`` (one solver, one instance) on every subset of
    node classes, each cut off at the best plan so far and given the time left, and return the
    best plans on the whole cluster, re-scored there by the evaluator."""
    parts = subsets(instance, options.model)
    cost = options.objective == "cost"
    if (cost or options.budget is not None) and any(p.rate is None for p in parts):
        missing = sorted({instance.nodes[j].device_type for j in range(len(instance.nodes))
                          if instance.device_types[instance.nodes[j].device_type].price_per_hour is None})
        raise InputError("instance.device_types", f"--objective cost and --budget need prices: {', '.join(missing)} "
                                                  "has no price_per_hour")
    allowed = [p for p in parts if options.budget is None or p.rate * 3600 <= options.budget * (1 + 1e-12)]
    if not allowed:
        _over_budget(instance, options, parts, run, started)
    whole = Search(instance, options, started)
    found, bounds, unknown, statuses, reasons = [], [], [], [], []
    for part in allowed:
        scale = part.rate if cost else 1.0  # objective units per second of iteration time
        best = min((value for value, _ in found), default=math.inf)
        first = part is allowed[0]
        left = whole.remaining()
        cutoff = best / scale if math.isfinite(best) else math.inf
        # The first run counts its time limit from the start; later ones get what is left.
        sub_options = dataclasses.replace(options, cutoff=cutoff) if first else dataclasses.replace(
            options, cutoff=cutoff, time_limit=None if left is None else max(left, 1e-3))
        if not first and whole.out_of_time():
            unknown.append(part)
            continue
        try:
            result = run(part.instance, sub_options, started if first else None)
        except NoPlanBelow as exc:
            bounds.append(exc.bound * scale)
            continue
        except NoPlanFound:
            unknown.append(part)
            continue
        except InfeasibleError:
            if len(allowed) == 1:
                raise
            reasons.append(str(sys.exc_info()[1]))
            bounds.append(math.inf)
            continue
        statuses.append(result.solver.status)
        bounds.append(result.solver.bound * scale)
        for ev in result.top:
            plan = whole.evaluate(part.to_global(ev.plan))
            found.append((plan.predicted_time * scale, plan))
        last = result
    if not found:
        if unknown:
            raise NoPlanFound(whole.stopped_why())
        whole_cluster = reasons[0] if reasons else "no plan fits"
        raise InfeasibleError(f"{whole_cluster}; leaving node classes idle does not help either")
    found.sort(key=lambda f: f[0])
    top = tuple(ev for _, ev in found[:options.top_k])
    objective = found[0][0]
    bound = min([objective] + bounds) if not unknown else -math.inf
    proven = not unknown and all(s == "OPTIMAL" for s in statuses)
    extra = dict(last.solver.extra)
    extra.update(subsets_searched=len(allowed) - len(unknown), node_classes_used=_classes_of(instance, top[0].plan))
    if cost:
        extra.update(objective="cost", objective_unit="USD per iteration")
    stats = SolverStats(name=last.solver.name, status="OPTIMAL" if proven and bound >= objective * (1 - 1e-6) else "FEASIBLE",
                        wall_time=whole.elapsed(), objective=objective, bound=max(0.0, min(bound, objective)), extra=extra)
    return SolveResult(top[0], top, stats)


def _classes_of(instance, plan: Plan) -> list[str]:
    used = {int(instance.device_node[d]) for stage in plan.stages for group in stage for d in group}
    return sorted({f"{instance.nodes[j].device_type} x{instance.nodes[j].devices}" for j in used})


def _over_budget(instance, options, parts, run, started):
    """No subset fits the budget: exit 3 with the fastest plan of the cheapest devices that can
    train, and by how much they miss it."""
    for part in sorted(parts, key=lambda p: (p.rate, p.classes)):
        try:
            result = run(part.instance, options, started)
        except InfeasibleError:
            continue
        plan = part.to_global(result.best.plan)
        raise InfeasibleError(
            f"no plan fits the budget of {options.budget:.2f} USD/hour: the cheapest devices that can train "
            f"({', '.join(_classes_of(instance, plan))}) cost {part.rate * 3600:.2f} USD/hour, "
            f"{part.rate * 3600 - options.budget:.2f} over; their fastest plan takes "
            f"{result.best.predicted_time:.4g} s per iteration ({describe(plan)})")
    raise InfeasibleError(f"no subset of node classes fits the budget of {options.budget:.2f} USD/hour, "
                          "and no subset can train at any price")
