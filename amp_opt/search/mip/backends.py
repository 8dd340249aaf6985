"""Hand a LinearModel to OR-Tools CP-SAT or to CBC (through PuLP's bundled binary).

CP-SAT works on integers: every variable in seconds becomes an integer count of
the resolution ``delta`` (about 1e-8 of the plan's time) and every row in seconds is divided by ``delta`` with
its coefficients rounded; rows in bytes are rounded to whole bytes.  A rounded
coefficient is off by at most delta/2, so the integer objective differs from
the exact one by at most ``terms * delta / 2`` (``Formulation.terms``); the plan
is always re-scored in floating point by the evaluator.

CBC takes the model as written (continuous seconds).  It runs as a child
process with a hard wall-clock limit enforced from outside (CBC does not stop
during preprocessing), a fixed seed and one thread.

Both stop early on a stop request (:mod:`amp_opt.search.stop`: SIGINT, SIGTERM).  CP-SAT
solves in a helper thread while the caller polls the request and calls ``stop_search``
(CP-SAT's own SIGINT handler is off: ``catch_sigint_signal``), so it returns its best
solution.  CBC runs in its own process group (a terminal's Ctrl-C does not reach it) and
is killed with its group on a stop, at its time limit, or on any exception; on Linux it
also dies with its parent (``PR_SET_PDEATHSIG``).  Its temporary folder is removed in every
case.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field

from .. import stop
from .model import BIN, BYTES, INT, TIME, LinearModel

CBC_WRITE_S = 1.0  # seconds (at most a tenth of its budget) CBC stops early to write its solution


@dataclass
class Outcome:
    status: str  # OPTIMAL, FEASIBLE, INFEASIBLE (no solution under the cutoff), UNKNOWN (no solution, no proof)
    values: dict[int, float] | None
    objective: float | None  # seconds
    bound: float | None  # seconds, a lower bound of the program
    wall_time: float
    nodes: int | None = None  # branch-and-bound nodes (CBC, HiGHS) or branches (CP-SAT)
    # (time.perf_counter() reading, objective in seconds, bound in seconds or None) per improving solution
    progress: list = field(default_factory=list)
    rejected: str | None = None  # why the solver could not take the program (then UNKNOWN)


def run_backend(opts, lm: LinearModel, delta: float, seconds, cutoff, scale: float) -> Outcome:
    """Solve one program with the engine of the options record (``opts.backend``)."""
    if opts.backend == "cpsat":
        return solve_cpsat(lm, delta, seconds, opts.seed, opts.workers, cutoff)
    if opts.backend == "highs":
        from .highs import solve_highs  # highspy is an optional extra

        return solve_highs(lm, seconds, opts.seed, opts.workers, cutoff, scale=scale)
    return solve_cbc(lm, seconds, opts.seed, opts.workers, cutoff, scale=scale)


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


class _NoTime(Exception):
    """The deadline passed while a program was being handed to its solver."""


def _cpsat_model(lm: LinearModel, delta: float, cutoff: float | None, deadline: float | None = None):
    """The LinearModel in CP-SAT's integers: seconds as counts of ``delta``, rows rounded.

    Raises :class:`_NoTime` once ``deadline`` (``time.perf_counter()``) has passed: a program of
    16,384 GPUs takes seconds to hand over, longer than the last second of a time limit.
    """
    from ortools.sat.python import cp_model  # heavy: imported when a CP-SAT program runs

    model = cp_model.CpModel()
    xs = []
    for v in lm.vars:
        if v.kind == TIME:
            xs.append(model.new_int_var(math.floor(v.lb / delta), math.ceil(v.ub / delta) + 1, v.name))
        else:
            xs.append(model.new_int_var(int(v.lb), int(v.ub), v.name))
    for n, row in enumerate(lm.rows):
        if n % 256 == 0 and stop.past(deadline):
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


def solve_cpsat(lm: LinearModel, delta: float, time_limit: float | None, seed: int, workers: int,
                cutoff: float | None = None, gap: float = 0.0) -> Outcome:
    """Solve with CP-SAT; ``cutoff`` (seconds) keeps only solutions at most that good."""
    from ortools.sat.python import cp_model  # heavy: imported when a CP-SAT program runs

    start = time.perf_counter()
    try:
        model, xs = _cpsat_model(lm, delta, cutoff, None if time_limit is None else start + time_limit)
    except _NoTime:  # no time left to solve it: no plan, no proof
        return Outcome("UNKNOWN", None, None, None, time.perf_counter() - start)
    except (OverflowError, TypeError) as exc:  # a coefficient beyond CP-SAT's 64-bit integers
        return Outcome("UNKNOWN", None, None, None, time.perf_counter() - start,
                       rejected=f"not representable: {exc}"[:200])
    solver = cp_model.CpSolver()
    progress = _CpsatProgress(delta, lm.objective_scale)
    params = solver.parameters
    params.num_workers = workers
    params.random_seed = seed
    if workers == 1:
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
    if time_limit is not None:  # what is left of it once the model is built
        params.max_time_in_seconds = max(0.01, time_limit - (time.perf_counter() - start))
    if gap > 0:
        params.relative_gap_limit = gap
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


def _cbc_command():
    """PuLP's CBC driver (its bundled binary); PuLP 3 warns that 4.0 moves it to an extra."""
    import pulp  # imported when a CBC program runs

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return pulp.PULP_CBC_CMD(msg=False)


def _unit(v, scale: float) -> float:
    """What one unit of a variable is worth in CBC's and HiGHS's programs: ``scale`` seconds for a
    time, the largest value for a byte count (scaled to [0, 1]: as unscaled columns beside
    coefficients of 10^9 bytes, HiGHS's presolve and CBC's probing proved feasible programs
    infeasible), 1 otherwise."""
    return scale if v.kind == TIME else (max(1.0, v.ub) if v.kind == BYTES else 1.0)


def scaled_rows(lm: LinearModel, scale: float) -> tuple[list[float], list[tuple[dict, str, float]]]:
    """What CBC and HiGHS take: per variable its unit (:func:`_unit`), and every row as (coefficients,
    sense, right-hand side) in those units (a time row in units of ``scale``: time variables keep
    their coefficients), divided by its largest coefficient."""
    units = [_unit(v, scale) for v in lm.vars]
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


def _pulp_problem(lm: LinearModel, scale: float):
    """The LinearModel as a PuLP problem (:func:`scaled_rows`), the hint as initial values."""
    import pulp  # imported when a CBC program runs

    prob = pulp.LpProblem("amp_opt", pulp.LpMinimize)
    xs = []
    units, rows = scaled_rows(lm, scale)
    for i, v in enumerate(lm.vars):
        # Binaries as bounded integers: PuLP's LpBinary resets the bounds to 0..1, losing fixings.
        cat = pulp.LpInteger if v.kind in (BIN, INT) else pulp.LpContinuous
        xs.append(prob.add_variable(f"v{i}", lowBound=v.lb / units[i], upBound=v.ub / units[i], cat=cat))
    for k, (coeffs, sense, rhs) in enumerate(rows):
        expr = pulp.lpSum(c * xs[i] for i, c in coeffs.items())
        if sense == "<=":
            prob += expr <= rhs, f"r{k}"
        elif sense == ">=":
            prob += expr >= rhs, f"r{k}"
        else:
            prob += expr == rhs, f"r{k}"
    prob += pulp.lpSum(c * xs[i] for i, c in lm.objective.items())
    for i, value in lm.hint.items():
        v = lm.vars[i]
        xs[i].setInitialValue(min(max(value, v.lb), v.ub) / units[i])
    return prob


def _cbc_args(path: str, mps: str, sol: str, mst: str | None, seed: int, workers: int, budget: float | None,
              cutoff: float | None, gap: float) -> list[str]:
    """CBC's command line for one run."""
    args = [path, mps] + (["-mips", mst] if mst else [])
    # CBC reads randomSeed 0 as "seed from the time of day": shift to keep runs repeatable.
    args += ["-randomSeed", str(seed + 1)]
    # One worker: CBC's serial code.  "-threads 1" starts its parallel code with one thread, which
    # was seen to stall exactly 10 s after a MIP start on small programs (CBC 2.10.3).
    if workers > 1:
        args += ["-threads", str(workers)]
    if budget is not None:  # stop a little early so that CBC can write its best solution
        args += ["-sec", f"{max(0.05, budget - min(CBC_WRITE_S, 0.1 * budget)):.3f}"]
    if gap > 0:
        args += ["-ratioGap", str(gap)]
    if cutoff is not None:  # CBC prunes nodes worse than this (safer than a row, numerically)
        args += ["-cutoff", repr(cutoff * (1 + 1e-6))]
    # CBC's default cutoff increment (solutions must improve by it; nodes within it are pruned) is
    # derived from the objective and was seen to prune the optimum by 2.5e-5 relative: keep it
    # far below the 1e-6 at which amp_opt counts two values as equal (the objective is about 1).
    args += ["-increment", "1e-8"]
    return args + ["-timeMode", "elapsed", "-solve", "-printingOptions", "all", "-solution", sol]


def solve_cbc(lm: LinearModel, time_limit: float | None, seed: int, workers: int,
              cutoff: float | None = None, gap: float = 0.0, scale: float | None = None) -> Outcome:
    """Solve with CBC in a child process killed at the time limit.

    Times are divided by ``scale`` (the expected objective, so that it is about 1) and
    every row by its largest coefficient: CBC's absolute tolerances then mean the same
    on a 10 ms plan as on a 100 s one.
    """
    start = time.perf_counter()
    scale = scale or 1.0
    prob = _pulp_problem(lm, scale)
    with tempfile.TemporaryDirectory(prefix="amp_opt_cbc_") as tmp:
        mps, sol, mst = (os.path.join(tmp, f"model.{ext}") for ext in ("mps", "sol", "mst"))
        vs, var_names, con_names, _ = prob.writeMPS(mps, rename=1)
        solver = _cbc_command()
        if lm.hint:
            solver.writesol(mst, prob, vs, var_names, con_names)
        # What is left after building the model; CBC is killed at it.
        budget = None if time_limit is None else max(0.1, time_limit - (time.perf_counter() - start))
        args = _cbc_args(solver.path, mps, sol, mst if lm.hint else None, seed, workers, budget,
                         None if cutoff is None else cutoff / scale, gap)
        launched = time.perf_counter()
        finished = _run_cbc(args, os.path.join(tmp, "cbc.log"), None if budget is None else time.perf_counter() + budget)
        with open(os.path.join(tmp, "cbc.log"), errors="replace") as fh:
            log = fh.read()
        if not finished:  # stuck in preprocessing, or stopped: the limit is enforced here
            return Outcome("UNKNOWN", None, None, _lower_bound(log, scale), time.perf_counter() - start,
                           _cbc_nodes(log), _cbc_progress(log, scale, launched))
        wall = time.perf_counter() - start
        nodes, points = _cbc_nodes(log), _cbc_progress(log, scale, launched)
        if not os.path.exists(sol):
            verdict = "INFEASIBLE" if "infeasible" in log.lower() else "UNKNOWN"
            return Outcome(verdict, None, None, _lower_bound(log, scale), wall, nodes, points)
        with open(sol) as fh:
            head = fh.readline().strip().lower()
        # First line of CBC's solution file: "Optimal - objective value ...", "Infeasible - ...",
        # "Integer infeasible - ...", "Stopped on time - objective value ..." or
        # "Stopped on ... (no integer solution - continuous used)".
        if "infeasible" in head:
            return Outcome("INFEASIBLE", None, None, None, wall, nodes, points)
        if not (head.startswith("optimal") or (head.startswith("stopped") and "no integer solution" not in head)):
            return Outcome("UNKNOWN", None, None, _lower_bound(log, scale), wall, nodes, points)
        _, values, *_ = solver.readsol_MPS(sol, prob, vs, var_names, con_names)
    # A variable in no row and not in the objective is not written to the MPS file, so CBC's
    # solution lacks it: any value in its bounds does, its lower bound here.
    result = {i: float(values[f"v{i}"]) * _unit(lm.vars[i], scale) if f"v{i}" in values else float(lm.vars[i].lb)
              for i in range(len(lm.vars))}
    obj = sum(c * result[i] for i, c in lm.objective.items())
    if head.startswith("optimal"):
        return Outcome("OPTIMAL", result, obj, obj, wall, nodes, points)
    return Outcome("FEASIBLE", result, obj, _lower_bound(log, scale), wall, nodes, points)


# CBC's log lines for an improving solution and for progress (objective in the scaled units):
#   Cbc0012I Integer solution of 1.0234 found by DiveCoefficient after 12 iterations and 0 nodes (0.05 seconds)
#   Cbc0004I Integer solution of 1.0100 found after 50 iterations and 3 nodes (0.10 seconds)
#   Cbc0010I After 100 nodes, 5 on tree, 1.01 best solution, best possible 0.99 (1.20 seconds)
_CBC_SOLUTION = re.compile(r"Integer solution of\s+([-+0-9.eE]+)\s+found.*?\(([0-9.]+) seconds\)")
_CBC_PROGRESS = re.compile(r"best possible\s+([-+0-9.eE]+)\s+\(([0-9.]+) seconds\)")
_CBC_NODES = re.compile(r"Enumerated nodes:\s+(\d+)")


def _cbc_progress(log: str, scale: float, launched: float) -> list:
    """(clock, objective s, bound s or None) per improving solution in CBC's log; CBC's own seconds are
    counted from its launch."""
    points, bound = [], None
    for line in log.splitlines():
        found = _CBC_PROGRESS.search(line)
        if found:
            bound = float(found.group(1)) * scale
        found = _CBC_SOLUTION.search(line)
        if found:
            points.append((launched + float(found.group(2)), float(found.group(1)) * scale, bound))
    return points


def _cbc_nodes(log: str) -> int | None:
    found = _CBC_NODES.search(log)
    return int(found.group(1)) if found else None


def _run_cbc(args: list[str], log_path: str, deadline: float | None) -> bool:
    """Run CBC in its own process group, output to ``log_path``; True if it finished by itself,
    False if it was killed (deadline passed or a stop was requested).  Never leaves it running."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=_death_signal())
    try:
        while True:
            try:
                proc.wait(timeout=stop.POLL)
                return True
            except subprocess.TimeoutExpired:
                if stop.past(deadline):
                    return False
    finally:
        if proc.poll() is None:
            _kill_group(proc)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait()


def _death_signal():
    """A function for the child, between fork and exec, that asks Linux to SIGKILL it when its
    parent dies (PR_SET_PDEATHSIG), even if the parent is killed outright; None elsewhere.
    libc is loaded here, in the parent: the child only makes the call."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG


def _lower_bound(log: str, scale: float = 1.0) -> float | None:
    match = re.search(r"Lower bound:\s*([-+0-9.eE]+)", log)
    return float(match.group(1)) * scale if match else None
