"""The CP-SAT backend (OR-Tools): a program in CP-SAT's integers, solved in a helper thread.

CP-SAT works on integers: every variable in seconds becomes an integer count of the
resolution ``delta`` (about 1e-8 of the plan's time, :func:`.protocol.resolution_for`) and every
row in seconds is divided by ``delta`` with its coefficients rounded; rows in bytes are rounded
to whole bytes.  A rounded coefficient is off by at most delta/2, so the integer objective
differs from the exact one by at most ``terms * delta / 2`` (``Formulation.terms``); the plan is
always re-scored in floating point by the evaluator.

It stops early on a stop request (:mod:`amp_opt.search.stop`: SIGINT, SIGTERM): CP-SAT solves in
a helper thread while the caller polls the request and calls ``stop_search`` (CP-SAT's own SIGINT
handler is off: ``catch_sigint_signal``), so it returns its best solution.
"""

from __future__ import annotations

import math
import threading
import time

from .. import stop
from ..clock import Clock
from ..tuning import SOLVER_FLOOR
from .linear import TIME, LinearModel
from .protocol import Outcome, Program, Settings


class _NoTime(Exception):
    """The deadline passed while a program was being handed to its solver."""


def _cpsat_model(lm: LinearModel, delta: float, cutoff: float | None, clock: Clock):
    """The LinearModel in CP-SAT's integers: seconds as counts of ``delta``, rows rounded.

    Raises :class:`_NoTime` once ``clock`` has run out: a program of 16,384 GPUs takes seconds to
    hand over, longer than the last second of a time limit.
    """
    from ortools.sat.python import cp_model  # heavy: imported when a CP-SAT program runs

    model = cp_model.CpModel()
    xs = []
    for v in lm.vars:
        if v.kind == TIME:
            xs.append(model.new_int_var(math.floor(v.lb / delta), math.ceil(v.ub / delta) + 1, v.name))
        else:  # rounded outwards: a row's coefficients are rounded to the nearest integer, and a byte
            # count's bound equal to one of them (a stage's largest buffer) must still reach it
            xs.append(model.new_int_var(math.floor(v.lb), math.ceil(v.ub), v.name))
    for n, row in enumerate(lm.rows):
        if n % 256 == 0 and clock.out_of_time():
            raise _NoTime
        terms, rhs = [], row.rhs
        for i, c in row.coeffs.items():
            if i < 0:
                continue
            if row.unit == "time" and lm.vars[i].kind != TIME:
                c = c / delta
            terms.append((int(round(c)), xs[i]))
        if row.unit == "time":
            rhs = rhs / delta
        rhs = int(round(rhs))
        expr = sum(c * x for c, x in terms if c != 0)
        if isinstance(expr, int):  # no variables left
            continue
        if row.sense == "<=":
            model.add(expr <= rhs)
        elif row.sense == ">=":
            model.add(expr >= rhs)
        else:
            model.add(expr == rhs)
    k = lm.objective_scale  # whole coefficients: the objective in units of delta / k
    objective = sum(int(round(c * k)) * xs[i] for i, c in lm.objective.items())
    if cutoff is not None:
        model.add(objective <= int(math.floor(cutoff * k / delta)))
    model.minimize(objective)
    for i, value in lm.hint.items():
        v = lm.vars[i]
        model.add_hint(xs[i], int(round(value / delta)) if v.kind == TIME else int(round(value)))
    return model, xs


def solve(program: Program, clock: Clock, settings: Settings) -> Outcome:
    """Solve with CP-SAT by ``clock`` (the backend protocol, :mod:`.protocol`)."""
    from ortools.sat.python import cp_model  # heavy: imported when a CP-SAT program runs

    lm, delta = program.model, program.delta
    start = time.perf_counter()
    try:
        model, xs = _cpsat_model(lm, delta, program.cutoff, clock)
    except _NoTime:  # no time left to solve it: no plan, no proof
        return Outcome("UNKNOWN", None, None, None, time.perf_counter() - start)
    except (OverflowError, TypeError) as exc:  # a coefficient beyond CP-SAT's 64-bit integers
        return Outcome("UNKNOWN", None, None, None, time.perf_counter() - start,
                       rejected=f"not representable: {exc}"[:200])
    solver = cp_model.CpSolver()
    progress = _CpsatProgress(delta, lm.objective_scale)
    params = solver.parameters
    params.num_workers = settings.workers
    params.random_seed = settings.seed
    if settings.workers == 1:
        params.interleave_search = False
    # CP-SAT's own symmetry handling off: in OR-Tools 9.15 it declared a feasible program
    # infeasible under an objective cutoff (a DeepSpeed per-stage program whose plan every other
    # backend and the enumerator found; right with symmetry_level 0, wrong with 1 and 2; see
    # or-tools issues 3483 and 5274).  The programs break their node symmetries themselves (M12).
    params.symmetry_level = 0
    # Presolve's inclusion detection off: with it, OR-Tools 9.15 certified a worse plan optimal under
    # a cutoff (the H13 program of the same DeepSpeed instance: 0.54457 s "optimal" where 0.53758 s is
    # feasible and found with this limit at 0, with probing off or without presolve; or-tools issue
    # 5293 names this switch).
    params.presolve_inclusion_work_limit = 0
    left = clock.remaining()
    if left is not None:  # what is left of it once the model is built
        params.max_time_in_seconds = max(SOLVER_FLOOR, left)
    params.catch_sigint_signal = False  # signals are amp_opt's to handle (module doc)
    code = _solve_stoppable(solver, model, progress)
    wall = time.perf_counter() - start
    nodes, points = int(solver.num_branches), progress.points
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        values = {i: float(solver.value(x)) * (delta if lm.vars[i].kind == TIME else 1.0) for i, x in enumerate(xs)}
        status = "OPTIMAL" if code == cp_model.OPTIMAL else "FEASIBLE"
        k = lm.objective_scale
        return Outcome(status, values, solver.objective_value * delta / k, solver.best_objective_bound * delta / k, wall,
                       nodes, points)
    if code == cp_model.INFEASIBLE:
        return Outcome("INFEASIBLE", None, None, None, wall, nodes, points)
    if solver.status_name(code) == "MODEL_INVALID":  # e.g. sums that could overflow 64 bits: no proof, no plan
        return Outcome("UNKNOWN", None, None, None, wall, nodes, points,
                       rejected=f"CP-SAT rejected the model: {model.validate()}"[:200])
    return Outcome("UNKNOWN", None, None, None, wall, nodes, points)


def _CpsatProgress(delta: float, scale: int = 1):
    """A CP-SAT solution callback recording (clock, objective, bound) in seconds per improving solution."""
    from ortools.sat.python import cp_model

    class Progress(cp_model.CpSolverSolutionCallback):
        def __init__(self):
            super().__init__()
            self.points = []

        def on_solution_callback(self):
            self.points.append((time.perf_counter(), self.objective_value * delta / scale,
                                self.best_objective_bound * delta / scale))

    return Progress()


def _solve_stoppable(solver, model, callback=None):
    """``solver.solve(model, callback)`` in a helper thread; this thread polls for a stop request
    and passes it on with ``stop_search`` (CP-SAT then returns its best solution so far)."""
    out: dict = {}

    def work():
        try:
            out["code"] = solver.solve(model, callback)
        except BaseException as exc:  # pragma: no cover - re-raised in the caller
            out["error"] = exc

    if stop.requested():
        solver.parameters.max_time_in_seconds = 0.0
    thread = threading.Thread(target=work, name="amp_opt-cpsat", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(stop.POLL)
            if stop.requested():
                solver.stop_search()
    except BaseException:  # KeyboardInterrupt (a second signal): stop the solver before leaving
        solver.stop_search()
        thread.join()
        raise
    if "error" in out:
        raise out["error"]
    return out["code"]
