"""Whole-process wall time and memory of ``solve --time-limit`` over instance sizes (issue 13).

    python benchmarks/time_limits.py [--only targets|sizes|scale] [--out benchmarks/results/time_limits.md]

Part 1 (targets): ``--time-limit 5`` on 192, 512, 1024 and 4096 GPUs, and ``auto`` against
``--solver cpsat`` on the 512-GPU case.  Part 2 (sizes): ``--time-limit 20`` from 1 to
10^9 GPUs, 3 to 10^5 layers and global batches up to 2^40.  Part 3 (scale): ``--time-limit 60``
(issue 14's budget) on 16,384 and 65,536 GPUs.  Every run is a fresh
``python -m amp_opt solve FILE --json`` process; wall time is measured around it and peak
memory is the child's maximum resident set (``os.wait4``).  Instances are generated with
``python -m amp_opt generate`` (commands in the table) or derived from
``instances/suite/scale/s4096-llama3-70b-4types.json`` (node counts or the model's layer
count changed, as said in the table) into a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from amp_opt.bench import runner  # noqa: E402
S4096 = ROOT / "instances" / "suite" / "scale" / "s4096-llama3-70b-4types.json"


def generate(folder: Path, name: str, *args: str) -> tuple[Path, str]:
    path = folder / f"{name}.json"
    command = ["python", "-m", "amp_opt", "generate", *args, "-o", str(path)]
    subprocess.run([sys.executable, *command[1:]], check=True, cwd=ROOT)
    return path, " ".join(command[:-1] + [f"{name}.json"])


def derived(folder: Path, name: str, how: str, nodes_times: int = 1, **model) -> tuple[Path, str]:
    doc = json.loads(S4096.read_text())
    for node in doc["nodes"]:
        node["count"] = node.get("count", 1) * nodes_times
    doc["model"].update(model)
    doc["name"] = name
    path = folder / f"{name}.json"
    path.write_text(json.dumps(doc))
    return path, f"s4096-llama3-70b-4types.json with {how}"


def run_measured(path: Path, limit: float, solver: str = "auto") -> dict:
    """One solve process: exit code, wall seconds, peak resident MiB (os.wait4), outcome."""
    done = runner.run_measured([sys.executable, "-m", "amp_opt", "solve", str(path), "--time-limit", f"{limit:g}",
                                "--solver", solver, "--json"], cwd=ROOT)
    message = done.stderr.strip().splitlines()
    try:
        doc = json.loads(done.stdout)
    except json.JSONDecodeError:
        doc = {}
    s = doc.get("solver", {})
    if "plan" in doc:
        outcome = f"plan {doc['predicted_time']:.4g} s, {s.get('status')}, gap {s.get('gap', 0):.1%}"
    else:
        outcome = doc.get("status", "no JSON")
    return {"rc": done.code, "wall": done.wall, "rss": done.peak_mib, "outcome": outcome,
            "message": message[-1] if message else "", "solver": s.get("name", "")}


def case_rows(cases, limit: float) -> list[str]:
    """One table row per (case, instance path, how it was made), each a solve under ``limit`` seconds."""
    rows = []
    for case, path, how in cases:
        r = run_measured(path, limit)
        print(case, r, file=sys.stderr)
        rows.append(f"| {case} | `{how}` | {r['rc']} | {r['wall']:.2f} | {r['rss']:.0f} | {r['outcome']} | "
                    f"{r['message']} |")
    return rows + [""]


def machine() -> str:
    cpu = "unknown"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"cpu {cpu}, cores {os.cpu_count()}, python {platform.python_implementation()} "
            f"{platform.python_version()}, {platform.platform()}, load average at start {load:.1f}, "
            f"date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("targets", "sizes", "scale"), default=None)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "time_limits.md"))
    args = ap.parse_args()
    lines = ["# `solve --time-limit`: whole-process wall time and memory", "",
             f"Command: `python benchmarks/time_limits.py{' --only ' + args.only if args.only else ''}`", "",
             f"Machine: {machine()}", "",
             "Each run: `python -m amp_opt solve FILE --time-limit S --solver SOLVER --json`, wall time of the whole "
             "process (start, load, search, write), peak resident memory of the process.", ""]
    with tempfile.TemporaryDirectory(prefix="amp_opt_bench_") as tmp:
        folder = Path(tmp)
        if args.only in (None, "targets"):
            lines += ["## `--time-limit 5` (target: whole process <= 6.5 s, a plan, exit 0)", "",
                      "| GPUs | instance | solver | exit | wall s | peak MiB | outcome |", "|---|---|---|---|---|---|---|"]
            cases = [
                (192, *generate(folder, "g192", "--seed", "7", "--nodes", "24", "--devices-per-node", "8",
                                "--device-types", "4", "--layers", "96", "--global-batch", "512")),
                (512, *generate(folder, "g512", "--seed", "3", "--nodes", "64", "--devices-per-node", "8",
                                "--device-types", "2", "--layers", "96", "--global-batch", "512")),
                (1024, *generate(folder, "g1024", "--seed", "0", "--nodes", "128", "--devices-per-node", "8",
                                 "--device-types", "4", "--layers", "96", "--global-batch", "512")),
                (4096, S4096, "instances/suite/scale/s4096-llama3-70b-4types.json"),
                (4096, *generate(folder, "g4096", "--seed", "1", "--nodes", "512", "--devices-per-node", "8",
                                 "--device-types", "4", "--layers", "96", "--global-batch", "2048")),
            ]
            for gpus, path, how in cases:
                solvers = ["auto", "cpsat"] if gpus == 512 else ["auto"]
                for solver in solvers:
                    r = run_measured(path, 5, solver)
                    print(gpus, solver, r, file=sys.stderr)
                    lines.append(f"| {gpus} | `{how}` | {solver} ({r['solver']}) | {r['rc']} | {r['wall']:.2f} | "
                                 f"{r['rss']:.0f} | {r['outcome']} |")
            lines.append("")
        if args.only in (None, "sizes"):
            lines += ["## Sizes, `--time-limit 20` (target: within 21.5 s, under 2048 MiB, a plan or one line)", "",
                      "| case | instance | exit | wall s | peak MiB | outcome | message (stderr) |",
                      "|---|---|---|---|---|---|---|"]
            cases = [
                ("1 GPU, 3 layers", *generate(folder, "one", "--seed", "1", "--nodes", "1", "--devices-per-node", "1",
                                              "--device-types", "1", "--layers", "3", "--global-batch", "1")),
                ("8 GPUs, 3 layers, batch 2^40", *generate(folder, "eight", "--seed", "2", "--nodes", "1",
                                                           "--devices-per-node", "8", "--device-types", "1",
                                                           "--layers", "3", "--global-batch", str(2 ** 40))),
                ("192 GPUs, 96 layers", *generate(folder, "g192", "--seed", "7", "--nodes", "24", "--devices-per-node",
                                                  "8", "--device-types", "4", "--layers", "96", "--global-batch", "512")),
                ("512 GPUs, 1000 layers", *generate(folder, "g512l1000", "--seed", "3", "--nodes", "64",
                                                    "--devices-per-node", "8", "--device-types", "2", "--layers",
                                                    "1000", "--global-batch", "512")),
                ("1024 GPUs, 96 layers, batch 2^40", *generate(folder, "g1024b40", "--seed", "0", "--nodes", "128",
                                                               "--devices-per-node", "8", "--device-types", "4",
                                                               "--layers", "96", "--global-batch", str(2 ** 40))),
                ("4096 GPUs, 82 layers", S4096, "instances/suite/scale/s4096-llama3-70b-4types.json"),
                ("4096 GPUs, 10^5 layers", *derived(folder, "s4096-l1e5", "\"layers\": 100000, hidden 256 (a small "
                                                    "model)", layers=100000, hidden=256, heads=2, kv_heads=1, ffn=512,
                                                    vocab=1000, seq_len=512)),
                ("4096 GPUs, 10^5 layers of llama3-70b", *derived(folder, "s4096-l1e5-70b", "\"layers\": 100000",
                                                                  layers=100000)),
                ("128 GPUs, 10^5 layers, batch 2^40", *generate(folder, "g128l1e5", "--seed", "3", "--nodes", "16",
                                                                "--devices-per-node", "8", "--device-types", "3",
                                                                "--layers", "100000", "--global-batch", str(2 ** 40))),
                ("16384 GPUs", *derived(folder, "s16k", "every node count x4", nodes_times=4)),
                ("65536 GPUs", *derived(folder, "s64k", "every node count x16", nodes_times=16)),
                ("10^6 GPUs", *derived(folder, "s1m", "every node count x244 (999424 GPUs)", nodes_times=244)),
                ("10^9 GPUs", *derived(folder, "s1g", "every node count x244140 (999997440 GPUs)",
                                       nodes_times=244140)),
            ]
            lines += case_rows(cases, 20)
        if args.only in (None, "scale"):
            lines += ["## Scale, `--time-limit 60` (issue 14's target: 16,384 GPUs within 5% in 60 s)", "",
                      "| case | instance | exit | wall s | peak MiB | outcome | message (stderr) |",
                      "|---|---|---|---|---|---|---|"]
            cases = [("16384 GPUs", *derived(folder, "s16k", "every node count x4", nodes_times=4)),
                     ("65536 GPUs", *derived(folder, "s64k", "every node count x16", nodes_times=16))]
            lines += case_rows(cases, 60)
    out = Path(args.out)
    existing = out.read_text() if out.exists() and args.only else ""
    out.write_text("\n".join(lines) + "\n" if not existing else existing.rstrip() + "\n\n" + "\n".join(lines[8:]) + "\n")
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
