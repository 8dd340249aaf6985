"""``run_bench``: every solver on every instance, repeated with different seeds, with baselines.

Instances come from the bundled suites (``paper``, ``scale``, ``all``) and/or any files,
folders and globs.  Solvers are registry names (built-in variants and plug-ins).  Every
(instance, solver, repeat) run and every instance's baselines is one job
(:mod:`amp_opt.bench.runner`), run here one or several at a time, or on a Dask cluster
(:mod:`amp_opt.bench.executors`); the rows come back in a fixed order whichever way the jobs
ran.  Per run: status, objective, bound, gap, wall time, time to the first plan and to a 1%
gap, primal integral, programs solved, and the plan against the amp-model optimum, the expert default
and the ideal bound (:mod:`amp_opt.bench.baselines`).  Per solver: solved counts, shifted
geometric mean time, performance profile, primal gap over time and performance
variability (:mod:`amp_opt.bench.stats`).  ``python -m amp_opt bench`` is the command.
"""

from __future__ import annotations

import functools
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError
from ..model.fields import whole_number
from ..search.registry import lookup
from . import stats
from .executors import make_executor, stderr_warn
from .rows import BaselineRun, SolveRun, fields_of, make_row
from .runner import baselines_job_spec, instance_spec, kill_running, plugin_specs, solve_job_spec
from .suites import describe, expand_paths, order_entries, suite_paths
from .writers import (machine_info, write_csv, write_json, write_markdown, write_plot, write_primal_plot,
                      write_profile, write_programs)

DEFAULT_TIME_LIMIT = 300.0


def collect(suite: str | None, paths=()) -> list:
    """The sweep's instances: the suite's (default paper when no path is given), then the paths'; each
    loaded once (a file that is not an instance is an InputError naming it); names made unique."""
    pairs = []
    if suite is not None or not paths:
        pairs += suite_paths(suite or "paper")
    if paths:
        pairs += expand_paths(paths)
    entries = order_entries([describe(group, path) for group, path in pairs])
    seen: dict[str, int] = {}
    out = []
    for e in entries:
        if e.name in seen:  # two files with the same instance name: tell them apart by file
            e = type(e)(**{**e.__dict__, "name": f"{e.name}@{e.path.stem}"})
        seen[e.name] = 1
        out.append(e)
    return out


@dataclass(frozen=True)
class BenchOptions:
    """What a sweep runs and where it writes, checked once when the record is made (a plug-in is
    imported then: it may register the solvers named).

    ``repeats`` runs each (instance, solver) pair with seeds ``seed``, ``seed + 1``, ...; ``jobs``
    runs that many at once here, or ``scheduler`` (a Dask scheduler address) runs them on a
    cluster; each solver uses ``threads`` threads.  ``plugins`` are modules imported first (they
    register solvers).  ``command`` is written at the top of the report (default: the call).
    """

    suite: str | None = "paper"
    solvers: tuple[str, ...] = ("enumerate",)
    time_limit: float = DEFAULT_TIME_LIMIT
    out_dir: Path = Path("benchmarks/results")
    progress: bool = True
    command: str | None = None
    paths: tuple = ()
    repeats: int = 1
    seed: int = 0
    jobs: int = 1
    threads: int = 1
    scheduler: str | None = None
    baselines: bool = True
    plugins: tuple = ()
    plugin_specs: tuple = field(default=(), init=False, repr=False)  # the plug-ins' sources, for the jobs

    def __post_init__(self):
        put = functools.partial(object.__setattr__, self)
        put("solvers", tuple(self.solvers))
        put("paths", tuple(self.paths))
        put("plugins", tuple(self.plugins))
        put("out_dir", Path(self.out_dir))
        put("plugin_specs", plugin_specs(self.plugins))  # imports (and so validates) every plug-in first
        if not self.solvers:
            raise InputError("--solvers", "give at least one solver")
        for name in self.solvers:
            lookup(name, "--solvers")
        limit = self.time_limit
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit > 0 or not math.isfinite(limit):
            raise InputError("--time-limit", f"must be positive seconds, got {limit!r}")
        whole_number(self.repeats, "--repeats")
        whole_number(self.jobs, "--jobs")
        whole_number(self.threads, "--threads")
        if self.command is None:
            put("command", f"run_bench(suite={self.suite!r}, solvers={list(self.solvers)!r}, time_limit={limit!r}, "
                           f"out_dir={str(self.out_dir)!r}" + (f", paths={list(self.paths)!r}" if self.paths else "")
                           + (f", repeats={self.repeats}" if self.repeats != 1 else "") + ")")


def run_bench(suite: str | None = "paper", solvers=("enumerate",), time_limit: float = DEFAULT_TIME_LIMIT,
              out_dir: Path | str = "benchmarks/results", progress: bool = True, command: str | None = None,
              **options) -> list[dict]:
    """Benchmark ``solvers`` on the instances; write the result files into ``out_dir``; return the rows.
    The keyword-only ``options`` and what they mean are the fields of :class:`BenchOptions`."""
    return sweep(BenchOptions(suite, solvers, time_limit, out_dir, progress, command, **options))


def sweep(opts: BenchOptions) -> list[dict]:
    """The sweep a record describes: per instance its baselines, then every solver and repeat (jobs
    that carry the instance text); the result files written into ``opts.out_dir``; the rows."""
    entries = collect(opts.suite, opts.paths)
    say = _stderr_printer(opts.progress)
    executor = make_executor(opts.jobs, opts.threads, opts.scheduler, warn=stderr_warn)
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    job_list, what = _jobs(opts, entries)
    say(f"{len(entries)} instances x {len(opts.solvers)} solvers x {opts.repeats} repeats = "
        f"{len(entries) * len(opts.solvers) * opts.repeats} runs, {opts.time_limit:g} s each; {executor.describe()}")
    started = time.perf_counter()
    answers = _run_jobs(opts, executor, job_list, what, say)
    return _write_results(opts, what, answers, started, executor.describe(), say)


def _jobs(opts: BenchOptions, entries) -> tuple[list, list]:
    """The job specs of the sweep, and per job (instance, solver or None for baselines, repeat, seed)."""
    job_list, what = [], []
    for inst in entries:
        spec = instance_spec(inst.path)
        if opts.baselines:
            job_list.append(baselines_job_spec(spec, opts.time_limit))
            what.append((inst, None, None, None))
        for solver in opts.solvers:
            for r in range(opts.repeats):
                job_list.append(solve_job_spec(spec, solver, opts.time_limit, opts.seed + r, opts.threads,
                                               opts.plugin_specs))
                what.append((inst, solver, r, opts.seed + r))
    return job_list, what


def _run_jobs(opts: BenchOptions, executor, job_list, what, say) -> dict[int, dict]:
    """Every job's answer by its index, each line of progress said and the rows so far written as it
    comes; an interrupted sweep (Ctrl-C, SIGTERM) leaves no job process behind."""
    answers: dict[int, dict] = {}
    previous = _raise_on_sigterm()
    try:
        for done, (i, answer) in enumerate(executor.map(job_list), start=1):
            answers[i] = answer
            inst, solver, r, _ = what[i]
            if solver is None:
                base = BaselineRun(**fields_of(BaselineRun, answer))
                say(f"[{done}/{len(job_list)}] {inst.name} ({inst.devices} GPUs): baselines in {_fmt(base.wall_s, '.1f')} s: "
                    f"amp-model optimum {_fmt(base.amp_optimum_s)} s, expert {_fmt(base.expert_s)} s, ideal {_fmt(base.ideal_s)} s"
                    + (f"  ({base.error})" if base.error else ""))
            else:
                run = SolveRun(**fields_of(SolveRun, answer))
                say(f"[{done}/{len(job_list)}] {inst.name} ({inst.devices} GPUs): {solver} #{r} {run.status} in "
                    f"{run.wall_time:.1f} s, plan {_fmt(run.plan_time)} s" + (f"  ({run.error[:200]})" if run.error else ""))
            rows, _, _ = _rows(what, answers, opts.baselines, opts.time_limit, opts.threads)
            write_csv(rows, opts.out_dir / "results.csv")  # so that an interrupted bench leaves its rows
    except BaseException:
        killed = kill_running()
        if killed:
            print(f"amp-opt: stopped {killed} running job(s); finished rows are in {opts.out_dir}/results.csv",
                  file=sys.stderr)
        raise
    finally:
        executor.close()
        _restore_sigterm(previous)
    return answers


def _write_results(opts: BenchOptions, what, answers: dict, started: float, executor: str, say) -> list[dict]:
    """The result files (rows as CSV, JSON and Markdown, program statistics, plots); the rows."""
    out_dir = opts.out_dir
    rows, traces, programs = _rows(what, answers, opts.baselines, opts.time_limit, opts.threads)
    plans = {stats.row_key(r): answers[i].get("plan") for i, r in _row_jobs(what, answers, rows)}
    summary = stats.solver_summary(rows)
    machine = machine_info()
    write_csv(rows, out_dir / "results.csv")
    write_programs(rows, programs, out_dir / "programs.csv")
    write_json(rows, opts.command, machine, out_dir / "results.json", traces, programs, summary, plans)
    write_markdown(rows, opts.command, machine, time.perf_counter() - started, out_dir / "results.md", summary,
                   stats.variability(rows), executor, opts.baselines)
    plots = [write_profile(rows, out_dir / "profile.png"), write_primal_plot(rows, traces, out_dir / "primal.png")]
    if opts.baselines:
        plots.append(write_plot(rows, out_dir / "results.png"))
    if not all(plots):
        print("amp-opt: warning: matplotlib is not installed (or nothing to plot); skipped plots "
              "(pip install 'amp_opt[plot]')", file=sys.stderr)
    written = [p.name for p in sorted(out_dir.glob("*")) if p.name.split(".")[0] in
               ("results", "programs", "profile", "primal")]
    say(f"wrote {out_dir}/: {', '.join(written)}")
    return rows


def _rows(what, answers: dict, baselines: bool, time_limit: float, threads: int):
    """The rows of every finished run (in the sweep's order), their traces and program statistics,
    with the cross-run columns filled."""
    base_of = {}
    for i, (inst, solver, _, _) in enumerate(what):
        if solver is None and i in answers:
            base_of[inst.name] = BaselineRun(**fields_of(BaselineRun, answers[i]))
    rows, traces, programs = [], {}, {}
    for i, (inst, solver, r, seed) in enumerate(what):
        if solver is None or i not in answers:
            continue
        if baselines and inst.name not in base_of:
            continue  # its baselines are still running
        run = SolveRun(**fields_of(SolveRun, answers[i]))
        row = make_row(inst, solver, run, base_of.get(inst.name), repeat=r, seed=seed, time_limit=time_limit,
                       threads=threads)
        stats.fill_times(row, run.trace)
        traces[stats.row_key(row)] = run.trace
        programs[stats.row_key(row)] = run.programs
        rows.append(row)
    stats.mark_wrong(rows)
    stats.fill_primal_integrals(rows, traces)
    return rows, traces, programs


def _row_jobs(what, answers, rows):
    """(job index, row) pairs of the finished solve jobs that made rows."""
    made = {stats.row_key(r): r for r in rows}
    for i, (inst, solver, r, _) in enumerate(what):
        key = (inst.name, solver, r)
        if solver is not None and i in answers and key in made:
            yield i, made[key]


def _raise_on_sigterm():
    """SIGTERM stops a sweep as Ctrl-C does (its job processes are killed); main thread only."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(signum, frame):
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, stop)


def _restore_sigterm(previous) -> None:
    import signal

    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


def _stderr_printer(enabled: bool):
    def say(line: str) -> None:
        if enabled:
            print(line, file=sys.stderr, flush=True)

    return say


def _fmt(value, spec: str = ".4f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)
