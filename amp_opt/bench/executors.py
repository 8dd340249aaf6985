"""Where a sweep's jobs run: here, one or several at a time, or on a Dask distributed cluster.

Every executor runs the same :func:`~amp_opt.bench.runner.run_job` (a fresh process per
job) and yields ``(index, answer)`` pairs as jobs finish; :func:`~amp_opt.bench.run.run_bench`
puts the rows back in the sweep's fixed order, so the results do not depend on the executor
(only the timings do).

* :class:`LocalExecutor` (``--jobs N``): N jobs at once on this machine.  When N x threads
  fits in the usable cores, each running job gets its own cores (CPU affinity), so jobs do
  not steal each other's time; otherwise a warning says that timings are not fair.
* :class:`DaskExecutor` (``--scheduler ADDRESS``): an existing Dask distributed cluster.
  Each job is one task that runs the job's process on the worker.  If every worker
  declares a ``cores`` resource (``dask worker ADDRESS --nthreads N --resources cores=N``),
  a job reserves ``threads`` of it, so a worker never runs more solver threads than it
  has cores; otherwise a worker runs as many jobs as it has threads (start workers with
  ``--nthreads`` = cores / threads).
"""

from __future__ import annotations

import os
import queue
import sys
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import Iterator

from ..errors import InputError
from .runner import run_job

CONNECT_TIMEOUT = "10s"  # how long to wait for a Dask scheduler before calling its address bad input


def usable_cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


class LocalExecutor:
    """Run jobs as processes on this machine, ``jobs`` at a time, each on its own cores when they suffice."""

    name = "local"

    def __init__(self, jobs: int = 1, threads: int = 1, warn=None):
        self.jobs, self.threads = jobs, threads
        cores = usable_cores()
        self.fair = jobs * threads <= len(cores)
        self.slots: queue.Queue = queue.Queue()
        for k in range(jobs):
            self.slots.put(cores[k * threads:(k + 1) * threads] if self.fair and jobs > 1 else None)
        if not self.fair and warn is not None:
            warn(f"{jobs} jobs x {threads} threads on {len(cores)} usable cores: jobs share cores, "
                 f"so timings are not fair (use --jobs {max(1, len(cores) // threads)})")

    def describe(self) -> str:
        pinned = ", each on its own cores" if self.fair and self.jobs > 1 else ""
        return f"local, {self.jobs} job(s) at a time x {self.threads} thread(s){pinned}"

    def _run(self, job: dict) -> dict:
        cores = self.slots.get()
        try:
            return run_job(job, cores=cores)
        finally:
            self.slots.put(cores)

    def map(self, jobs: list[dict]) -> Iterator[tuple[int, dict]]:
        if self.jobs == 1:
            for i, job in enumerate(jobs):
                yield i, run_job(job)
            return
        with ThreadPoolExecutor(max_workers=self.jobs) as pool:
            pending = {pool.submit(self._run, job): i for i, job in enumerate(jobs)}
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in sorted(done, key=pending.get):
                    yield pending.pop(future), future.result()

    def close(self) -> None:
        pass


def _dask_job(job: dict) -> dict:
    """The task a Dask worker runs: the job's own process, as on this machine."""
    return run_job(job)


class DaskExecutor:
    """Run jobs as tasks of an existing Dask distributed cluster (its scheduler's address)."""

    name = "dask"

    def __init__(self, address: str, threads: int = 1, warn=None):
        try:
            from distributed import Client
        except ImportError:
            raise InputError("--scheduler", "running on a Dask cluster needs dask.distributed: "
                                            "pip install 'amp_opt[dist]'") from None
        try:
            self.client = Client(address, timeout=CONNECT_TIMEOUT, set_as_default=False)
        except (OSError, TimeoutError, ValueError) as exc:
            raise InputError("--scheduler", f"cannot connect to the Dask scheduler at {address!r}: "
                                            f"{' '.join(str(exc).split())[:200]}") from None
        self.address, self.threads = address, threads
        workers = self.client.scheduler_info().get("workers", {})
        self.resources = ({"cores": threads} if workers and all("cores" in w.get("resources", {})
                                                                for w in workers.values()) else None)
        if not workers and warn is not None:
            warn(f"the Dask scheduler at {address} has no workers yet; jobs wait for one")
        self.workers = len(workers)

    def describe(self) -> str:
        how = f"each job reserving cores={self.threads}" if self.resources else "one job per worker thread"
        return f"dask scheduler {self.address} ({self.workers} workers at start, {how})"

    def map(self, jobs: list[dict]) -> Iterator[tuple[int, dict]]:
        from distributed import as_completed

        futures = [self.client.submit(_dask_job, job, pure=False, resources=self.resources) for job in jobs]
        index = {f.key: i for i, f in enumerate(futures)}
        for future in as_completed(futures, loop=self.client.loop):
            i = index[future.key]
            try:
                answer = future.result()
            except Exception as exc:  # the task itself failed (worker lost, ...): a row, not a crash
                answer = dict(status="CRASHED", wall_time=0.0, peak_rss_mib=None,
                              error=f"Dask task failed: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
            yield i, answer

    def close(self) -> None:
        self.client.close()


def make_executor(jobs: int = 1, threads: int = 1, scheduler: str | None = None, warn=None):
    if scheduler:
        return DaskExecutor(scheduler, threads, warn)
    return LocalExecutor(jobs, threads, warn)


def stderr_warn(message: str) -> None:
    print(f"amp-opt: warning: {message}", file=sys.stderr, flush=True)


__all__ = ["LocalExecutor", "DaskExecutor", "make_executor", "usable_cores"]
