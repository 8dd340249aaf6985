"""Benchmarks: every solver on every instance of a suite, with plan-quality baselines.

``run_bench`` runs each solve, and the baselines of each instance, in a fresh
child process ("spawn"), so that wall time and peak memory (the child's own
``ru_maxrss``) belong to that run alone and a crash, a hang or an exception
becomes a row instead of ending the benchmark.  A child that outlives its time
limit plus a margin is killed and recorded as TIMEOUT.

Per (instance, solver) row: the solver's status, objective, bound, gap, wall
time, peak RSS and model size (``result.solver.extra``), and the hetero time of
its plan next to AMP's pick, the expert default and the ideal bound
(:mod:`amp_opt.baselines`).  Writers put a CSV, a markdown table (with the
command and the machine on top), a JSON file and a PNG plot into the output
directory.  ``python -m amp_opt bench`` is the command.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import InputError

# Paper suite: the AMP paper's three experiments, by path; scale suite: a directory.
SUITES: dict[str, tuple[str, ...]] = {
    "paper": ("instances/amp_homogeneous.json", "instances/amp_het_cluster.json", "instances/amp_het_model.json"),
    "scale": ("instances/suite/scale",),
}
SUITE_CHOICES = ("paper", "scale", "all")
DEFAULT_TIME_LIMIT = 300.0
# A child may run this much longer than its solver's time limit before it is killed:
# process start-up and imports, loading the instance, and a search step in progress.
MARGIN_SECONDS = 30.0
MARGIN_FRACTION = 0.25

COLUMNS = (
    "suite", "instance", "devices", "nodes", "gpu_types", "layers", "global_batch",
    "solver", "status", "objective_s", "bound_s", "gap", "wall_s", "peak_rss_mib", "model_size", "plan",
    "amp_opt_s", "amp_pick_s", "amp_pick_fits", "amp_status", "amp_fit_s", "amp_fit_rank", "expert_s", "expert_plan",
    "ideal_s", "speedup_vs_amp", "speedup_vs_expert", "ratio_to_ideal",
    "baseline_wall_s", "baseline_peak_rss_mib", "error", "baseline_error",
)


# ---------------------------------------------------------------- records

@dataclass(frozen=True)
class BenchInstance:
    """An instance of a suite: where it is and its size."""

    suite: str
    path: Path
    name: str
    devices: int
    nodes: int
    gpu_types: int
    layers: int
    global_batch: int


@dataclass(frozen=True)
class SolveRun:
    """One solver on one instance, as its child process reported it (plain data)."""

    status: str  # OPTIMAL, FEASIBLE, UNKNOWN, INFEASIBLE, INPUT_ERROR, ERROR, TIMEOUT, CRASHED
    wall_s: float  # the child's solve call, or the parent's wait for a killed child
    peak_rss_mib: float | None
    objective_s: float | None = None
    bound_s: float | None = None
    gap: float | None = None
    time_s: float | None = None  # evaluate(plan, "hetero") of the solver's best plan
    plan: dict | None = None
    extra: dict = field(default_factory=dict)
    error: str = ""


@dataclass(frozen=True)
class BaselineRun:
    """The baselines of one instance (hetero seconds), as their child reported them."""

    wall_s: float
    peak_rss_mib: float | None
    amp_pick_s: float | None = None
    amp_pick_fits: bool | None = None
    amp_model_s: float | None = None
    amp_status: str = ""
    amp_fit_s: float | None = None
    amp_fit_rank: int | None = None
    amp_fit_plan: dict | None = None
    amp_pick_plan: dict | None = None
    expert_s: float | None = None
    expert_plan: dict | None = None
    expert_reason: str = ""
    ideal_s: float | None = None
    error: str = ""


# ---------------------------------------------------------------- suites

def project_root() -> Path:
    """The checkout holding ``instances/`` (the package's parent), else the working directory."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "instances").is_dir() else Path.cwd()


def suite_paths(suite: str, root: Path | None = None) -> list[tuple[str, Path]]:
    """(suite name, instance file) pairs of "paper", "scale" or "all", in a fixed order."""
    if suite not in SUITE_CHOICES:
        raise InputError("--suite", f"unknown suite {suite!r} (choose from {', '.join(SUITE_CHOICES)})")
    root = project_root() if root is None else root
    names = ("paper", "scale") if suite == "all" else (suite,)
    out = []
    for name in names:
        for entry in SUITES[name]:
            path = root / entry
            files = sorted(path.glob("*.json")) if path.is_dir() else [path]
            if not files or not all(f.is_file() for f in files):
                raise InputError("--suite", f"suite {name!r}: no instance files at {path}")
            out.extend((name, f) for f in files)
    return out


def order_entries(entries: list[BenchInstance]) -> list[BenchInstance]:
    """Suites in their given order; within a suite, by GPU count (small runs first), then file order."""
    rank = {name: i for i, name in enumerate(dict.fromkeys(e.suite for e in entries))}
    return sorted(entries, key=lambda e: (rank[e.suite], e.devices))


def describe(suite: str, path: Path) -> BenchInstance:
    from .instance import load_instance

    inst = load_instance(path)
    return BenchInstance(suite, path, inst.name, inst.num_devices, len(inst.nodes), len(inst.devices_by_type),
                         inst.num_layers, inst.training.global_batch)


# ---------------------------------------------------------------- child processes

def _peak_rss_mib() -> float:
    """This process's peak resident set size in MiB (ru_maxrss: KiB on Linux, bytes on macOS)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def _error_status(exc: BaseException) -> str:
    from .errors import InfeasibleError

    if isinstance(exc, InfeasibleError):
        return "INFEASIBLE"
    if isinstance(exc, InputError):
        return "INPUT_ERROR"
    return "ERROR"


def _describe_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".replace("\n", " ")


def solve_child(path: str, solver: str, time_limit: float) -> dict:
    """Body of a solve child: load, solve under hetero, return plain data for :class:`SolveRun`."""
    from .instance import load_instance
    from .solver import solve

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
    from .baselines import amp_pick, expert_default, ideal_bound
    from .instance import load_instance

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
    import multiprocessing
    import resource

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


# ---------------------------------------------------------------- rows (pure)

def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b is not None and b > 0 else None


def plan_label(plan: dict | None) -> str:
    """A plan's degrees in one short string ("tp=4 dp=2 pp=2 mb=1")."""
    if not plan:
        return ""
    return f"tp={plan['tp']} dp={plan['dp']} pp={plan['pp']} mb={plan['micro_batch']}"


def make_row(inst: BenchInstance, solver: str, run: SolveRun, base: BaselineRun) -> dict[str, Any]:
    """One CSV row: the run, the baselines and the ratios between their hetero times.

    speedup_vs_amp compares with the AMP plan one could deploy: AMP's pick if it
    fits, else the best amp-ranked plan that fits (amp_fit_s, equal to
    amp_pick_s when the pick fits).  ratio_to_ideal = amp_opt_s / ideal_s >= 1.
    """
    extra = {k: v for k, v in run.extra.items() if k != "placement"}
    row = {
        "suite": inst.suite, "instance": inst.name, "devices": inst.devices, "nodes": inst.nodes,
        "gpu_types": inst.gpu_types, "layers": inst.layers, "global_batch": inst.global_batch,
        "solver": solver, "status": run.status, "objective_s": run.objective_s, "bound_s": run.bound_s,
        "gap": run.gap, "wall_s": run.wall_s, "peak_rss_mib": run.peak_rss_mib,
        "model_size": " ".join(f"{k}={v}" for k, v in sorted(extra.items())),
        "plan": plan_label(run.plan), "amp_opt_s": run.time_s,
        "amp_pick_s": base.amp_pick_s, "amp_pick_fits": base.amp_pick_fits, "amp_status": base.amp_status,
        "amp_fit_s": base.amp_fit_s, "amp_fit_rank": base.amp_fit_rank,
        "expert_s": base.expert_s, "expert_plan": plan_label(base.expert_plan), "ideal_s": base.ideal_s,
        "speedup_vs_amp": _ratio(base.amp_fit_s, run.time_s),
        "speedup_vs_expert": _ratio(base.expert_s, run.time_s),
        "ratio_to_ideal": _ratio(run.time_s, base.ideal_s),
        "baseline_wall_s": base.wall_s, "baseline_peak_rss_mib": base.peak_rss_mib,
        "error": run.error, "baseline_error": base.error,
    }
    assert tuple(row) == COLUMNS
    return row


# ---------------------------------------------------------------- the run

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
    from .solver import SOLVERS

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


# ---------------------------------------------------------------- machine and writers

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
    from . import __version__

    return {
        "cpu": cpu,
        "cores": f"{os.cpu_count()} ({usable} usable)",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "platform": platform.platform(),
        "amp_opt": __version__,
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
    }


def write_csv(rows: list[dict], path: Path) -> None:
    import csv

    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in row.items()})


def write_json(rows: list[dict], command: str, machine: dict, path: Path) -> None:
    path.write_text(json.dumps({"command": command, "machine": machine, "columns": list(COLUMNS), "rows": rows},
                               indent=1) + "\n")


MARKDOWN_COLUMNS = (
    ("instance", "instance", None), ("devices", "GPUs", None), ("gpu_types", "types", None),
    ("layers", "layers", None), ("solver", "solver", None), ("status", "status", None),
    ("wall_s", "wall s", ".2f"), ("peak_rss_mib", "RSS MiB", ".0f"), ("gap", "gap", ".2%"),
    ("amp_opt_s", "amp_opt s", ".4f"), ("amp_pick_s", "AMP pick s", ".4f"), ("amp_fit_s", "AMP fit s", ".4f"),
    ("expert_s", "expert s", ".4f"), ("ideal_s", "ideal s", ".4f"), ("speedup_vs_amp", "x AMP", ".3f"),
    ("speedup_vs_expert", "x expert", ".3f"), ("ratio_to_ideal", "/ ideal", ".3f"), ("plan", "plan", None),
)


def _cell(value, spec) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return format(value, spec) if spec else str(value)


def write_markdown(rows: list[dict], command: str, machine: dict, elapsed: float, path: Path) -> None:
    lines = [
        "# amp_opt benchmark",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['python']}, {machine['platform']}; "
        f"amp_opt {machine['amp_opt']}; {machine['date']}; whole run {elapsed:.0f} s.",
        "",
        "All times are seconds per iteration under the hetero cost model (`amp_opt.evaluate`). "
        "AMP pick: the amp-model optimum (rank order) re-scored; AMP fit: the best amp-ranked plan that fits "
        "(the pick itself when it fits); x AMP = AMP fit / amp_opt; x expert = expert / amp_opt; "
        "/ ideal = amp_opt / ideal bound. Column definitions: benchmarks/README.md.",
        "",
        "| " + " | ".join(title for _, title, _ in MARKDOWN_COLUMNS) + " |",
        "|" + "|".join("---" for _ in MARKDOWN_COLUMNS) + "|",
    ]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row[key], spec) for key, _, spec in MARKDOWN_COLUMNS) + " |")
    notes = [(row["instance"], row["solver"], row["error"], row["baseline_error"]) for row in rows
             if row["error"] or row["baseline_error"]]
    if notes:
        lines += ["", "## Errors and notes", ""]
        seen = set()
        for name, solver, error, base_error in notes:
            if error:
                lines.append(f"- {name}, {solver}: {error}")
            if base_error and name not in seen:
                seen.add(name)
                lines.append(f"- {name}, baselines: {base_error}")
    sizes = [(row["instance"], row["solver"], row["model_size"]) for row in rows if row["model_size"]]
    if sizes:
        lines += ["", "## Model size (solver statistics)", ""]
        lines += [f"- {name}, {solver}: {size}" for name, solver, size in sizes]
    path.write_text("\n".join(lines) + "\n")


def write_plot(rows: list[dict], path: Path) -> bool:
    """Plan time over the ideal bound per instance (amp_opt per solver, AMP, expert) and solve wall times.

    Returns False (and writes nothing) when matplotlib is missing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    instances = list(dict.fromkeys(row["instance"] for row in rows))
    solvers = list(dict.fromkeys(row["solver"] for row in rows))
    first = {row["instance"]: row for row in reversed(rows)}
    series: list[tuple[str, list]] = []
    for solver in solvers:
        by = {row["instance"]: row for row in rows if row["solver"] == solver}
        series.append((f"amp_opt ({solver})", [_ratio(by.get(i, {}).get("amp_opt_s"), first[i]["ideal_s"])
                                              for i in instances]))
    series.append(("AMP (fitting pick)", [_ratio(first[i]["amp_fit_s"], first[i]["ideal_s"]) for i in instances]))
    series.append(("expert default", [_ratio(first[i]["expert_s"], first[i]["ideal_s"]) for i in instances]))

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
        right.bar(xs, [by[i]["wall_s"] if i in by and by[i]["wall_s"] else 0 for i in instances], width, label=solver)
    if any(row["wall_s"] and row["wall_s"] > 0 for row in rows):
        right.set_yscale("log")
    right.set_ylabel("solve wall time (s)")
    right.set_xticks(range(len(instances)), instances, rotation=45, ha="right", fontsize=8)
    right.legend(fontsize=8)
    right.set_title("solver wall time")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ---------------------------------------------------------------- the command

def add_parser(subparsers) -> None:
    """Register ``bench`` with the CLI."""
    from .cli import _positive_float

    p = subparsers.add_parser("bench", help="run solvers on an instance suite and compare with baselines")
    p.add_argument("--suite", choices=SUITE_CHOICES, default="paper",
                   help="paper: the AMP paper's 3 instances; scale: instances/suite/scale; all: both")
    p.add_argument("--solvers", default="enumerate", type=_solver_list, metavar="LIST",
                   help="comma-separated solvers (enumerate,cpsat,cbc); default enumerate")
    p.add_argument("--time-limit", type=_positive_float, default=DEFAULT_TIME_LIMIT, metavar="S",
                   help=f"seconds per solve (default {DEFAULT_TIME_LIMIT:g}); a child is killed after "
                        f"{1 + MARGIN_FRACTION:g} x S + {MARGIN_SECONDS:g} s")
    p.add_argument("--out", default="benchmarks/results", metavar="DIR", help="output directory")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(run=run_command)


def _solver_list(text: str) -> list[str]:
    import argparse

    from .solver import SOLVERS

    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in SOLVERS]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(SOLVERS)}, got {text!r}")
    return names


def command_line(args) -> str:
    """The command that reproduces a run, spelled out from its parsed options."""
    parts = ["python -m amp_opt bench", "--suite", args.suite, "--solvers", ",".join(args.solvers),
             "--time-limit", f"{args.time_limit:g}", "--out", shlex.quote(str(args.out))]
    return " ".join(parts)


def run_command(args) -> int:
    """``amp-opt bench``: run, write the files, print where they are."""
    rows = run_bench(args.suite, args.solvers, args.time_limit, Path(args.out), progress=not args.quiet,
                     command=command_line(args))
    failed = sum(row["status"] not in ("OPTIMAL", "FEASIBLE") for row in rows)
    print(f"{len(rows)} runs, {failed} without a plan; results in {args.out}/results.md")
    return 0


__all__ = ["run_bench", "suite_paths", "make_row", "add_parser", "COLUMNS", "SUITES", "machine_info"]
