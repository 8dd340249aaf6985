"""One search's state: its instance and options, the tables it derives, and its clock.

A :class:`Search` is created by :func:`amp_opt.solve` and handed to every solver it runs
(``auto`` runs the enumerator, then a MIP, on the same one), so derived tables and
candidate bounds are computed once per solve and owned by it, not hidden on the instance.
"""

from __future__ import annotations

import time

from ..model.evaluate import Evaluation, evaluate
from ..model.plan import Candidate, Plan
from ..model.tables import Tables
from .options import SolveOptions
from .trace import Trace


class Search:
    """The instance, the options, the derived tables and the deadline of one solve."""

    def __init__(self, instance, options: SolveOptions):
        self.instance, self.options = instance, options
        self.model = options.model
        self.tables = Tables(instance)
        self.start = time.perf_counter()
        self.deadline = None if options.time_limit is None else self.start + options.time_limit
        self._bounds: dict[tuple, float] = {}
        self.trace = Trace(self.start)  # best plan and proven bound over time (for the benchmark)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.perf_counter() >= self.deadline

    def remaining(self) -> float | None:
        """Seconds left before the deadline (never negative), or None without a time limit."""
        return None if self.deadline is None else max(0.0, self.deadline - time.perf_counter())

    def lower_bound(self, cand: Candidate, *, labelled: bool = True) -> float:
        """The cost model's bound on every plan of a candidate, remembered for this solve."""
        key = (cand, labelled)
        if key not in self._bounds:
            self._bounds[key] = self.model.lower_bound(self.tables, cand, labelled=labelled)
        return self._bounds[key]

    def stage_costs(self, cand: Candidate, stages):
        return self.model.stage_costs(self.tables, cand, stages)

    def evaluate(self, plan: Plan) -> Evaluation:
        """The one evaluator, with this search's cost model and tables."""
        return evaluate(self.instance, plan, self.model, tables=self.tables)
