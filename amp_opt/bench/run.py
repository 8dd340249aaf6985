"""``run_bench``: every solver on every instance of a suite, with plan-quality baselines.

Per (instance, solver) row: the solver's status, objective, bound, gap, wall
time, peak RSS and model size (``result.solver.extra``), and the hetero time of
its plan next to AMP's pick, the expert default and the ideal bound
(:mod:`amp_opt.bench.baselines`).  Every run is a child process
(:mod:`amp_opt.bench.runner`); the writers put a CSV, a markdown table, a JSON file and a
PNG plot into the output directory.  ``python -m amp_opt bench`` is the command.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

from ..errors import InputError
from ..search.options import SOLVERS
from .rows import BaselineRun, SolveRun, make_row
from .runner import baselines_child, child_deadline, run_in_child, solve_child
from .suites import describe, order_entries, suite_paths
from .writers import machine_info, write_csv, write_json, write_markdown, write_plot

DEFAULT_TIME_LIMIT = 300.0

def _fields(cls, data: dict) -> dict:
    names = cls.__dataclass_fields__
    return {k: v for k, v in data.items() if k in names}


def run_bench(suite: str, solvers: list[str], time_limit: float, out_dir: Path, progress: bool = True,
              command: str | None = None) -> list[dict]:
    """Benchmark ``solvers`` on ``suite``; write results.{csv,md,json,png} into out_dir; return the rows.

    Every solve and every instance's baselines run in their own spawned child
    with ``time_limit`` seconds (the baselines' AMP search gets the same
    limit).  ``command`` is written at the top of the markdown (default: this
    call in Python syntax).
    """
    unknown = [s for s in solvers if s not in SOLVERS]
    if not solvers or unknown:
        raise InputError("--solvers", f"unknown solver {unknown[0]!r} (choose from {', '.join(SOLVERS)})"
                         if unknown else "give at least one solver")
    if not time_limit > 0:
        raise InputError("--time-limit", f"must be positive seconds, got {time_limit!r}")
    out_dir = Path(out_dir)
    if command is None:
        command = f"run_bench(suite={suite!r}, solvers={solvers!r}, time_limit={time_limit!r}, out_dir={str(out_dir)!r})"
    entries = order_entries([describe(name, path) for name, path in suite_paths(suite)])
    say = _stderr_printer(progress)
    out_dir.mkdir(parents=True, exist_ok=True)
    total = len(entries) * (len(solvers) + 1)
    done = 0
    rows: list[dict] = []
    started = time.perf_counter()
    for inst in entries:
        done += 1
        say(f"[{done}/{total}] {inst.name} ({inst.devices} GPUs): baselines ...")
        raw = run_in_child(baselines_child, (str(inst.path), time_limit), child_deadline(time_limit, 2))
        base = BaselineRun(**_fields(BaselineRun, raw))
        say(f"[{done}/{total}] {inst.name}: baselines in {base.wall_s:.1f} s: AMP {_fmt(base.amp_pick_s)} s, "
            f"expert {_fmt(base.expert_s)} s, ideal {_fmt(base.ideal_s)} s" + (f"  ({base.error})" if base.error else ""))
        for solver in solvers:
            done += 1
            say(f"[{done}/{total}] {inst.name} ({inst.devices} GPUs): {solver} ...")
            raw = run_in_child(solve_child, (str(inst.path), solver, time_limit), child_deadline(time_limit))
            run = SolveRun(**_fields(SolveRun, raw))
            say(f"[{done}/{total}] {inst.name}: {solver} {run.status} in {run.wall_s:.1f} s, "
                f"{_fmt(run.peak_rss_mib, '.0f')} MiB, plan {_fmt(run.time_s)} s"
                + (f"  ({run.error[:200]})" if run.error else ""))
            rows.append(make_row(inst, solver, run, base))
            write_csv(rows, out_dir / "results.csv")  # so that an interrupted bench leaves its rows
    machine = machine_info()
    write_json(rows, command, machine, out_dir / "results.json")
    write_markdown(rows, command, machine, time.perf_counter() - started, out_dir / "results.md")
    if not write_plot(rows, out_dir / "results.png"):
        print("amp-opt: warning: matplotlib is not installed; skipped the plot (pip install 'amp_opt[plot]')",
              file=sys.stderr)
    say(f"wrote {out_dir}/results.csv, results.md, results.json" + (", results.png" if (out_dir / "results.png").exists() else ""))
    return rows


def _stderr_printer(enabled: bool):
    def say(line: str) -> None:
        if enabled:
            print(line, file=sys.stderr, flush=True)

    return say


def _fmt(value, spec: str = ".4f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)
