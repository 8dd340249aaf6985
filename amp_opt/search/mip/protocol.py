"""What a MIP backend takes and returns: one program, one clock, the solver settings.

Every backend (:mod:`.cpsat`, :mod:`.cbc`, :mod:`.highs`; the registry is
:data:`amp_opt.search.mip.backends.BACKENDS`) is a function

    solve(program: Program, clock: Clock, settings: Settings) -> Outcome

* :class:`Program`: the :class:`~.model.LinearModel` in seconds and bytes, its ``scale`` (the
  expected objective, seconds: CBC and HiGHS divide times by it so that the objective is about 1,
  :func:`scaled_rows`), CP-SAT's time unit ``delta`` (:func:`resolution_for`) and the ``cutoff``
  (seconds, or None): only solutions at most that good are of interest.
* :class:`~amp_opt.search.clock.Clock`: the program's share of the search's time.  The backend
  turns it into seconds for its solver (and no one else does), after building its own model
  from the program, and stops on a stop request (:mod:`amp_opt.search.stop`).
* :class:`Settings`: the seed and the worker threads, fixed so that runs repeat.
* :class:`Outcome`: the status, the values of the variables (seconds and bytes), the objective
  and the proven bound in seconds, the progress on the search's clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from ..clock import Clock
from .linear import BYTES, TIME, LinearModel


@dataclass(frozen=True)
class Program:
    """One candidate's program, as every backend takes it."""

    model: LinearModel
    scale: float = 1.0  # seconds: the expected objective (CBC and HiGHS divide times by it)
    delta: float = 1e-8  # seconds: CP-SAT's time unit (resolution_for)
    cutoff: float | None = None  # seconds: only solutions at most this good


@dataclass(frozen=True)
class Settings:
    """The solver settings every backend takes (fixed so that runs repeat)."""

    seed: int = 0
    workers: int = 1


@dataclass
class Outcome:
    """How one program's solve ended (seconds throughout)."""

    status: str  # OPTIMAL, FEASIBLE, INFEASIBLE (no solution under the cutoff), UNKNOWN (no solution, no proof)
    values: dict[int, float] | None
    objective: float | None  # seconds
    bound: float | None  # seconds, a lower bound of the program
    wall_time: float
    nodes: int | None = None  # branch-and-bound nodes (CBC, HiGHS) or branches (CP-SAT)
    # (time.perf_counter() reading, objective in seconds, bound in seconds or None) per improving solution
    progress: list = field(default_factory=list)
    rejected: str | None = None  # why the solver could not take the program (then UNKNOWN)


class Backend(Protocol):
    """The one signature of a MIP backend (module doc)."""

    def __call__(self, program: Program, clock: Clock, settings: Settings) -> Outcome: ...


def resolution_for(scale: float, model: LinearModel | None = None) -> float:
    """CP-SAT's time unit (seconds): a power of ten near 1e-8 of the problem's scale, coarser
    if needed so that no time coefficient exceeds 1e9 units.

    Finer units or larger coefficients make CP-SAT's linear relaxation lose exactness
    (seen: a wrong "optimal" with coefficients of 5e10 units).
    """
    delta = 10.0 ** math.floor(math.log10(max(scale, 1e-12) * 1e-8))
    if model is not None:
        largest = max((abs(c) for row in model.rows if row.unit == "time"
                       for i, c in list(row.coeffs.items()) + [(-1, row.rhs)]
                       if i < 0 or model.vars[i].kind != TIME), default=0.0)
        if largest > 0:
            delta = max(delta, 10.0 ** math.ceil(math.log10(largest / 1e9)))
    return delta


def unit_of(v, scale: float) -> float:
    """What one unit of a variable is worth in CBC's and HiGHS's programs: ``scale`` seconds for a
    time, the largest value for a byte count (scaled to [0, 1]: as unscaled columns beside
    coefficients of 10^9 bytes, HiGHS's presolve and CBC's probing proved feasible programs
    infeasible), 1 otherwise."""
    return scale if v.kind == TIME else (max(1.0, v.ub) if v.kind == BYTES else 1.0)


def scaled_rows(lm: LinearModel, scale: float) -> tuple[list[float], list[tuple[dict, str, float]]]:
    """What CBC and HiGHS take: per variable its unit (:func:`unit_of`), and every row as (coefficients,
    sense, right-hand side) in those units (a time row in units of ``scale``: time variables keep
    their coefficients), divided by its largest coefficient."""
    units = [unit_of(v, scale) for v in lm.vars]
    rows = []
    for row in lm.rows:
        coeffs = {i: c * units[i] if lm.vars[i].kind == BYTES else c for i, c in row.coeffs.items() if i >= 0}
        rhs = row.rhs
        if row.unit == "time":
            coeffs = {i: (c if lm.vars[i].kind == TIME else c / scale) for i, c in coeffs.items()}
            rhs = rhs / scale
        norm = max((abs(c) for c in coeffs.values()), default=1.0) or 1.0
        rows.append(({i: c / norm for i, c in coeffs.items()}, row.sense, rhs / norm))
    return units, rows
