"""One search's state: its instance and options, the tables it derives, and its clock.

A :class:`Search` is created by :func:`amp_opt.solve` and handed to every solver it runs
(``auto`` runs the enumerator, then a MIP, on the same one), so derived tables and
candidate bounds are computed once per solve and owned by it, not hidden on the instance.
Its :class:`~amp_opt.search.clock.Clock` is the one it was given (the whole time limit, or a
set of devices' share of it): every phase asks ``search.clock`` for its part.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..model.engines import even_partition
from ..model.costs.contract import bound_holds, plan_of
from ..model.costs.terms import stage_order
from ..model.evaluate import Evaluation, evaluate
from ..model.plan import Candidate, Plan
from ..model.tables import Tables
from .clock import Clock
from .options import SolveOptions
from .trace import Trace


@dataclass(eq=False)
class Carry:
    """What a search leaves for the next search of the same instance under the same options but
    a lower cutoff and a new time limit (the search over idle node classes runs a subset again
    when time is left): the tables, the candidates' bounds, phase 1's incumbents and the kind
    searches, so that the second run goes on from where the first stopped
    (``formulations/mip.md``, "Time").  Each bound bounds every plan of its candidate, whatever
    the cutoff: it stays valid when the cutoff falls."""

    instance: object = None  # the instance it belongs to (set by the first search)
    tables: Tables | None = None
    bounds: dict = field(default_factory=dict)  # the cost model's bounds (Search.lower_bound)
    lower: dict = field(default_factory=dict)  # candidate -> proven lower bound, seconds
    incumbents: dict = field(default_factory=dict)  # candidate -> phase 1 or 1b incumbent
    reached: set = field(default_factory=set)  # candidates whose phase 1 DP ran
    kinds: object = None  # the kind phase (amp_opt.search.kinds.refine.KindPhase), if one ran
    build_rate: float = 0.0  # the slowest program build so far, seconds per stage x layer (driver)


class Search:
    """The instance, the options, the derived tables and the clock of one solve (default: the
    options' time limit from now)."""

    def __init__(self, instance, options: SolveOptions, clock: Clock | None = None):
        self.instance, self.options = instance, options
        self.model = options.model
        carry = options.carry
        if carry is not None and carry.instance is not None and carry.instance is not instance:
            raise ValueError("a search's carry belongs to another instance")
        self.tables = carry.tables if carry is not None and carry.tables is not None else Tables(instance)
        self.clock = Clock.of(options.time_limit) if clock is None else clock
        self._bounds: dict[tuple, float] = {} if carry is None else carry.bounds
        self._slowest_labelled = 0.0  # seconds of the slowest labelled bound so far (lower_bound)
        if carry is not None:
            carry.instance, carry.tables = instance, self.tables
        self.trace = Trace(self.clock.start)  # best plan and proven bound over time (for the benchmark)

    def elapsed(self) -> float:
        return self.clock.elapsed()

    def out_of_time(self) -> bool:
        """Whether the search must stop now (its clock's deadline passed, or a stop was requested)."""
        return self.clock.out_of_time()

    def stopped_why(self) -> str:
        return self.clock.stopped_why()

    def lower_bound(self, cand: Candidate, *, labelled: bool = True) -> float:
        """The cost model's bound on every plan of a candidate, remembered for this solve.

        A labelled bound (B2, one DP: up to most of a second on 1024 GPUs, and it does not stop at
        the deadline) is not started when less time is left than the slowest one so far took: the
        cheap bound (B3) stands in for it, so that a search keeps its time limit.  The model may
        stop at the search's cutoff (``enough``): a bound that reaches it rules the candidate out
        as well as a higher one would, and still does when a later run's cutoff is lower."""
        key = (cand, labelled)
        if not bound_holds(self.model):  # a caller's stage_costs under amp_opt's bound: nothing proven
            return 0.0
        if key not in self._bounds:
            left = self.clock.remaining()
            if labelled and left is not None and left < self._slowest_labelled:
                return self.lower_bound(cand, labelled=False)
            began = time.perf_counter()
            self._bounds[key] = self.model.lower_bound(self.tables, cand, labelled=labelled,
                                                       enough=self.options.cutoff)
            if labelled:
                self._slowest_labelled = max(self._slowest_labelled, time.perf_counter() - began)
        return self._bounds[key]

    def chunks(self, cand: Candidate) -> tuple[int, ...] | None:
        """With virtual stages, the candidate's layer chunks (the search does not move them), else
        None: the partition is the search's to choose."""
        if cand.virtual_stages == 1:
            return None
        return cand.chunks or even_partition(self.instance, cand.pp * cand.virtual_stages, exact=True)

    def partition(self, cand: Candidate, boundaries) -> tuple[int, ...]:
        """A plan's partition from stage boundaries in stage order (the chunks with interleaving)."""
        return self.chunks(cand) or tuple(boundaries)

    def stage_boundaries(self, cand: Candidate, partition) -> tuple[int, ...]:
        """A plan's stage boundaries in stage order (its partition, or its chunks made contiguous)."""
        return tuple(partition) if cand.virtual_stages == 1 else stage_order(partition, cand.pp)[1]

    def stage_costs(self, cand: Candidate, stages):
        return self.model.stage_costs(self.tables, cand, stages, chunks=self.chunks(cand))

    def plan(self, cand: Candidate, partition, stages) -> Plan:
        """A candidate's plan at a partition and device groups (:func:`~amp_opt.model.costs.plan_of`)."""
        return plan_of(self.model, self.tables, cand, partition, stages, chunks=self.chunks(cand))

    def evaluate(self, plan: Plan) -> Evaluation:
        """The one evaluator, with this search's cost model and tables."""
        return evaluate(self.instance, plan, self.model, tables=self.tables)
