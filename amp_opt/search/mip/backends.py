"""The MIP backends behind one signature, by name: CP-SAT, CBC (PuLP's binary), HiGHS (highspy).

Each takes one program, one clock and the solver settings, and returns an outcome
(:mod:`.protocol` states the records)::

    solve(program: Program, clock: Clock, settings: Settings) -> Outcome

:data:`BACKENDS` maps ``SolveOptions.backend`` to it (:mod:`.cpsat`, :mod:`.cbc`,
:mod:`.highs`); the MIP driver calls :func:`run_backend`.  A new backend is a module with such
a ``solve`` and one entry here (and a variant in :mod:`amp_opt.search.registry`).  Every
backend stops at its clock's deadline and on a stop request (:mod:`amp_opt.search.stop`).
"""

from __future__ import annotations

from ..clock import Clock
from . import cbc, cpsat, highs
from .protocol import Backend, Outcome, Program, Settings, resolution_for

BACKENDS: dict[str, Backend] = {"cpsat": cpsat.solve, "cbc": cbc.solve, "highs": highs.solve}

__all__ = ["BACKENDS", "Backend", "Outcome", "Program", "Settings", "resolution_for", "run_backend"]


def run_backend(name: str, program: Program, clock: Clock, settings: Settings) -> Outcome:
    """Solve one program with the backend called ``name`` (a key of :data:`BACKENDS`)."""
    return BACKENDS[name](program, clock, settings)
