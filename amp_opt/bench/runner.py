"""Runs in child processes: one solve or one instance's baselines per fresh process.

Each runs in a fresh spawned child, so that wall time and peak memory (the child's
own ``ru_maxrss``) belong to that run alone and a crash, a hang or an exception
becomes a row instead of ending the benchmark.  A child that outlives its time limit
plus a margin is killed and recorded as TIMEOUT.
"""

from __future__ import annotations

import json
import multiprocessing
import resource
import sys
import time
from typing import Any

from ..errors import InfeasibleError, InputError
from ..model.load import load_instance
from ..search.solve import solve
from .baselines import amp_pick, expert_default, ideal_bound

# A child may run this much longer than its solver's time limit before it is killed:
# process start-up and imports, loading the instance, and a search step in progress.
MARGIN_SECONDS = 30.0
MARGIN_FRACTION = 0.25


def _peak_rss_mib() -> float:
    """This process's peak resident set size in MiB (ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def _error_status(exc: BaseException) -> str:
    if isinstance(exc, InfeasibleError):
        return "INFEASIBLE"
    if isinstance(exc, InputError):
        return "INPUT_ERROR"
    return "ERROR"


def _describe_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".replace("\n", " ")


def solve_child(path: str, solver: str, time_limit: float) -> dict:
    """Body of a solve child: load, solve under hetero, return plain data for :class:`SolveRun`."""
    instance = load_instance(path)
    start = time.perf_counter()
    try:
        result = solve(instance, solver=solver, cost_model="hetero", time_limit=time_limit)
    except Exception as exc:  # every failure is a row
        return dict(status=_error_status(exc), wall_s=time.perf_counter() - start, peak_rss_mib=_peak_rss_mib(),
                    error=_describe_error(exc))
    stats = result.solver
    return dict(status=stats.status, wall_s=time.perf_counter() - start, peak_rss_mib=_peak_rss_mib(),
                objective_s=stats.objective, bound_s=stats.bound, gap=stats.gap,
                time_s=result.best.predicted_time, plan=result.best.plan.to_json(),
                extra=json.loads(json.dumps(stats.extra, default=str)))


def baselines_child(path: str, time_limit: float) -> dict:
    """Body of a baseline child: AMP's pick (within time_limit), the expert default, the ideal bound."""
    instance = load_instance(path)
    start = time.perf_counter()
    out: dict[str, Any] = {}
    errors = []
    try:
        amp = amp_pick(instance, time_limit=time_limit)
        out.update(amp_pick_s=amp.pick.predicted_time, amp_pick_fits=amp.pick.feasible, amp_model_s=amp.amp_time,
                   amp_status=amp.status, amp_pick_plan=amp.pick.plan.to_json())
        if amp.fitting is not None:
            out.update(amp_fit_s=amp.fitting.predicted_time, amp_fit_rank=amp.fitting_rank,
                       amp_fit_plan=amp.fitting.plan.to_json())
        elif amp.reason:
            errors.append(f"AMP: {amp.reason}")
    except Exception as exc:
        errors.append(f"AMP: {_describe_error(exc)}")
    try:
        expert = expert_default(instance)
        out["expert_reason"] = expert.reason
        if expert.evaluation is not None:
            out.update(expert_s=expert.evaluation.predicted_time, expert_plan=expert.evaluation.plan.to_json())
        else:
            errors.append(f"expert: {expert.reason}")
    except Exception as exc:
        errors.append(f"expert: {_describe_error(exc)}")
    try:
        out["ideal_s"] = ideal_bound(instance).time
    except Exception as exc:
        errors.append(f"ideal: {_describe_error(exc)}")
    return dict(out, wall_s=time.perf_counter() - start, peak_rss_mib=_peak_rss_mib(), error="; ".join(errors))


def _child_main(conn, function, args: tuple) -> None:
    """Entry point of a spawned child: run one body and send its dict back."""
    try:
        payload = function(*args)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, never raised there
        payload = dict(status=_error_status(exc), wall_s=0.0, peak_rss_mib=_peak_rss_mib(),
                       error=_describe_error(exc))
    conn.send(payload)
    conn.close()


def run_in_child(function, args: tuple, deadline_s: float) -> dict:
    """Run ``function(*args)`` (a module-level function returning a dict) in a fresh
    spawned process; kill it after deadline_s.

    Returns the child's dict, or a TIMEOUT / CRASHED dict.  Peak RSS of a
    killed child is taken from RUSAGE_CHILDREN when it raised that maximum.
    """
    ctx = multiprocessing.get_context("spawn")
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child_main, args=(send, function, args), daemon=True)
    start = time.perf_counter()
    child.start()
    send.close()
    payload, answered = None, False
    try:
        if receive.poll(deadline_s):
            payload, answered = receive.recv(), True
    except (EOFError, OSError):
        pass
    finally:
        waited = time.perf_counter() - start
        if not answered and child.is_alive():
            child.kill()
        child.join(10)
        receive.close()
    if answered:
        return payload if isinstance(payload, dict) else dict(status="ERROR", wall_s=waited, peak_rss_mib=None,
                                                              error=f"child returned {payload!r}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    rss = (after / 2**20 if sys.platform == "darwin" else after / 2**10) if after > before else None
    if waited >= deadline_s:
        return dict(status="TIMEOUT", wall_s=waited, peak_rss_mib=rss,
                    error=f"killed after {waited:.0f} s (time limit plus margin {deadline_s:.0f} s)")
    return dict(status="CRASHED", wall_s=waited, peak_rss_mib=rss,
                error=f"child process died without a result (exit code {child.exitcode})")


def child_deadline(time_limit: float, budgets: int = 1) -> float:
    """Seconds the parent waits for a child that has ``budgets`` time limits of work."""
    return budgets * time_limit * (1 + MARGIN_FRACTION) + MARGIN_SECONDS
