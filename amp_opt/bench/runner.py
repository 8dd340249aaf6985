"""Benchmark jobs: what one job is, and running it as its own process with a hard deadline.

A job is plain JSON (:func:`solve_job_spec`, :func:`baselines_job_spec`): the instance's
text, the solver's name, the time limit, the seed, the thread count and the plug-ins to
import.  :func:`run_job` runs it in a fresh process (``python -m amp_opt.bench.child``) in
its own session, so that

* wall time and peak memory (the child's own ``ru_maxrss``) belong to that run alone,
* the child's thread pools are pinned to the job's thread count (``OMP_NUM_THREADS`` and
  friends; the solvers get ``workers``) and, when given, to its own cores (CPU affinity),
* a crash, a hang or an exception becomes a row instead of ending the benchmark: a child
  still running ``(1 + MARGIN_FRACTION) x limit + MARGIN_SECONDS`` after it started is
  killed with its whole process group (CBC's own process included) and recorded as TIMEOUT.

The same function runs a job on this machine (:mod:`amp_opt.bench.executors`, ``--jobs``)
or on a Dask worker (``--scheduler``), so a sweep's results do not depend on where it ran.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# A child may run this much longer than its solver's time limit before it is killed:
# process start-up and imports, loading the instance, and a search step in progress.
MARGIN_SECONDS = 30.0
MARGIN_FRACTION = 0.25
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")

_LIVE: set = set()  # the job processes running now (killed by kill_running on an interrupted sweep)
_LIVE_LOCK = threading.Lock()


def child_deadline(time_limit: float, budgets: int = 1) -> float:
    """Seconds the parent waits for a child that has ``budgets`` time limits of work."""
    return budgets * time_limit * (1 + MARGIN_FRACTION) + MARGIN_SECONDS


def instance_spec(path: Path) -> dict[str, str]:
    """An instance as a job carries it: its text (so remote workers need no file) and where it came from."""
    path = Path(path)
    return {"path": str(path.resolve()), "stem": path.stem, "text": path.read_text()}


def solve_job_spec(instance: dict, solver: str, time_limit: float, seed: int = 0, threads: int = 1,
                   plugins: list | tuple = (), cost_model: str = "hetero") -> dict[str, Any]:
    return {"kind": "solve", "instance": instance, "solver": solver, "time_limit": float(time_limit),
            "seed": int(seed), "threads": int(threads), "plugins": list(plugins), "cost_model": cost_model,
            "deadline": child_deadline(time_limit)}


def baselines_job_spec(instance: dict, time_limit: float) -> dict[str, Any]:
    return {"kind": "baselines", "instance": instance, "time_limit": float(time_limit), "threads": 1,
            "deadline": child_deadline(time_limit, 2)}


def plugin_specs(modules) -> list[dict]:
    """What a job needs to import each ``--plugin`` module in a fresh process: its spec (module name or
    file, made absolute), and the source of a single-file module for workers that lack it."""
    from ..search.registry import load_plugin

    out = []
    for spec in modules or ():
        load_plugin(spec)  # validated here, in the parent: a bad plug-in stops the sweep before it starts
        name = Path(spec).stem if spec.endswith(".py") else spec
        module = sys.modules.get(name)
        file = getattr(module, "__file__", None)
        source = Path(file).read_text() if file and not file.endswith("__init__.py") else None
        out.append({"spec": str(Path(spec).resolve()) if spec.endswith(".py") else spec, "module": name,
                    "source": source})
    return out


def _child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    for name in THREAD_VARIABLES:
        env[name] = str(threads)
    # The child imports amp_opt from where this process did, and plug-ins from the current folder.
    package_root = str(Path(__file__).resolve().parent.parent.parent)
    paths = [package_root, os.getcwd()] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def run_job(job: dict, deadline_s: float | None = None, cores: list[int] | None = None) -> dict[str, Any]:
    """Run one job in a fresh process; kill its process group after ``deadline_s`` (default: the job's).

    Returns the child's answer, or a TIMEOUT / CRASHED answer.  A killed child's peak memory is
    unknown (None).
    """
    deadline_s = job.get("deadline", MARGIN_SECONDS) if deadline_s is None else deadline_s
    payload = json.dumps(dict(job, cores=list(cores) if cores else None))
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "amp_opt.bench.child"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_child_env(job.get("threads", 1)),
                             start_new_session=True, text=True)
    with _LIVE_LOCK:
        _LIVE.add(child)
    try:
        out, err = child.communicate(payload, timeout=deadline_s)
    except subprocess.TimeoutExpired:
        _kill_group(child)
        out, err = child.communicate()
        waited = time.perf_counter() - start
        return dict(status="TIMEOUT", wall_time=waited, peak_rss_mib=None,
                    error=f"killed after {waited:.0f} s (time limit plus margin {deadline_s:.0f} s)")
    finally:
        _kill_group(child)  # nothing the job started outlives it (CBC's process, a plug-in's children)
        with _LIVE_LOCK:
            _LIVE.discard(child)
    waited = time.perf_counter() - start
    try:
        answer = json.loads(out) if out.strip() else None
    except json.JSONDecodeError:
        answer = None
    if isinstance(answer, dict):
        return answer
    tail = " ".join(err.strip().splitlines()[-3:])[-300:] if err else ""
    return dict(status="CRASHED", wall_time=waited, peak_rss_mib=None,
                error=f"child process died without a result (exit code {child.returncode})"
                      + (f": {tail}" if tail else ""))


@dataclass(frozen=True)
class Measured:
    """One command run as its own process: exit code, wall seconds, the child's own peak resident
    memory in MiB (``ru_maxrss`` from ``os.wait4``, so no other process counts) and its output."""

    code: int
    wall: float
    peak_mib: float
    stdout: str
    stderr: str


def run_measured(argv: list[str], *, cwd=None) -> Measured:
    """Run ``argv`` to its end and measure it (the benchmarks' whole-process timings).

    Examples
    --------
    >>> import sys
    >>> done = run_measured([sys.executable, "-c", "print(6 * 7)"])
    >>> done.code, done.stdout.strip(), done.peak_mib > 0
    (0, '42', True)
    """
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        return Measured(os.waitstatus_to_exitcode(status), wall, usage.ru_maxrss / 1024, out.read(), err.read())


def kill_running() -> int:
    """Kill every job process this process started that is still running (an interrupted sweep)."""
    with _LIVE_LOCK:
        children = list(_LIVE)
    for child in children:
        _kill_group(child)
    return len(children)


def _kill_group(child: subprocess.Popen) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass
