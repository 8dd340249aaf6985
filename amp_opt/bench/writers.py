"""Benchmark writers: the results as CSV, JSON, a markdown table (command and machine on top)
and a PNG plot."""

from __future__ import annotations

import csv
import json
import os
import platform
import time
from pathlib import Path

from .. import __version__
from .rows import COLUMNS, ratio

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
    }


def write_csv(rows: list[dict], path: Path) -> None:
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
        series.append((f"amp_opt ({solver})", [ratio(by.get(i, {}).get("amp_opt_s"), first[i]["ideal_s"])
                                              for i in instances]))
    series.append(("AMP (fitting pick)", [ratio(first[i]["amp_fit_s"], first[i]["ideal_s"]) for i in instances]))
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
