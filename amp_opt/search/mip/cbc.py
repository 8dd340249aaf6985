"""The CBC backend (PuLP's bundled binary): a program written as MPS, solved in a child process.

CBC takes the model as written (continuous seconds), divided by the program's scale and every
row by its largest coefficient (:func:`.protocol.scaled_rows`).  It runs as a child process with
a hard wall-clock limit enforced from outside (CBC does not stop during preprocessing), a fixed
seed and one thread.  It runs in its own process group (a terminal's Ctrl-C does not reach it)
and is killed with its group on a stop request (:mod:`amp_opt.search.stop`), when its clock runs
out, or on any exception; on Linux it also dies with its parent (``PR_SET_PDEATHSIG``).  Its
temporary folder is removed in every case.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import warnings

from .. import stop
from ..clock import Clock
from ..tuning import CBC_FLOOR, CBC_WRITE_S
from .linear import BIN, INT, LinearModel
from .protocol import Outcome, Program, Settings, scaled_rows, unit_of


def _cbc_command():
    """PuLP's CBC driver (its bundled binary); PuLP 3 warns that 4.0 moves it to an extra."""
    import pulp  # imported when a CBC program runs

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return pulp.PULP_CBC_CMD(msg=False)


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


def _cbc_args(path: str, mps: str, sol: str, mst: str | None, settings: Settings, budget: float | None,
              cutoff: float | None) -> list[str]:
    """CBC's command line for one run."""
    args = [path, mps] + (["-mips", mst] if mst else [])
    # CBC reads randomSeed 0 as "seed from the time of day": shift to keep runs repeatable.
    args += ["-randomSeed", str(settings.seed + 1)]
    # One worker: CBC's serial code.  "-threads 1" starts its parallel code with one thread, which
    # was seen to stall exactly 10 s after a MIP start on small programs (CBC 2.10.3).
    if settings.workers > 1:
        args += ["-threads", str(settings.workers)]
    if budget is not None:  # stop a little early so that CBC can write its best solution
        args += ["-sec", f"{max(0.05, budget - min(CBC_WRITE_S, 0.1 * budget)):.3f}"]
    if cutoff is not None:  # CBC prunes nodes worse than this (safer than a row, numerically)
        args += ["-cutoff", repr(cutoff * (1 + 1e-6))]
    # CBC's default cutoff increment (solutions must improve by it; nodes within it are pruned) is
    # derived from the objective and was seen to prune the optimum by 2.5e-5 relative: keep it
    # far below the 1e-6 at which amp_opt counts two values as equal (the objective is about 1).
    args += ["-increment", "1e-8"]
    return args + ["-timeMode", "elapsed", "-solve", "-printingOptions", "all", "-solution", sol]


def solve(program: Program, clock: Clock, settings: Settings) -> Outcome:
    """Solve with CBC in a child process killed when ``clock`` runs out (the backend protocol,
    :mod:`.protocol`).

    Times are divided by the program's scale (the expected objective, so that it is about 1)
    and every row by its largest coefficient: CBC's absolute tolerances then mean the same
    on a 10 ms plan as on a 100 s one.
    """
    start = time.perf_counter()
    lm, cutoff, scale = program.model, program.cutoff, program.scale or 1.0
    prob = _pulp_problem(lm, scale)
    with tempfile.TemporaryDirectory(prefix="amp_opt_cbc_") as tmp:
        mps, sol, mst = (os.path.join(tmp, f"model.{ext}") for ext in ("mps", "sol", "mst"))
        vs, var_names, con_names, _ = prob.writeMPS(mps, rename=1)
        solver = _cbc_command()
        if lm.hint:
            solver.writesol(mst, prob, vs, var_names, con_names)
        # What is left after building the model; CBC is killed at it.
        clock = clock.at_least(CBC_FLOOR)
        budget = clock.remaining()
        args = _cbc_args(solver.path, mps, sol, mst if lm.hint else None, settings, budget,
                         None if cutoff is None else cutoff / scale)
        launched = time.perf_counter()
        finished = _run_cbc(args, os.path.join(tmp, "cbc.log"), clock)
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
    result = {i: float(values[f"v{i}"]) * unit_of(lm.vars[i], scale) if f"v{i}" in values else float(lm.vars[i].lb)
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


def _run_cbc(args: list[str], log_path: str, clock: Clock) -> bool:
    """Run CBC in its own process group, output to ``log_path``; True if it finished by itself,
    False if it was killed (its clock ran out or a stop was requested).  Never leaves it running."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=_death_signal())
    try:
        while True:
            try:
                proc.wait(timeout=stop.POLL)
                return True
            except subprocess.TimeoutExpired:
                if clock.out_of_time():
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
