"""The search over the sets of devices a plan may use: idle GPUs, cost, budgets.

The search runs its solver on each set of devices (:mod:`.device_sets`: the whole cluster
first), every later set cut off at the best plan so far, so the result is as exact as the
solver.  With ``objective="cost"`` the plans compare by USD per iteration (the used devices'
$/hour); with a ``budget`` (USD per hour) sets that cost more are left out.

A set is solved only if its throughput bound (B6) beats the best plan so far; the sets are
tried in the order of that bound.  Under a time limit the whole cluster gets FIRST_SHARE of
the time and the other sets share what is left; the time left after that is shared again by
the sets not proven yet, each run going on from what its last run proved and found (its
``Carry``).  A set not solved in time contributes its bound (or what its search proved) to the
reported one.  With ``processes`` > 1 (the CLI's default is 2) the other sets do not wait for
the whole cluster: they run in forked helper processes beside it (:mod:`.sidecar`), each helper
sharing the whole time limit among its sets in the same way, every run cut off at the best plan
any process has found when it starts.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections import Counter

from ..errors import InfeasibleError, InputError, NoPlanFound
from ..model.costs.contract import library_priced
from ..model.plan import Plan, describe
from . import sidecar, stop
from .clock import Clock
from .context import Carry, Search
from .device_sets import DeviceSet, device_sets, set_bound, throughput_bound
from .enumerate import plan_key
from .mip.listing import left_out
from .result import SAME, NoPlanBelow, SolverStats, SolveResult, status_of
from .trace import Trace
from .tuning import DEEPEN, FIRST_SHARE, REVISIT_PASSES, REVISIT_SECONDS


@dataclasses.dataclass(frozen=True)
class _Run:
    """How one run of a set's search ended (a record that crosses processes): ``kind`` is
    "plans" (``payload`` its SolveResult), "below" (the cutoff it proved), "stopped" (reason,
    message, bound) or "infeasible" (the message)."""

    key: tuple[tuple[int, ...], ...]
    kind: str
    payload: object
    offset: float  # time.perf_counter() its trace counts from
    seconds: float
    diagnosed: bool


def solve_subsets(instance, options, run, clock: Clock | None = None) -> SolveResult:
    """Run ``run(sub_instance, options, clock)`` (one solver, one instance) on every set of
    devices that may beat the best plan so far, cut off at it and given a share of ``clock``
    (default: the options' time limit from now), and return the best plans on the whole cluster, re-scored there by the evaluator.
    With a time limit and ``options.processes`` > 1 the sets other than the whole cluster are
    searched in forked processes (:mod:`.sidecar`) while this one searches the whole cluster."""
    clock = Clock.of(options.time_limit) if clock is None else clock
    parts, within = device_sets(instance, options.model)
    if (options.objective == "cost" or options.budget is not None) and any(p.rate is None for p in parts):
        missing = sorted({node.device_type for node in instance.nodes
                          if instance.device_types[node.device_type].price_per_hour is None})
        raise InputError("instance.device_types", f"--objective cost and --budget need prices: {', '.join(missing)} "
                                                  "has no price_per_hour")
    allowed = [p for p in parts if options.budget is None or p.rate * 3600 <= options.budget * (1 + 1e-12)]
    if not allowed:
        _over_budget(instance, options, parts, run, clock)
    search = SubsetSearch(instance, options, run, clock, allowed)
    search.run_all()
    return search.result(within)


class SubsetSearch:
    """One solve's search over its allowed sets of devices (the whole cluster first): what each
    set has proven (``bound``), the plans found, the runs made and what they leave for the next."""

    def __init__(self, instance, options, run, clock: Clock, allowed: list[DeviceSet]):
        self.instance, self.options, self.run, self.clock = instance, options, run, clock
        self.cost = options.objective == "cost"
        self.whole = Search(instance, options, clock)
        # B6 reads the layer tables, not the model: it holds only under amp_opt's own pricing.
        shares = (throughput_bound(instance, self.whole.tables)
                  if len(allowed) > 1 and library_priced(options.model) else {})
        floor = {part.key: set_bound(part, shares) * self.scale_of(part) for part in allowed}
        self.allowed = allowed[:1] + sorted(allowed[1:], key=lambda p: (floor[p.key], p.key))
        self.by_key = {part.key: part for part in self.allowed}
        self.bound = dict(floor)  # per set: what no plan on it beats (objective units)
        self.found: list[tuple[float, object]] = []  # (objective value, Evaluation) of every plan
        self.listed: set[str] = set()  # the plan keys in ``found``
        self.reasons: list[str] = []  # why sets are infeasible, the diagnosed one first
        self.ran: set = set()
        self.cut = 0  # sets skipped by their bound
        self.results: list[SolveResult] = []
        self.scales: list[float] = []  # per result: objective units per second of its set
        self.stopped: dict = {}  # sets whose last search stopped with no plan and no proof
        self.spent: dict = {}  # seconds of each set's last search
        self.carries: dict = {}  # what each set's search left for its next run
        self.build_rate = 0.0  # the slowest program build of any set, seconds per stage x layer
        self.marks: list = []  # (time.perf_counter(), best plan or None, bound or None) of every run
        self.helpers = _helpers(options, len(self.allowed))
        self.shared = sidecar.shared_value(math.inf) if self.helpers else None  # the best plan any process found
        self.sink = None  # in a helper process: where each run's record goes (to this process)

    def scale_of(self, part: DeviceSet) -> float:
        """Objective units per second of iteration time on ``part``."""
        return part.rate if self.cost else 1.0

    def best(self) -> float:
        """What a plan must beat to matter: the best value so far, or with ``top_k`` K the K-th."""
        values = sorted(value for value, _ in self.found)
        own = values[self.options.top_k - 1] if len(values) >= self.options.top_k else math.inf
        return own if self.shared is None else min(own, self.shared.value)

    def attempt(self, part: DeviceSet, clock: Clock) -> None:
        """Solve one set below the best so far, by ``clock``, and record how it ended."""
        outcome = self._search(part, clock)
        if self.sink is not None:  # sent before its plans lower the shared best: a cutoff this process
            self.sink(outcome)  # proves others below always has its plan on the way to the result
        self.record(outcome)

    def _search(self, part: DeviceSet, clock: Clock) -> _Run:
        """One run of ``part``'s search below the best plan so far, going on from its last run."""
        best, scale = self.best(), self.scale_of(part)
        # Only the first set's verdict is shown (``reasons[0]``): the others skip the search for
        # their least overfull plan, which would take what is left of their time.
        diagnose = self.options.diagnose and part is self.allowed[0]
        # A set run again goes on from where its last run stopped (its carry), so a revisit
        # raises the bounds and improves the plans instead of repeating the first run.
        carry = self.carries.setdefault(part.key, Carry())
        # A program's build is not cut short: each run starts from the slowest build timed so far.
        carry.build_rate = max(carry.build_rate, self.build_rate)
        asked = dataclasses.replace(self.options, cutoff=best / scale if math.isfinite(best) else math.inf,
                                    diagnose=diagnose, carry=carry,
                                    progress=self.options.progress if self.sink is None else None)
        began = time.perf_counter()
        try:
            kind, payload = "plans", self.run(part.instance, asked, clock)
        except NoPlanBelow as exc:
            kind, payload = "below", exc.bound
        except NoPlanFound as exc:  # no plan, and (perhaps) a bound on what it could have
            kind, payload = "stopped", (exc.reason, str(exc), exc.bound)
        except InfeasibleError as exc:
            if len(self.allowed) == 1:
                raise
            kind, payload = "infeasible", str(exc)
        finally:
            self.build_rate = max(self.build_rate, carry.build_rate)
        return _Run(part.key, kind, payload, clock.start, time.perf_counter() - began, diagnose)

    def record(self, outcome: _Run) -> None:
        """What a run found and proved, into the sets' bounds, plans and reasons."""
        key, payload = outcome.key, outcome.payload
        part = self.by_key[key]
        scale = self.scale_of(part)
        self.ran.add(key)
        self.spent[key] = outcome.seconds
        self.stopped.pop(key, None)  # a second run replaces what the first left open
        if outcome.kind == "below":
            self.carries.pop(key, None)  # proven: not run again
            self.bound[key] = max(self.bound[key], payload * scale)
        elif outcome.kind == "stopped":
            reason, message, proved = payload
            self.stopped[key] = NoPlanFound(reason, message, bound=proved)
            if math.isfinite(proved):
                self.bound[key] = max(self.bound[key], proved * scale)
        elif outcome.kind == "infeasible":
            self.carries.pop(key, None)
            self.reasons.insert(0 if outcome.diagnosed else len(self.reasons), payload)
            self.bound[key] = math.inf
        else:
            self._record_plans(part, payload, outcome.offset, scale)

    def _record_plans(self, part: DeviceSet, result: SolveResult, offset: float, scale: float) -> None:
        # A set proven optimal is closed at its best plan's score: a program's proof is within its
        # integer resolution of the evaluator's (CP-SAT scales the seconds to integers), which can be
        # more than the SAME the comparisons allow.
        optimal = result.solver.status == "OPTIMAL"
        if optimal:
            self.carries.pop(part.key, None)
        proven = result.best.predicted_time if optimal else result.solver.bound
        self.bound[part.key] = max(self.bound[part.key], proven * scale)
        self.results.append(result)
        self.scales.append(scale)
        alone = len(self.allowed) == 1
        for t, primal, dual in result.solver.trace:
            self.marks.append((offset + t, primal * scale if math.isfinite(primal) else None,
                               dual * scale if alone and math.isfinite(dual) else None))
        for ev in result.top:
            plan = self.whole.evaluate(part.to_global(ev.plan))
            key = plan_key(self.instance, plan.plan)
            if key in self.listed:  # a set run again returns what its last run found: listed once
                continue
            self.listed.add(key)
            self.found.append((plan.predicted_time * scale, plan))
            if self.shared is not None:
                sidecar.lower(self.shared, plan.predicted_time * scale)

    def first_pass(self, group: list[DeviceSet]) -> None:
        """Each set of ``group`` in turn, given its share of the time left (the whole cluster,
        first, FIRST_SHARE of the clock when other sets remain)."""
        for i, part in enumerate(group):
            if self.bound[part.key] >= self.best():  # no plan on these devices can beat the best so far
                self.cut += 1
            elif part is self.allowed[0]:  # counts its time from the start; leaves some for the others
                self.attempt(part, self.clock if len(self.allowed) == 1 else self.clock.part(FIRST_SHARE))
            elif not self.clock.out_of_time():
                self.attempt(part, self.clock.share(among=len(group) - i, floor=1e-3))

    def revisit(self, group: list[DeviceSet]) -> None:
        """Time left: the sets of ``group`` not proven yet get it, the most promising first (a
        second run starts from the best plan as its cutoff and from what its last run proved, so
        it proves or improves).  Each gets its share of what is left, or DEEPEN times its last
        run's time if that is more (what a run builds before it proves anything, such as its
        programs, is built again); what one leaves over goes to the next, and a later pass gives
        what is still left to those still open."""
        clock = self.clock
        for _ in range(REVISIT_PASSES):
            unproven = [p for p in sorted(group, key=lambda p: (self.bound[p.key], p.key)) if self._open(p)]
            for i, part in enumerate(unproven):
                if clock.deadline is None or clock.out_of_time() or clock.remaining() < REVISIT_SECONDS:
                    break
                if self._open(part):
                    deeper = min(clock.remaining(), DEEPEN * self.spent.get(part.key, 0.0))
                    self.attempt(part, clock.share(among=len(unproven) - i, floor=deeper))

    def _open(self, part: DeviceSet) -> bool:
        """Whether ``part`` may still hold a plan better than the best so far."""
        return self.bound[part.key] < self.best() * (1 - SAME)

    def helper(self, group: list[DeviceSet], send) -> None:
        """In a forked process: ``group``'s sets, each run's record sent back."""
        self.sink = send
        self.first_pass(group)
        self.revisit(group)
        send(("cut", self.cut))

    def run_all(self) -> None:
        """Every allowed set: in turn in this process, or the whole cluster here and the others
        (dealt in turn, most promising first) in the helpers beside it."""
        if not self.helpers:
            self.first_pass(self.allowed)
            self.revisit(self.allowed)
            return
        sides = [sidecar.Sidecar(functools.partial(self.helper, self.allowed[1 + k::self.helpers]))
                 for k in range(self.helpers)]
        records = []
        try:
            self.first_pass(self.allowed[:1])
            self.revisit(self.allowed[:1])
            if stop.requested():
                for side in sides:
                    side.stop()
            # The helpers' runs end by the deadline; one that overruns it is stopped halfway into
            # the time kept back for writing the plans (its later runs are lost, not waited for).
            end = self.clock.overrun()
            for side in sides:
                records += side.finish(end - time.perf_counter())
        finally:
            for side in sides:
                side.close()
        for item in records:
            if isinstance(item, tuple):  # ("cut", count) of a helper
                self.cut += item[1]
            else:
                self.record(item)

    def result(self, within: str | None) -> SolveResult:
        """The best plans found, with the bound every set proved; raises when none was found."""
        if not self.found:
            self._raise_none_found()
        found = sorted(self.found, key=lambda f: f[0])
        top = tuple(ev for _, ev in found[:self.options.top_k])
        objective = found[0][0]
        lower = min([objective] + list(self.bound.values()))
        last = self.results[-1]
        trace = Trace(self.clock.start)  # the best plan over time; the bound only where one search covers it all
        for at, primal, dual in sorted(self.marks, key=lambda m: m[0]):
            trace.update(primal, dual, at=at)
        trace.update(objective, lower)
        extra = {k: v for k, v in last.solver.extra.items() if not k.startswith("top_k_")}
        extra.update(subsets_searched=len(self.ran), subsets_cut_off=self.cut,
                     node_classes_used=_classes_of(self.instance, top[0].plan), processes=1 + self.helpers)
        if self.cost:
            extra.update(objective="cost", objective_unit="USD per iteration")
        stats = SolverStats(name=last.solver.name, status=status_of(objective, lower),
                            wall_time=self.whole.elapsed(), objective=objective, bound=max(0.0, min(lower, objective)),
                            extra=extra, trace=trace.as_tuple(),
                            programs=tuple(p for r in self.results for p in r.solver.programs),
                            within=_joined(within, *(r.solver.within for r in self.results), self._unlisted(found)))
        return SolveResult(top[0], top, stats)

    def _unlisted(self, found: list) -> str | None:
        """With --top-k on the MIP path: what the list may miss, against the K-th plan over every set
        (a set's own K-th may be far above it), or None (search/mip/listing.py)."""
        k = self.options.top_k
        kth = found[k - 1][0] if len(found) >= k else math.inf
        names, stopped = [], False
        for result, scale in zip(self.results, self.scales):
            stopped |= bool(result.solver.extra.get("top_k_stopped"))
            names += [name for name, bound in result.solver.extra.get("top_k_open", ())
                      if bound * scale < kth * (1 - SAME)]
        return left_out(list(dict.fromkeys(names)), stopped)

    def _raise_none_found(self):
        if self.stopped:  # a set's search stopped unproven: a share of the time is said as the caller's limit
            other = [exc for exc in self.stopped.values() if not exc.reason.startswith("time limit")]
            raise other[0] if other else NoPlanFound(self.clock.stopped_why())
        if any(p.key not in self.ran for p in self.allowed) and self.clock.out_of_time():
            raise NoPlanFound(self.clock.stopped_why())
        whole_cluster = self.reasons[0] if self.reasons else "no plan fits"
        raise InfeasibleError(f"{whole_cluster}; leaving devices idle does not help either")


def _joined(*phrases: str | None) -> str | None:
    """The parts of the space a result leaves out, each said once, in order; None when none is."""
    kept = list(dict.fromkeys(p for p in phrases if p))
    return "; ".join(kept) or None


def _helpers(options, count: int) -> int:
    """How many processes beside this one search the sets other than the whole cluster: none
    without a time limit (the search then repeats exactly), with one set or with ``top_k`` > 1;
    else up to ``options.processes`` - 1, no more than the cores beyond this process's and the sets."""
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


def _over_budget(instance, options, parts, run, clock):
    """No set of devices fits the budget: exit 3 with the fastest plan of the cheapest devices that can
    train, and by how much they miss it."""
    for part in sorted(parts, key=lambda p: (p.rate, p.key)):
        try:
            result = run(part.instance, options, clock)
        except InfeasibleError:
            continue
        plan = part.to_global(result.best.plan)
        raise InfeasibleError(
            f"no plan fits the budget of {options.budget:.2f} USD/hour: the cheapest devices that can train "
            f"({_nodes_of(instance, plan)}) cost {part.rate * 3600:.2f} USD/hour, "
            f"{part.rate * 3600 - options.budget:.2f} over; their fastest plan takes "
            f"{result.best.predicted_time:.4g} s per iteration ({describe(plan)})")
    raise InfeasibleError(f"no set of devices fits the budget of {options.budget:.2f} USD/hour, "
                          "and none can train at any price")
