"""The body of one benchmark job, run as its own process: ``python -m amp_opt.bench.child``.

The job (JSON on stdin, built by :mod:`amp_opt.bench.runner`) says what to run: one solve
of one instance (``kind`` "solve") or the baselines of one instance ("baselines").  The
instance travels as its JSON text, so a worker on another machine needs neither the file
nor the folder; plug-in modules travel by name, with their source as a fallback for a
worker that cannot import them.  The answer is one JSON object on the process's original
stdout; anything the solver or a plug-in prints goes to stderr.  Every failure becomes an
answer (status and message), never a traceback: a crash or a hang is the parent's to record.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..errors import InfeasibleError, InputError, NoPlanFound


def peak_rss_mib() -> float:
    """This process's peak resident set size in MiB (ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its reaped children (CBC's process) so far."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def error_status(exc: BaseException) -> str:
    """The row status of a run that raised: proven infeasible, no plan in time, bad input, or failed."""
    if isinstance(exc, NoPlanFound):
        return "UNKNOWN"
    if isinstance(exc, InfeasibleError):
        return "INFEASIBLE"
    if isinstance(exc, InputError):
        return "INPUT_ERROR"
    return "FAILED"


def describe_error(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def load_job_instance(job: dict):
    """The job's instance, parsed from the JSON text it carries (relative paths inside it, such as an
    ``hf_config``, resolve next to the original file when that folder exists here)."""
    from ..model.load import parse_instance

    spec = job["instance"]
    folder = Path(spec.get("path", ".")).parent
    return parse_instance(json.loads(spec["text"]), base_dir=folder if folder.is_dir() else Path.cwd(),
                          default_name=spec.get("stem", "instance"))


def load_job_plugins(job: dict) -> None:
    """Import the job's plug-in modules: by their name or file, or from the source the job carries."""
    from ..search.registry import load_plugin

    for plugin in job.get("plugins", ()):
        try:
            load_plugin(plugin["spec"])
        except InputError as exc:
            if "not found" not in str(exc) or not plugin.get("source"):
                raise
            folder = tempfile.mkdtemp(prefix="amp_opt_plugin_")
            path = Path(folder) / f"{plugin['module']}.py"
            path.write_text(plugin["source"])
            load_plugin(str(path))


def solve_job(job: dict) -> dict[str, Any]:
    """One solve: load, solve under the job's cost model, re-scored plan, trace and program statistics."""
    from ..search.solve import solve

    instance = load_job_instance(job)
    load_job_plugins(job)
    start, cpu = time.perf_counter(), cpu_seconds()
    try:
        result = solve(instance, solver=job["solver"], cost_model=job.get("cost_model", "hetero"),
                       time_limit=job["time_limit"], seed=job.get("seed", 0), workers=job.get("threads", 1))
    except Exception as exc:  # every failure is a row (SolverFailed included)
        return dict(status=error_status(exc), wall_time=time.perf_counter() - start, cpu_time=cpu_seconds() - cpu,
                    peak_rss_mib=peak_rss_mib(), error=describe_error(exc))
    wall = time.perf_counter() - start
    stats = result.solver
    return dict(status=stats.status, wall_time=wall, cpu_time=cpu_seconds() - cpu, peak_rss_mib=peak_rss_mib(),
                objective=stats.objective, bound=stats.bound, gap=stats.gap,
                plan_time=result.best.predicted_time, plan=result.best.plan.to_json(),
                extra=json.loads(json.dumps(stats.extra, default=str)),
                trace=[list(p) for p in stats.trace],
                programs=json.loads(json.dumps(list(stats.programs), default=str)))


def baselines_job(job: dict) -> dict[str, Any]:
    """The amp-model optimum (within the time limit), the expert default and the ideal bound of one instance."""
    from .baselines import amp_optimum, expert_default, ideal_bound

    instance = load_job_instance(job)
    start = time.perf_counter()
    out: dict[str, Any] = {}
    errors = []
    try:
        amp = amp_optimum(instance, time_limit=job["time_limit"])
        out.update(amp_optimum_s=amp.optimum.predicted_time, amp_optimum_fits=amp.optimum.feasible, amp_model_s=amp.amp_time,
                   amp_status=amp.status, amp_optimum_plan=amp.optimum.plan.to_json())
        if amp.fitting is not None:
            out.update(amp_fit_s=amp.fitting.predicted_time, amp_fit_rank=amp.fitting_rank,
                       amp_fit_plan=amp.fitting.plan.to_json())
        elif amp.reason:
            errors.append(f"AMP: {amp.reason}")
    except Exception as exc:
        errors.append(f"AMP: {describe_error(exc)}")
    try:
        expert = expert_default(instance)
        out["expert_reason"] = expert.reason
        if expert.evaluation is not None:
            out.update(expert_s=expert.evaluation.predicted_time, expert_plan=expert.evaluation.plan.to_json())
        else:
            errors.append(f"expert: {expert.reason}")
    except Exception as exc:
        errors.append(f"expert: {describe_error(exc)}")
    try:
        out["ideal_s"] = ideal_bound(instance).time
    except Exception as exc:
        errors.append(f"ideal: {describe_error(exc)}")
    return dict(out, wall_s=time.perf_counter() - start, peak_rss_mib=peak_rss_mib(), error="; ".join(errors))


KINDS = {"solve": solve_job, "baselines": baselines_job}


def main() -> int:
    answer_fd = os.dup(1)  # the answer's channel; whatever else is printed goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        job = json.loads(sys.stdin.read())
        cores = job.get("cores")
        if cores and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, cores)
        answer = KINDS[job["kind"]](job)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent as a row, never a traceback
        answer = dict(status=error_status(exc) if isinstance(exc, Exception) else "FAILED", wall_time=0.0,
                      peak_rss_mib=peak_rss_mib(), error=describe_error(exc))
    if hasattr(os, "getloadavg"):  # how busy the machine was: timings are only as fair as this
        answer["load"] = os.getloadavg()[0]
    with os.fdopen(answer_fd, "w") as fh:
        fh.write(json.dumps(answer, default=str, allow_nan=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
