"""Start local worker processes the way torchrun does, and never leave one behind.

Each worker is ``python -m amp_opt.runtime.worker --task TASK.json --out DIR``
with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT in its
environment (a free port on 127.0.0.1).  The launcher waits for all of them,
and on the first failing worker, on the timeout, or on Ctrl-C it terminates
every worker still alive (SIGTERM, then SIGKILL after a grace period).  On Linux
workers also get SIGKILL if the launching process dies (PR_SET_PDEATHSIG).
Deliberately no import of torch here: the launcher only manages processes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

GRACE_SECONDS = 3.0


@dataclass(frozen=True)
class LaunchResult:
    """How the workers ended: ``status`` is "ok", "failed" or "timeout"."""

    status: str
    returncodes: tuple[int | None, ...]
    results: tuple[Any, ...]  # each rank's result JSON (None when it wrote none)
    stderr: str  # the tail of the first failing rank's stderr
    pids: tuple[int, ...]
    seconds: float


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _die_with_parent():  # pragma: no cover - runs in the child before exec
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _stop(procs) -> None:
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        try:
            p.terminate()
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + GRACE_SECONDS
    for p in alive:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def launch(task: dict, world_size: int, *, timeout: float, on_start: Callable[[tuple[int, ...]], None] | None = None,
           threads: int | list[int] | None = None) -> LaunchResult:
    """Run ``task`` on ``world_size`` local worker processes; return how they ended.

    Parameters
    ----------
    task : dict
        JSON-ready task for :mod:`amp_opt.runtime.worker`.
    world_size : int
        Number of processes (ranks 0..world_size-1).
    timeout : float
        Seconds before every worker is stopped and the status is "timeout".
    on_start : callable, optional
        Called with the workers' pids once they are started.
    threads : int or list of int, optional
        OMP_NUM_THREADS for each worker (a list: per rank).

    Examples
    --------
    >>> launch({"kind": "echo"}, 2, timeout=60).status  # doctest: +SKIP
    'ok'
    """
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="amp_opt_run_") as tmp:
        tmp = Path(tmp)
        (tmp / "task.json").write_text(json.dumps(task))
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world_size))
        if isinstance(threads, int):
            env["OMP_NUM_THREADS"] = str(threads)
        procs, errs = [], []
        try:
            for rank in range(world_size):
                err = open(tmp / f"stderr.{rank}", "w+b")
                errs.append(err)
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "amp_opt.runtime.worker", "--task", str(tmp / "task.json"),
                     "--out", str(tmp)],
                    env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank),
                             **({"OMP_NUM_THREADS": str(threads[rank])} if isinstance(threads, list) else {})),
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                    preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None))
            if on_start is not None:
                on_start(tuple(p.pid for p in procs))
            status = _wait(procs, start + timeout)
        finally:
            _stop(procs)  # also on Ctrl-C and on any error in this process
        codes = tuple(p.returncode for p in procs)
        results = []
        for rank in range(world_size):
            path = tmp / f"result.{rank}.json"
            results.append(json.loads(path.read_text()) if path.exists() else None)
        failing = next((r for r, c in enumerate(codes) if c not in (0, None)), 0)
        errs[failing].seek(0)
        stderr = errs[failing].read().decode(errors="replace")[-4000:]
        for err in errs:
            err.close()
    return LaunchResult(status, codes, tuple(results), stderr, tuple(p.pid for p in procs), time.monotonic() - start)


def _wait(procs, deadline: float) -> str:
    while True:
        codes = [p.poll() for p in procs]
        if any(c not in (None, 0) for c in codes):
            return "failed"
        if all(c == 0 for c in codes):
            return "ok"
        if time.monotonic() > deadline:
            return "timeout"
        time.sleep(0.05)
