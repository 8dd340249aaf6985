"""One search's state: its instance and options, the tables it derives, and its clock.

A :class:`Search` is created by :func:`amp_opt.solve` and handed to every solver it runs
(``auto`` runs the enumerator, then a MIP, on the same one), so derived tables and
candidate bounds are computed once per solve and owned by it, not hidden on the instance.
"""

from __future__ import annotations

import time

from ..model.candidates import even_partition
from ..model.costs.terms import stage_order
from ..model.evaluate import Evaluation, evaluate
from ..model.plan import Candidate, Plan
from ..model.tables import Tables
from .options import SolveOptions


class Search:
    """The instance, the options, the derived tables and the deadline of one solve."""

    def __init__(self, instance, options: SolveOptions):
        self.instance, self.options = instance, options
        self.model = options.model
        self.tables = Tables(instance)
        self.start = time.perf_counter()
        self.deadline = None if options.time_limit is None else self.start + options.time_limit
        self._bounds: dict[tuple, float] = {}

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

    def chunks(self, cand: Candidate) -> tuple[int, ...] | None:
        """With virtual stages, the layer chunks (Megatron's even split; the search does not move
        them), else None: the partition is the search's to choose."""
        return even_partition(self.instance, cand.pp * cand.virtual_stages, exact=True) \
            if cand.virtual_stages > 1 else None

    def partition(self, cand: Candidate, bounds) -> tuple[int, ...]:
        """A plan's partition from stage boundaries in stage order (the chunks with interleaving)."""
        return self.chunks(cand) or tuple(bounds)

    def stage_bounds(self, cand: Candidate, partition) -> tuple[int, ...]:
        """A plan's stage boundaries in stage order (its partition, or its chunks made contiguous)."""
        return tuple(partition) if cand.virtual_stages == 1 else stage_order(partition, cand.pp)[1]

    def stage_costs(self, cand: Candidate, stages):
        return self.model.stage_costs(self.tables, cand, stages, chunks=self.chunks(cand))

    def evaluate(self, plan: Plan) -> Evaluation:
        """The one evaluator, with this search's cost model and tables."""
        return evaluate(self.instance, plan, self.model, tables=self.tables)
