"""What a search finds and returns: incumbents inside it, a documented result record outside.

:class:`Incumbent` is a plan found during a search (the one record every solver and
phase passes around); :class:`SolveResult` is what :func:`amp_opt.solve` returns: the
best plan's evaluation, the runners-up and the solver's statistics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..model.evaluate import Evaluation
from ..model.plan import Candidate, Plan, Stages


SAME = 1e-6  # relative: a bound this close below a plan's value proves it (the evaluator's resolution)


def status_of(objective: float, bound: float) -> str:
    """OPTIMAL when the proven bound reaches the objective within SAME, else FEASIBLE: the one rule."""
    return "OPTIMAL" if bound >= objective * (1 - SAME) else "FEASIBLE"


@dataclass(frozen=True)
class Incumbent:
    """A plan found by a search, with its value under the search's cost model (seconds).

    ``objective`` is the solver's own value of the plan when it differs from ``value``
    (a program's value of a plan it stopped at may keep slack that re-scoring removes).
    ``modes``: each stage's recomputation mode, for a ``per_stage`` candidate.
    """

    value: float
    candidate: Candidate
    boundaries: tuple[int, ...]
    stages: Stages
    objective: float | None = None
    modes: tuple[str, ...] | None = None

    @classmethod
    def of_plan(cls, value: float, cand: Candidate, plan: Plan, objective: float | None = None) -> "Incumbent":
        """The incumbent of a candidate's plan (its partition, devices and stage modes)."""
        modes = tuple(plan.recompute_of(s) for s in range(plan.pp)) if cand.per_stage else None
        return cls(value, cand, plan.partition, plan.stages, objective, modes)

    @property
    def plan(self) -> Plan:
        return self.candidate.plan(self.boundaries, self.stages, modes=self.modes)

    def key(self) -> tuple:
        """Order of preference: value, then a fixed order of the layouts (deterministic ties)."""
        return (self.value, self.candidate, self.boundaries, self.stages)


class NoPlanBelow(Exception):
    """A search with a cutoff proved that no plan is faster than it (``bound``, seconds)."""

    def __init__(self, bound: float):
        super().__init__(f"no plan below {bound} s")
        self.bound = bound


@dataclass(frozen=True)
class SolverStats:
    """How a search went.  Times in seconds."""

    name: str
    status: str  # OPTIMAL, FEASIBLE, INFEASIBLE, UNKNOWN
    wall_time: float  # the whole search
    objective: float  # the solver's own value of its best plan
    bound: float  # a proven lower bound on the optimum
    extra: dict[str, Any] = field(default_factory=dict)  # model sizes, candidate counts
    # (seconds, best plan value, proven bound) whenever either moved; empty if not recorded
    trace: tuple[tuple[float, float, float], ...] = field(default=(), compare=False)
    # one dict per program the MIP driver ran: candidate, status, objective, bound, seconds, nodes, ...
    programs: tuple[dict[str, Any], ...] = field(default=(), compare=False)
    # None when the search covered every plan the evaluator accepts for the instance's search
    # section; else the plans it was limited to ("plans on whole node classes (...)"): then
    # OPTIMAL and the bound hold within those plans only
    within: str | None = None

    @property
    def gap(self) -> float:
        """(objective - bound) / objective, at least 0."""
        if self.objective <= 0:
            return 0.0
        return max(0.0, (self.objective - self.bound) / self.objective)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "wall_time": self.wall_time,
                "objective": self.objective, "bound": self.bound, "gap": self.gap,
                **({"within": self.within} if self.within else {}), **self.extra}


@dataclass(frozen=True)
class SolveResult:
    """The result of :func:`amp_opt.solve`.

    Attributes
    ----------
    best : Evaluation
        The best plan, scored by the evaluator.
    top : tuple of Evaluation
        The best plans, best first (``top[0]`` is ``best``); more than one with ``top_k``.
    solver : SolverStats
        Status (OPTIMAL, FEASIBLE), objective, proven bound and gap, wall time, model sizes.
    """

    best: Evaluation
    top: tuple[Evaluation, ...]
    solver: SolverStats

    def to_json(self, instance, *, with_top: bool = False) -> dict[str, Any]:
        out = self.best.to_json(instance)
        out["solver"] = self.solver.to_json()
        if with_top:
            out["top"] = [e.to_json(instance) for e in self.top]
        return out
