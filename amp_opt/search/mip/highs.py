"""The HiGHS backend (through highspy), and LP relaxations solved with HiGHS.

HiGHS takes the model as CBC does (:func:`.protocol.scaled_rows`): continuous seconds divided by the
program's scale (so that the objective is about 1) and every row divided by its largest
coefficient, which keeps HiGHS's absolute tolerances meaningful on a 10 ms plan as on a
100 s one.  It runs in-process with one thread, a fixed seed, ``mip_rel_gap`` = 0
(HiGHS's default of 1e-4 would stop short of proving optimality) and
``mip_abs_gap`` = 1e-8 of the scale and feasibility tolerances of 1e-9; the cutoff is HiGHS's ``objective_bound`` (nodes
and solutions worse than it are pruned; no solution under it ends as infeasible).  The
warm start is ``setSolution`` (checked by HiGHS and used as the first incumbent when
feasible); improving solutions are recorded through the ``cbMipImprovingSolution``
callback with HiGHS's dual bound at that moment.

:func:`solve_lp` solves the program's linear relaxation (every variable continuous) and
returns its optimum in seconds: the root LP bound that ``benchmarks/lp_bounds.py``
compares between the prefix and the assignment formulations.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

import numpy as np

from ...errors import InputError
from .. import stop
from ..clock import NO_LIMIT, Clock
from ..tuning import GRACE, SOLVER_FLOOR
from .linear import BIN, INT, LinearModel
from .protocol import Outcome, Program, Settings, scaled_rows

ABS_GAP = 1e-8  # HiGHS's absolute MIP gap, in units of the scale (the objective is about 1)
# Row violations HiGHS accepts (rows are divided by their largest coefficient).  Its defaults
# (1e-6 for MIP solutions) let a solution's objective sit 1e-6 below its plan's exact value,
# which is the tolerance at which amp_opt calls a value proven.
FEASIBILITY = 1e-9


def _highspy():
    try:
        import highspy
    except ImportError:
        raise InputError("--solver", "the HiGHS backend needs highspy: pip install 'amp_opt[highs]'") from None
    return highspy


def _arrays(lm: LinearModel, scale: float):
    """The model as HiGHS arrays (row-wise), in the units and scaling of :func:`.backends.scaled_rows`."""
    n = len(lm.vars)
    units, rows = scaled_rows(lm, scale)
    unit = np.array(units)
    lower = np.array([v.lb for v in lm.vars], dtype=float) / unit
    upper = np.array([v.ub for v in lm.vars], dtype=float) / unit
    cost = np.zeros(n)
    for i, c in lm.objective.items():
        cost[i] = c  # objective in seconds over time variables: in units of scale it keeps its coefficients
    starts, index, value, row_lo, row_hi = [0], [], [], [], []
    for coeffs, sense, rhs in rows:
        for i, c in sorted(coeffs.items()):
            index.append(i)
            value.append(c)
        starts.append(len(index))
        row_lo.append(rhs if sense in (">=", "==") else -np.inf)
        row_hi.append(rhs if sense in ("<=", "==") else np.inf)
    integrality = np.array([1 if v.kind in (BIN, INT) else 0 for v in lm.vars], dtype=np.int32)
    return (n, len(lm.rows), len(index), cost, lower, upper, np.array(row_lo), np.array(row_hi),
            np.array(starts, dtype=np.int32), np.array(index, dtype=np.int32), np.array(value), integrality, unit)


@contextlib.contextmanager
def _quiet_stdout():
    """Point file descriptor 1 at /dev/null for the block (``--json`` output stays JSON)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _highs(lm: LinearModel, scale: float, relax: bool, seed: int, workers: int, time_limit: float | None):
    highspy = _highspy()
    with _quiet_stdout():  # highspy's constructor prints a banner on fd 1 whatever output_flag says
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", int(workers))
    h.setOptionValue("random_seed", int(seed) % 2**31)  # HiGHS takes 0 .. 2^31-1
    h.setOptionValue("mip_feasibility_tolerance", FEASIBILITY)
    h.setOptionValue("primal_feasibility_tolerance", FEASIBILITY)
    if time_limit is not None:
        h.setOptionValue("time_limit", max(0.01, float(time_limit)))
    n, m, nnz, cost, lower, upper, row_lo, row_hi, starts, index, value, integrality, unit = _arrays(lm, scale)
    inf = highspy.kHighsInf
    row_lo = np.where(np.isfinite(row_lo), row_lo, -inf)
    row_hi = np.where(np.isfinite(row_hi), row_hi, inf)
    if relax:
        integrality = np.zeros(n, dtype=np.int32)
    status = h.passModel(n, m, nnz, int(highspy.MatrixFormat.kRowwise), int(highspy.ObjSense.kMinimize), 0.0,
                         cost, lower, upper, row_lo, row_hi, starts[:-1] if m else starts[:0], index, value,
                         integrality)
    if status == highspy.HighsStatus.kError:
        raise RuntimeError("HiGHS rejected the model")
    return highspy, h, unit


def solve(program: Program, clock: Clock, settings: Settings) -> Outcome:
    """Solve with HiGHS by ``clock`` (the backend protocol, :mod:`.protocol`); the program's cutoff
    keeps only solutions at most that good."""
    start = time.perf_counter()
    lm, cutoff, scale = program.model, program.cutoff, program.scale or 1.0
    highspy, h, unit = _highs(lm, scale, False, settings.seed, settings.workers, None)
    h.setOptionValue("mip_rel_gap", 0.0)
    h.setOptionValue("mip_abs_gap", ABS_GAP)
    if cutoff is not None:
        h.setOptionValue("objective_bound", float(cutoff) / scale * (1 + 1e-9))
    if lm.hint:
        idx = np.array(sorted(lm.hint), dtype=np.int32)
        vals = np.array([min(max(lm.hint[i], lm.vars[i].lb), lm.vars[i].ub) for i in idx]) / unit[idx]
        h.setSolution(len(idx), idx, vals)
    points = []
    latest = []  # HiGHS's latest improving solution (its own units), for a run that must be left

    def improving(event):
        out = event.data_out
        bound = out.mip_dual_bound
        points.append((time.perf_counter(), out.objective_function_value * scale,
                       bound * scale if np.isfinite(bound) else None))
        latest[:] = [np.array(out.mip_solution, dtype=float)]

    h.cbMipImprovingSolution.subscribe(improving)
    left = clock.remaining()
    if left is not None:  # what is left once the model is built
        h.setOptionValue("time_limit", max(SOLVER_FLOOR, left))
    _stop_when_asked(h, clock)
    if not _run(h, clock):  # HiGHS did not return in time: keep the promise with what it found
        return _left_running(lm, latest, unit, points, time.perf_counter() - start)
    wall = time.perf_counter() - start
    model_status = h.getModelStatus()
    info = h.getInfo()
    nodes = int(info.mip_node_count) if info.mip_node_count >= 0 else None
    dual = info.mip_dual_bound
    bound = dual * scale if np.isfinite(dual) and abs(dual) < highspy.kHighsInf else None
    MS = highspy.HighsModelStatus
    if model_status in (MS.kInfeasible, MS.kObjectiveBound):
        return Outcome("INFEASIBLE", None, None, None, wall, nodes, points)
    has_solution = info.primal_solution_status == highspy.kSolutionStatusFeasible
    if not has_solution:
        return Outcome("UNKNOWN", None, None, bound, wall, nodes, points)
    x = np.asarray(h.getSolution().col_value) * unit
    values = {i: float(x[i]) for i in range(len(lm.vars))}
    objective = sum(c * values[i] for i, c in lm.objective.items())
    if model_status == MS.kOptimal and cutoff is not None and objective > cutoff * (1 + 1e-9) + ABS_GAP * scale:
        # HiGHS keeps a solution its heuristics found above objective_bound and calls it optimal once
        # everything under the bound is pruned: what is proven is that nothing beats the cutoff.
        return Outcome("INFEASIBLE", None, None, None, wall, nodes, points)
    if model_status == MS.kOptimal:
        return Outcome("OPTIMAL", values, objective, objective if bound is None else min(bound, objective), wall,
                       nodes, points)
    return Outcome("FEASIBLE", values, objective, bound, wall, nodes, points)


def _left_running(lm: LinearModel, latest: list, unit, points: list, wall: float) -> Outcome:
    """The outcome of a HiGHS run left running past its deadline: its latest improving solution
    (FEASIBLE, with the last dual bound it reported) or nothing (UNKNOWN)."""
    if not latest:
        return Outcome("UNKNOWN", None, None, None, wall, None, points)
    x = latest[0] * unit
    values = {i: float(x[i]) for i in range(len(lm.vars))}
    objective = sum(c * values[i] for i, c in lm.objective.items())
    bounds = [b for _, _, b in points if b is not None]
    return Outcome("FEASIBLE", values, objective, bounds[-1] if bounds else None, wall, None, points)


def _run(h, clock: Clock) -> bool:
    """``h.run()`` in a helper thread; False if it had not returned by the clock's deadline (or a stop).

    The interrupt callbacks stop HiGHS at its next callback; parts of it have none (the presolve
    of a heuristic's sub-MIP has run 45 s past the limit), so the caller stops waiting at the
    deadline plus :data:`GRACE` and leaves the thread, a daemon, to end at that next callback.
    """
    thread = threading.Thread(target=h.run, name="amp_opt-highs", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(stop.POLL)
        if stop.requested() or (clock.deadline is not None and time.perf_counter() > clock.deadline + GRACE):
            thread.join(GRACE)
            return not thread.is_alive()
    return True


def _stop_when_asked(h, clock: Clock) -> None:
    """Interrupt HiGHS from its own callbacks at the deadline or on a stop request (SIGINT/SIGTERM).

    HiGHS's ``time_limit`` alone is not enough: it is checked between phases, and a long
    simplex solve inside a node has run past it by tens of seconds (bench rows TIMEOUT).
    """
    def check(event):
        if clock.out_of_time():
            event.interrupt()

    for callback in (h.cbSimplexInterrupt, h.cbIpmInterrupt, h.cbMipInterrupt):
        callback.subscribe(check)


def solve_lp(lm: LinearModel, scale: float = 1.0, time_limit: float | None = None) -> float | None:
    """The optimum of the program's linear relaxation in seconds (None if HiGHS did not reach it)."""
    highspy, h, _ = _highs(lm, scale, True, 0, 1, time_limit)
    _stop_when_asked(h, NO_LIMIT if time_limit is None else NO_LIMIT.within(time_limit))
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    return float(h.getInfo().objective_function_value) * scale
