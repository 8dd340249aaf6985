"""A small solver-neutral linear model: variables, rows, objective, hint.

The formulation (``formulation.py``) is written once against this record and
handed to either backend (``backends.py``): CP-SAT, which needs integers and
scales each row by its unit, or CBC through PuLP, which takes it as written.
"""

from __future__ import annotations

from dataclasses import dataclass, field

BIN, INT, TIME = "bin", "int", "time"  # TIME: seconds (an integer count of the resolution in CP-SAT)
# BYTES: a byte count, such as a stage's largest buffer: an integer in CP-SAT (which has no other
# kind), continuous and scaled to [0, 1] for CBC and HiGHS, where an integer of up to 10^10 with
# tolerances of 1e-9 made HiGHS's presolve, and an unscaled column CBC's probing, call a feasible
# program infeasible.
BYTES = "bytes"
CONST = -1  # key of the constant term in an expression


@dataclass
class Var:
    name: str
    lb: float
    ub: float
    kind: str


@dataclass
class Row:
    coeffs: dict[int, float]
    sense: str  # "<=", ">=", "=="
    rhs: float
    unit: str  # "time" (seconds), "bytes" or "count"
    name: str


@dataclass
class LinearModel:
    vars: list[Var] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    objective: dict[int, float] = field(default_factory=dict)  # seconds
    # Multiplying the objective's coefficients by this makes them whole numbers (interleaving's 1/v
    # weights); backends that need integer coefficients scale by it and divide the value back.
    objective_scale: int = 1
    hint: dict[int, float] = field(default_factory=dict)

    def var(self, name: str, lb: float, ub: float, kind: str) -> int:
        self.vars.append(Var(name, lb, ub, kind))
        return len(self.vars) - 1

    def add(self, coeffs: dict[int, float], sense: str, rhs: float, unit: str, name: str) -> None:
        """Add ``coeffs . x  sense  rhs``; a constant term (key -1) moves to the right-hand side."""
        rhs -= coeffs.get(-1, 0.0)
        coeffs = {v: c for v, c in coeffs.items() if c != 0 and v >= 0}
        self.rows.append(Row(coeffs, sense, rhs, unit, name))

    @property
    def size(self) -> dict[str, int]:
        return {
            "variables": len(self.vars),
            "binary_variables": sum(v.kind == BIN for v in self.vars),
            "constraints": len(self.rows),
        }


def above(bound: float) -> float:
    """The upper bound of a variable that takes at most ``bound`` (seconds), set a little above it: a
    bound equal to a binary's coefficient lets a presolve, once the rows are scaled and written with
    finite digits, find that binary unable to reach 1 and fix it to 0 (CBC did, on the program over
    configurations: tests/test_graph_program.py, seed 313), and a hint's float round-off may pass it."""
    return bound * (1 + 1e-6) + 1e-12


def lin(*terms) -> dict[int, float]:
    """Sum linear expressions given as dicts or (coefficient, dict) pairs."""
    out: dict[int, float] = {}
    for term in terms:
        coef, expr = term if isinstance(term, tuple) else (1.0, term)
        for v, c in expr.items():
            out[v] = out.get(v, 0.0) + coef * c
    return out
