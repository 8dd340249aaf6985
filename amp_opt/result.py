"""What a solver returns: the best plan's evaluation, the runners-up, and solver stats."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .cost import Evaluation


@dataclass(frozen=True)
class SolverStats:
    name: str
    status: str  # OPTIMAL, FEASIBLE, INFEASIBLE, UNKNOWN
    wall_time: float  # seconds, the whole search
    objective: float  # the solver's own value of its best plan (seconds)
    bound: float  # a proven lower bound on the optimum (seconds)
    extra: dict[str, Any] = field(default_factory=dict)  # model sizes, candidate counts

    @property
    def gap(self) -> float:
        if self.objective <= 0:
            return 0.0
        return max(0.0, (self.objective - self.bound) / self.objective)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "wall_time": self.wall_time,
            "objective": self.objective,
            "bound": self.bound,
            "gap": self.gap,
            **self.extra,
        }


@dataclass(frozen=True)
class SolveResult:
    best: Evaluation
    top: tuple[Evaluation, ...]  # best first; top[0] is best
    solver: SolverStats

    def to_json(self, instance, with_top: bool = False) -> dict[str, Any]:
        out = self.best.to_json(instance)
        out["solver"] = self.solver.to_json()
        if with_top:
            out["top"] = [e.to_json(instance) for e in self.top]
        return out
