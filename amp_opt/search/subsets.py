"""Which node classes a plan uses, and what it optimises: idle GPUs, cost, budgets.

A plan may leave whole node classes idle (``search.idle``): slow or small GPUs that only
drag the pipeline or cannot hold a stage.  The search runs its solver on each subset of
node classes (the whole cluster first), every later subset cut off at the best plan so
far, so the result is as exact as the solver (``formulations/hetero.md``, "Decisions").
With ``objective="cost"`` the plans compare by USD per iteration (the used devices'
$/hour); with a ``budget`` (USD per hour) subsets that cost more are left out.

A subset is solved only if its throughput bound (:func:`throughput_bound`, every device
busy all the time) beats the best plan so far; the subsets are tried in the order of
that bound.  Under a time limit the whole cluster gets FIRST_SHARE of the time and the
other subsets share what is left; the time left after that is shared again by the subsets
not proven yet, each run again going on from what its last run proved and found (its
``Carry``).  A subset not solved in time contributes its throughput bound (or what its
search proved) to the reported one.  With ``processes`` > 1 (the CLI's default is 2) the
other subsets do not wait for the whole cluster: they run in forked helper processes beside
it (:mod:`.sidecar`), each helper sharing the whole time limit among its subsets in the same
way, every run cut off at the best plan any process has found when it starts.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import time
from collections import Counter

import numpy as np

from ..errors import InfeasibleError, InputError, NoPlanFound
from ..model.candidates import MAX_CHUNKINGS, interleaving_narrowed
from ..model.classes import node_classes
from ..model.instance import IDLE_SPACES
from ..model.plan import Plan, describe
from . import sidecar, stop
from .context import Carry, Search, reserve
from .result import NoPlanBelow, SolverStats, SolveResult
from .trace import Trace

FIRST_SHARE = 0.6  # of the time limit: the whole cluster's search, when other subsets remain
REVISIT_SECONDS = 1.0  # time left worth a second run on a subset not proven yet
REVISIT_PASSES = 2  # rounds over the subsets not proven yet, sharing the time left
DEEPEN = 4.0  # a subset run again gets at least this times its last run's seconds (if left)


WITHIN = {"nodes": "plans on whole nodes", "classes": "plans on whole node classes",
          "none": "plans that use every device"}  # what a narrower space leaves in, for "optimal within ..."
# Sub-clusters searched at most (each is a search of its own, cut off or run): past this the
# space narrows to the next of IDLE_SPACES and the result says so ("optimal within ...").
# 512: the exact space of the 16-GPU paper cluster (4 nodes of 4, tp 1, 2, 4) has 174
# sub-clusters; a 64-GPU cluster of two classes of 4 nodes of 8 already has 2024, a search
# of minutes (benchmarks/results/exactness.md).
MAX_SUBSETS = 512


@dataclasses.dataclass(frozen=True)
class Subset:
    """The devices a plan may use, as an instance of their own: per node class, how many of
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


def idle_space(instance) -> str:
    """The space of device subsets the instance asks for (``search.idle``; true is "devices",
    false "none")."""
    idle = instance.search.idle
    return {True: "devices", False: "none"}[idle] if isinstance(idle, bool) else idle


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


def count_subsets(instance, space: str) -> int:
    """How many sub-clusters ``space`` holds (at most: keys with no common tp are dropped later)."""
    classes = node_classes(instance)
    if space == "none":
        return 1
    if space == "classes":
        return 2 ** len(classes) - 1
    return math.prod(math.comb(len(c.nodes) + len(_node_counts(instance, c, space)) - 1, len(c.nodes))
                     for c in classes) - 1


def subsets(instance, model) -> tuple[list[Subset], str | None]:
    """The sub-clusters a plan may use, the whole cluster first, and what the search leaves out:
    None when every device subset the evaluator accepts is searched, else a phrase for "optimal
    within ..." (the instance narrowed ``search.idle``, or its space held more than MAX_SUBSETS).
    The others come by decreasing peak FLOP/s (an order only: the cutoffs keep the search exact)."""
    asked = space = idle_space(instance) if model.idle else "none"
    while count_subsets(instance, space) > MAX_SUBSETS:
        space = IDLE_SPACES[IDLE_SPACES.index(space) + 1]
    if space == "none" or len(node_classes(instance)) == 1 and space == "classes":
        keys = [tuple((c.devices,) * len(c.nodes) for c in node_classes(instance))]
    else:
        keys = list(_keys(instance, space))
    peak = {c.index: instance.device_types[c.device_type].peak_flops or 0.0 for c in node_classes(instance)}
    keys = keys[:1] + sorted(keys[1:], key=lambda k: (-sum(peak[c] * sum(u) for c, u in enumerate(k)), k))
    parts = []
    if not model.idle and idle_space(instance) != "none":
        parts.append(f"{WITHIN['none']} (the {model.name} cost model prices every device of the cluster)")
    elif space != "devices" and asked != space:
        count = count_subsets(instance, asked)
        parts.append(f"{WITHIN[space]} (search.idle {asked!r} holds {count:,}" if count < 10**9 else
                     f"{WITHIN[space]} (search.idle {asked!r} holds about {count:.1e}")
        parts[-1] += f" sets of devices, more than {MAX_SUBSETS})"
    elif space != "devices":
        parts.append(f"{WITHIN[space]} (search.idle {asked!r})")
    if interleaving_narrowed(instance, model):
        parts.append(f"plans whose interleaved chunks are the engine's even split (more than {MAX_CHUNKINGS} "
                     "chunkings of the layers)")
    return [_subset(instance, key) for key in keys], "; ".join(parts) or None


def _subset(instance, key) -> Subset:
    counts = {j: u for c, cls in zip(key, node_classes(instance)) for j, u in zip(cls.nodes, c)}
    nodes = [j for j in range(len(instance.nodes)) if counts[j]]
    devices = tuple(instance.node_first_device[j] + q for j in nodes for q in range(counts[j]))
    whole = len(devices) == instance.num_devices
    sub = instance if whole else dataclasses.replace(
        instance, nodes=tuple(dataclasses.replace(instance.nodes[j], devices=counts[j]) for j in nodes))
    prices = [instance.device_types[instance.nodes[j].device_type].price_per_hour for j in nodes]
    rate = None if any(p is None for p in prices) else sum(p * counts[j] for p, j in zip(prices, nodes)) / 3600.0
    return Subset(key, sub, devices, rate)


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
                    seconds = tables.layer_times(c.device_type, c.intra, tp, b).seconds
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


def _subset_bound(part: Subset, shares: dict) -> float:
    """Seconds per iteration no plan on ``part``'s devices beats (:func:`throughput_bound`)."""
    if not shares:
        return 0.0
    speed = sum(shares.get(c, 0.0) * sum(counts) for c, counts in enumerate(part.key))
    return shares["work"] / speed if speed > 0 else math.inf


@dataclasses.dataclass(frozen=True)
class _Run:
    """How one run of a subset's search ended (a record that crosses processes): ``kind`` is
    "plans" (``payload`` its SolveResult), "below" (the cutoff it proved), "stopped" (reason,
    message, bound) or "infeasible" (the message)."""

    key: tuple[tuple[int, ...], ...]
    kind: str
    payload: object
    offset: float  # time.perf_counter() its trace counts from
    seconds: float
    diagnosed: bool


def solve_subsets(instance, options, run, started: float | None = None) -> SolveResult:
    """Run ``run(sub_instance, options, started)`` (one solver, one instance) on every subset of
    node classes that may beat the best plan so far, cut off at it and given a share of the
    time left, and return the best plans on the whole cluster, re-scored there by the evaluator.
    With a time limit and ``options.processes`` > 1 the subsets other than the whole cluster
    are searched in forked processes (:mod:`.sidecar`) while this one searches the whole cluster."""
    parts, within = subsets(instance, options.model)
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
    shares = throughput_bound(instance, whole.tables) if len(allowed) > 1 else {}

    def scale_of(part):  # objective units per second of iteration time
        return part.rate if cost else 1.0

    floor = {part.key: _subset_bound(part, shares) * scale_of(part) for part in allowed}
    allowed = allowed[:1] + sorted(allowed[1:], key=lambda p: (floor[p.key], p.key))
    by_key = {part.key: part for part in allowed}
    bound = dict(floor)  # per subset: what no plan on it beats (objective units)
    found, reasons, ran, cut, results = [], [], set(), [0], []
    stopped: dict[tuple[int, ...], NoPlanFound] = {}  # subsets whose last search stopped with no plan and no proof
    spent: dict[tuple[int, ...], float] = {}  # seconds of each subset's last search
    carries: dict[tuple[int, ...], Carry] = {}  # what each subset's search left for its next run
    build_rate = [0.0]  # the slowest program build of any subset, seconds per stage x layer
    marks = []  # (time.perf_counter(), best plan or None, bound or None) of every run, for the trace
    helpers = _helpers(options, len(allowed))
    shared = sidecar.shared_value(math.inf) if helpers else None  # the best plan any process found
    sink = [None]  # in a helper process: where each run's record goes (to this process)

    def best():
        """What a plan must beat to matter: the best value so far, or with ``top_k`` K the K-th."""
        values = sorted(value for value, _ in found)
        own = values[options.top_k - 1] if len(values) >= options.top_k else math.inf
        return own if shared is None else min(own, shared.value)

    def attempt(part, limit, since):
        """Solve one subset below the best so far and record how it ended."""
        outcome = search(part, limit, since)
        if sink[0] is not None:  # sent before its plans lower the shared best: a cutoff this process
            sink[0](outcome)  # proves others below always has its plan on the way to the result
        record(outcome)

    def search(part, limit, since) -> _Run:
        """One run of ``part``'s search below the best plan so far, going on from its last run."""
        scale = scale_of(part)
        cutoff = best() / scale if math.isfinite(best()) else math.inf
        # Only the first subset's verdict is shown (``reasons[0]``): the others skip the search
        # for their least overfull plan, which would take what is left of their time.
        diagnose = options.diagnose and part is allowed[0]
        # A subset run again goes on from where its last run stopped (its carry), so a revisit
        # raises the bounds and improves the plans instead of repeating the first run.
        carry = carries.setdefault(part.key, Carry())
        # A program's build is not cut short: each run starts from the slowest build timed so far.
        carry.build_rate = max(carry.build_rate, build_rate[0])
        progress = options.progress if sink[0] is None else None  # a helper's runs do not report progress
        asked = dataclasses.replace(options, cutoff=cutoff, time_limit=limit, diagnose=diagnose, carry=carry,
                                    progress=progress)
        began = time.perf_counter()
        offset = began if since is None else since
        try:
            kind, payload = "plans", run(part.instance, asked, since)
        except NoPlanBelow as exc:
            kind, payload = "below", exc.bound
        except NoPlanFound as exc:  # no plan, and (perhaps) a bound on what it could have
            kind, payload = "stopped", (exc.reason, str(exc), exc.bound)
        except InfeasibleError as exc:
            if len(allowed) == 1:
                raise
            kind, payload = "infeasible", str(exc)
        finally:
            build_rate[0] = max(build_rate[0], carry.build_rate)
        return _Run(part.key, kind, payload, offset, time.perf_counter() - began, diagnose)

    def record(outcome: _Run):
        """What a run found and proved, into the subsets' bounds, plans and reasons."""
        classes, payload = outcome.key, outcome.payload
        part, scale = by_key[classes], scale_of(by_key[classes])
        ran.add(classes)
        spent[classes] = outcome.seconds
        stopped.pop(classes, None)  # a second run replaces what the first left open
        if outcome.kind == "below":
            carries.pop(classes, None)  # proven: not run again
            bound[classes] = max(bound[classes], payload * scale)
            return
        if outcome.kind == "stopped":
            reason, message, proved = payload
            stopped[classes] = NoPlanFound(reason, message, bound=proved)
            if math.isfinite(proved):
                bound[classes] = max(bound[classes], proved * scale)
            return
        if outcome.kind == "infeasible":
            carries.pop(classes, None)
            reasons.insert(0 if outcome.diagnosed else len(reasons), payload)  # the diagnosed one first
            bound[classes] = math.inf
            return
        result = payload
        # A subset proven optimal is closed at its best plan's score: a program's proof is within its
        # integer resolution of the evaluator's (CP-SAT scales the seconds to integers), which can be
        # more than the 1e-6 the comparison below allows.
        proven = result.best.predicted_time if result.solver.status == "OPTIMAL" else result.solver.bound
        if result.solver.status == "OPTIMAL":
            carries.pop(classes, None)
        bound[classes] = max(bound[classes], proven * scale)
        results.append(result)
        alone = len(allowed) == 1
        for t, primal, dual in result.solver.trace:
            marks.append((outcome.offset + t, primal * scale if math.isfinite(primal) else None,
                          dual * scale if alone and math.isfinite(dual) else None))
        for ev in result.top:
            plan = whole.evaluate(part.to_global(ev.plan))
            found.append((plan.predicted_time * scale, plan))
            if shared is not None:
                sidecar.lower(shared, plan.predicted_time * scale)

    def first_pass(group):
        """Each subset of ``group`` in turn, given its share of the time left (the whole cluster,
        first, FIRST_SHARE of the limit when other subsets remain)."""
        for i, part in enumerate(group):
            if bound[part.key] >= best():  # no plan on these devices can beat the best so far
                cut[0] += 1
                continue
            if part is allowed[0]:  # counts its time limit from the start; leaves some for the other subsets
                limit = options.time_limit
                if limit is not None and len(allowed) > 1:
                    limit = max(1e-3, FIRST_SHARE * limit)
                attempt(part, limit, started)
            elif not whole.out_of_time():
                left = whole.remaining()
                attempt(part, None if left is None else max(left / (len(group) - i), 1e-3), None)

    def revisit(group):
        """Time left: the subsets of ``group`` not proven yet get it, the most promising first (a
        second run starts from the best plan as its cutoff and from what its last run proved, so
        it proves or improves).  Each gets its share of what is left, or DEEPEN times its last
        run's time if that is more (what a run builds before it proves anything, such as its
        programs, is built again); what one leaves over goes to the next, and a later pass gives
        what is still left to those still open."""
        for _ in range(REVISIT_PASSES):
            unproven = [p for p in sorted(group, key=lambda p: (bound[p.key], p.key))
                        if bound[p.key] < best() * (1 - 1e-6)]
            for i, part in enumerate(unproven):
                if options.time_limit is None or whole.out_of_time() or whole.remaining() < REVISIT_SECONDS:
                    break
                if bound[part.key] < best() * (1 - 1e-6):
                    left = whole.remaining()
                    attempt(part, max(left / (len(unproven) - i), min(left, DEEPEN * spent.get(part.key, 0.0))),
                            None)

    def helper(group, send):  # runs in a forked process: ``group``'s subsets, each run's record sent back
        sink[0] = send
        first_pass(group)
        revisit(group)
        send(("cut", cut[0]))

    if not helpers:
        first_pass(allowed)
        revisit(allowed)
    else:  # the whole cluster here, the other subsets (dealt in turn, most promising first) beside it
        sides = [sidecar.Sidecar(functools.partial(helper, allowed[1 + k::helpers])) for k in range(helpers)]
        records = []
        try:
            first_pass(allowed[:1])
            revisit(allowed[:1])
            if stop.requested():
                for side in sides:
                    side.stop()
            # The helpers' runs end by the deadline; one that overruns it is stopped halfway into
            # the time kept back for writing the plans (its later runs are lost, not waited for).
            end = whole.start + options.time_limit - reserve(options.time_limit) / 2
            for side in sides:
                records += side.finish(end - time.perf_counter())
        finally:
            for side in sides:
                side.close()
        for item in records:
            if isinstance(item, tuple):  # ("cut", count) of a helper
                cut[0] += item[1]
            else:
                record(item)
    if not found:
        if stopped:  # a subset's search stopped unproven: a share of the time is said as the caller's limit
            other = [exc for exc in stopped.values() if not exc.reason.startswith("time limit")]
            raise other[0] if other else NoPlanFound(whole.stopped_why())
        if any(p.key not in ran for p in allowed) and whole.out_of_time():
            raise NoPlanFound(whole.stopped_why())
        whole_cluster = reasons[0] if reasons else "no plan fits"
        raise InfeasibleError(f"{whole_cluster}; leaving devices idle does not help either")
    found.sort(key=lambda f: f[0])
    top = tuple(ev for _, ev in found[:options.top_k])
    objective = found[0][0]
    lower = min([objective] + list(bound.values()))
    last = results[-1]
    trace = Trace(whole.start)  # the best plan over time; the bound only where one search covers it all
    for at, primal, dual in sorted(marks, key=lambda m: m[0]):
        trace.update(primal, dual, at=at)
    trace.update(objective, lower)
    extra = dict(last.solver.extra)
    extra.update(subsets_searched=len(ran), subsets_cut_off=cut[0], node_classes_used=_classes_of(instance, top[0].plan),
                 processes=1 + helpers)
    if cost:
        extra.update(objective="cost", objective_unit="USD per iteration")
    stats = SolverStats(name=last.solver.name, status="OPTIMAL" if lower >= objective * (1 - 1e-6) else "FEASIBLE",
                        wall_time=whole.elapsed(), objective=objective, bound=max(0.0, min(lower, objective)), extra=extra,
                        trace=trace.as_tuple(), programs=tuple(p for r in results for p in r.solver.programs),
                        within=within)
    return SolveResult(top[0], top, stats)


def _helpers(options, count: int) -> int:
    """How many processes beside this one search the subsets other than the whole cluster: none
    without a time limit (the search then repeats exactly), with one subset or with ``top_k`` > 1;
    else up to
    ``options.processes`` - 1, no more than the cores beyond this process's and the subsets."""
    if (options.time_limit is None or count < 2 or options.processes < 2 or options.top_k > 1
            or not sidecar.can_fork()):  # the shared value is one plan's: a cutoff for the best plan only
        return 0
    return max(0, min(options.processes - 1, sidecar.usable_cores() - 1, count - 1))


def _used_nodes(instance, plan: Plan) -> set[int]:
    """The indices of the nodes that hold at least one of the plan's devices."""
    return {int(instance.device_node[d]) for stage in plan.stages for group in stage for d in group}


def _classes_of(instance, plan: Plan) -> list[str]:
    nodes = instance.nodes
    return sorted({f"{nodes[j].device_type} x{nodes[j].devices}" for j in _used_nodes(instance, plan)})


def _nodes_of(instance, plan: Plan) -> str:
    """The nodes a plan uses, per class: '2048 nodes of 8 x H100-80GB'."""
    nodes = instance.nodes
    count = Counter(f"{nodes[j].devices} x {nodes[j].device_type}" for j in _used_nodes(instance, plan))
    return ", ".join(f"{n} node{'s' if n > 1 else ''} of {kind}" for kind, n in sorted(count.items()))


def _over_budget(instance, options, parts, run, started):
    """No subset fits the budget: exit 3 with the fastest plan of the cheapest devices that can
    train, and by how much they miss it."""
    for part in sorted(parts, key=lambda p: (p.rate, p.key)):
        try:
            result = run(part.instance, options, started)
        except InfeasibleError:
            continue
        plan = part.to_global(result.best.plan)
        raise InfeasibleError(
            f"no plan fits the budget of {options.budget:.2f} USD/hour: the cheapest devices that can train "
            f"({_nodes_of(instance, plan)}) cost {part.rate * 3600:.2f} USD/hour, "
            f"{part.rate * 3600 - options.budget:.2f} over; their fastest plan takes "
            f"{result.best.predicted_time:.4g} s per iteration ({describe(plan)})")
    raise InfeasibleError(f"no subset of node classes fits the budget of {options.budget:.2f} USD/hour, "
                          "and no subset can train at any price")
