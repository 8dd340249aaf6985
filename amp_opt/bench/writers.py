"""Benchmark writers: the results as CSV and JSON, a markdown report (command and machine on top,
then the per-solver summary the field reads), a Dolan-More performance profile, a primal-gap-
over-time plot and the plan-quality plot against the baselines."""

from __future__ import annotations

import csv
import json
import math
import os
import platform
import time
from pathlib import Path

from .. import __version__
from . import stats
from .rows import COLUMNS, ratio

PROGRAM_COLUMNS = ("instance", "solver", "repeat", "candidate", "status", "objective", "bound", "plan_time",
                   "lower_bound", "cutoff", "warm_start", "seconds", "solver_seconds", "nodes", "variables",
                   "constraints")


def commit(root: Path) -> str:
    """The short hash of the checkout at ``root`` that a benchmark ran (empty outside git)."""
    import subprocess

    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else ""


def machine_info() -> dict[str, str]:
    """Cores, CPU model (from /proc/cpuinfo), Python and platform: what a timing depends on."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 0
    return {
        "cpu": cpu,
        "cores": f"{os.cpu_count()} ({usable} usable)",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "platform": platform.platform(),
        "amp_opt": __version__,
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "",
    }


def _plain(value):
    if value is None:
        return ""
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def write_csv(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _plain(row[k]) for k in COLUMNS})


def write_programs(rows: list[dict], programs: dict, path: Path) -> None:
    """One line per program a MIP run solved (``SolverStats.programs``)."""
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=PROGRAM_COLUMNS)
        writer.writeheader()
        for row in rows:
            for p in programs.get(stats.row_key(row), ()):
                writer.writerow({"instance": row["instance"], "solver": row["solver"], "repeat": row["repeat"],
                                 **{k: _plain(p.get(k)) for k in PROGRAM_COLUMNS[3:]}})


def write_json(rows: list[dict], command: str, machine: dict, path: Path, traces: dict | None = None,
               programs: dict | None = None, summary: list | None = None, plans: dict | None = None) -> None:
    """The rows with each run's trace, program statistics and plan (JSON), plus the command, the
    machine and the per-solver summary."""
    traces, programs, plans = traces or {}, programs or {}, plans or {}
    out_rows = [dict(row, trace=traces.get(stats.row_key(row), []), program_stats=programs.get(stats.row_key(row), []),
                     plan_json=plans.get(stats.row_key(row))) for row in rows]
    path.write_text(json.dumps({"command": command, "machine": machine, "columns": list(COLUMNS),
                                "summary": summary or [], "rows": out_rows}, indent=1, default=str) + "\n")


MARKDOWN_COLUMNS = (
    ("instance", "instance", None), ("devices", "GPUs", None), ("solver", "solver", None), ("repeat", "rep", None),
    ("status", "status", None), ("wall_time", "wall s", ".2f"), ("gap", "gap", ".2%"),
    ("time_to_first", "first s", ".2f"), ("time_to_1pct_gap", "1% s", ".2f"), ("primal_integral", "P int", ".2f"),
    ("programs", "progs", None), ("amp_opt_s", "plan s", ".4f"), ("plan", "plan", None),
)
BASELINE_COLUMNS = (
    ("amp_fit_s", "amp fit s", ".4f"), ("expert_s", "expert s", ".4f"), ("ideal_s", "ideal s", ".4f"),
    ("speedup_vs_amp", "x amp", ".3f"), ("speedup_vs_expert", "x expert", ".3f"),
)


def _cell(value, spec) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and not math.isfinite(value):
        return "-" if math.isnan(value) else str(value)
    return format(value, spec) if spec else str(value)


def summary_lines(summary: list[dict], time_limits: set) -> list[str]:
    limit = ", ".join(f"{t:g}" for t in sorted(time_limits)) or "-"
    lines = [
        "## Summary per solver",
        "",
        f"Solved = proven optimal or proven infeasible, and not contradicted by another run. "
        f"SGM = shifted geometric mean of the wall time (shift {stats.SHIFT:g} s), unsolved runs at the "
        f"time limit ({limit} s); ratio = (SGM + 1) / (best SGM + 1). Primal integral: Berthold's, in seconds, "
        f"against the best plan any run found. Wrong: a proof another run contradicts. Failed: FAILED, CRASHED, "
        f"TIMEOUT or INPUT_ERROR.",
        "",
        "| solver | runs | solved | optimal | infeasible | wrong | failed | SGM time s | ratio | mean primal integral s "
        "| median time to first plan s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        lines.append(f"| {s['solver']} | {s['runs']} | {s['solved']} | {s['optimal']} | {s['infeasible']} | "
                     f"{s['wrong']} | {s['failed']} | {_cell(s['sgm_time'], '.2f')} | {_cell(s['sgm_ratio'], '.2f')} | "
                     f"{_cell(s['mean_primal_integral'], '.2f')} | {_cell(s['median_time_to_first'], '.2f')} |")
    return lines


def variability_lines(var: list[dict]) -> list[str]:
    if not var:
        return []
    lines = [
        "", "## Performance variability (repeats with different seeds)", "",
        "Spread = (max + 1) / (min + 1) of one instance's charged times over its repeats; CV = coefficient of "
        "variation of those times. Status/solved/plan differ: instances whose repeats disagree on it.",
        "",
        "| solver | instances | repeats | median spread | max spread | median CV | status differs | solved differs "
        "| plan differs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for v in var:
        lines.append(f"| {v['solver']} | {v['instances']} | {v['repeats']} | {v['median_spread']:.2f} | "
                     f"{v['max_spread']:.2f} | {v['median_cv']:.2f} | {v['status_differs']} | {v['solved_differs']} "
                     f"| {v['plan_differs']} |")
    return lines


def write_markdown(rows: list[dict], command: str, machine: dict, elapsed: float, path: Path,
                   summary: list | None = None, variability: list | None = None, executor: str = "",
                   baselines: bool = True) -> None:
    lines = [
        "# amp_opt benchmark",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['python']}, {machine['platform']}; "
        f"amp_opt {machine['amp_opt']}; {machine['date']}; whole run {elapsed:.0f} s"
        + (f"; load average at the end {machine['load']}" if machine.get("load") else "")
        + (f"; jobs: {executor}" if executor else "") + ".",
        "",
    ]
    if summary:
        lines += summary_lines(summary, {r["time_limit"] for r in rows if r["time_limit"]})
        lines += variability_lines(variability or [])
        lines += [""]
    columns = MARKDOWN_COLUMNS + (BASELINE_COLUMNS if baselines else ())
    lines += [
        "## Runs",
        "",
        "Plan s: the hetero time of the run's plan (`amp_opt.evaluate`); first s / 1% s: seconds to the first "
        "plan and to a proven gap of 1%; P int: primal integral (s); progs: programs solved. "
        + ("amp fit: the amp-model optimum if it fits in memory, else the best amp-ranked plan that fits; "
           "x amp = amp fit / plan; x expert = expert / plan. "
           if baselines else "")
        + "Column definitions: benchmarks/README.md.",
        "",
        "| " + " | ".join(title for _, title, _ in columns) + " |",
        "|" + "|".join("---" for _ in columns) + "|",
    ]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row[key], spec) for key, _, spec in columns) + " |")
    notes = [(row["instance"], row["solver"], row["repeat"], row["error"], row["wrong"], row["baseline_error"])
             for row in rows if row["error"] or row["baseline_error"] or row["wrong"]]
    if notes:
        lines += ["", "## Errors and notes", ""]
        seen = set()
        for name, solver, rep, error, wrong, base_error in notes:
            if error:
                lines.append(f"- {name}, {solver} #{rep}: {error}")
            if wrong:
                lines.append(f"- {name}, {solver} #{rep}: WRONG: {wrong}")
            if base_error and name not in seen:
                seen.add(name)
                lines.append(f"- {name}, baselines: {base_error}")
    sizes = [(row["instance"], row["solver"], row["model_size"]) for row in rows
             if row["model_size"] and row["repeat"] == 0]
    if sizes:
        lines += ["", "## Model size (solver statistics, first repeat)", ""]
        lines += [f"- {name}, {solver}: {size}" for name, solver, size in sizes]
    path.write_text("\n".join(lines) + "\n")


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _style(i: int) -> str:
    """A line style per ten solvers, so that solvers sharing one of the ten default colours differ."""
    return ("-", "--", "-.", ":")[(i // 10) % 4]


def write_profile(rows: list[dict], path: Path) -> bool:
    """The Dolan-More performance profile of wall times (log2 ratio to the best solver per problem)."""
    plt = _pyplot()
    if plt is None:
        return False
    problems, ratios = stats.performance_profile(rows)
    finite = [r for values in ratios.values() for r in values if math.isfinite(r)]
    top = max(2.0, max(finite, default=2.0) * 1.5)
    taus = sorted({1.0, top, *finite})
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for i, (solver, values) in enumerate(ratios.items()):
        ys = [stats.profile_value(values, t) for t in taus]
        ax.step(taus, ys, where="post", linestyle=_style(i),
                label=f"{solver} ({sum(math.isfinite(v) for v in values)}/{len(values)})")
    ax.set_xscale("log", base=2)
    ax.set_xlim(1, top)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("tau: time within tau x the fastest solver on the problem (log2)")
    ax.set_ylabel("fraction of problems solved")
    ax.set_title(f"performance profile (Dolan-More), {len(problems)} problems")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_primal_plot(rows: list[dict], traces: dict, path: Path) -> bool:
    """Mean primal gap over time per solver (the area under each curve is its mean primal integral)."""
    plt = _pyplot()
    if plt is None:
        return False
    horizon = max((r["time_limit"] for r in rows if r["time_limit"]), default=1.0)
    times = sorted({0.0, horizon, *[horizon * k / 400 for k in range(401)],
                    *[10 ** (e / 20) for e in range(-60, 1 + int(20 * math.log10(horizon)))]})
    curves = stats.mean_primal_gap_curve(rows, traces, times)
    if not curves:
        return False
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for i, (solver, ys) in enumerate(curves.items()):
        ax.step(times, ys, where="post", linestyle=_style(i), label=solver)
    ax.set_xscale("symlog", linthresh=0.1)
    ax.set_xlim(0, horizon)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("seconds since the start of the solve")
    ax.set_ylabel("mean primal gap (1 = no plan yet)")
    ax.set_title("primal gap over time, mean over runs")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_plot(rows: list[dict], path: Path) -> bool:
    """Plan time over the ideal bound per instance (amp_opt per solver, AMP, expert) and solve wall times.

    Uses the first repeat of each run.  Returns False (and writes nothing) when matplotlib is missing.
    """
    plt = _pyplot()
    if plt is None:
        return False
    rows = [r for r in rows if r["repeat"] == 0]
    instances = list(dict.fromkeys(row["instance"] for row in rows))
    solvers = list(dict.fromkeys(row["solver"] for row in rows))
    first = {row["instance"]: row for row in reversed(rows)}
    series: list[tuple[str, list]] = []
    for solver in solvers:
        by = {row["instance"]: row for row in rows if row["solver"] == solver}
        series.append((f"amp_opt ({solver})", [ratio(by.get(i, {}).get("amp_opt_s"), first[i]["ideal_s"])
                                              for i in instances]))
    series.append(("amp-model optimum (fitting)", [ratio(first[i]["amp_fit_s"], first[i]["ideal_s"]) for i in instances]))
    series.append(("expert default", [ratio(first[i]["expert_s"], first[i]["ideal_s"]) for i in instances]))

    fig, (left, right) = plt.subplots(1, 2, figsize=(max(10, 1.6 * len(instances) + 4), 5))
    width = 0.8 / len(series)
    for k, (label, values) in enumerate(series):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(instances))]
        left.bar(xs, [v if v is not None else 0 for v in values], width, label=label)
    left.axhline(1.0, color="black", linewidth=0.8)
    left.set_ylabel("time per iteration / ideal bound (hetero)")
    left.set_xticks(range(len(instances)), instances, rotation=45, ha="right", fontsize=8)
    left.legend(fontsize=8)
    left.set_title("plan quality (lower is better; missing bar = no plan)")
    width = 0.8 / len(solvers)
    for k, solver in enumerate(solvers):
        by = {row["instance"]: row for row in rows if row["solver"] == solver}
        xs = [i + (k - (len(solvers) - 1) / 2) * width for i in range(len(instances))]
        right.bar(xs, [by[i]["wall_time"] if i in by and by[i]["wall_time"] else 0 for i in instances], width,
                  label=solver)
    if any(row["wall_time"] and row["wall_time"] > 0 for row in rows):
        right.set_yscale("log")
    right.set_ylabel("solve wall time (s)")
    right.set_xticks(range(len(instances)), instances, rotation=45, ha="right", fontsize=8)
    right.legend(fontsize=8)
    right.set_title("solver wall time")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
