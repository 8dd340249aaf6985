"""Time `python -m amp_opt solve` on the AMP paper instances (issue: "well under 0.5 s").

Usage (from the project root, after `pip install .`):

    python benchmarks/paper_timing.py > benchmarks/results/paper_timing.md

For each instance and configuration it runs the whole command as a child
process three times and reports the median of the solver's own `wall_time`
(the search) and of the process wall time (start-up, loading, search, output).
AMP's reference implementation needs about 500, 500 and 200 s for the same
searches (AMP paper).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INSTANCES = ["amp_homogeneous", "amp_het_cluster", "amp_het_model"]
CONFIGS = [
    ("amp, rank order, enumerate", ["--cost-model", "amp"]),
    ("hetero, free grouping, enumerate", ["--cost-model", "hetero", "--solver", "enumerate"]),
    ("amp, rank order, cpsat", ["--cost-model", "amp", "--solver", "cpsat"]),
    ("hetero, free grouping, cpsat", ["--cost-model", "hetero", "--solver", "cpsat"]),
]
REPEATS = 3


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run(instance: str, args: list[str]) -> tuple[float, float, dict]:
    cmd = [sys.executable, "-m", "amp_opt", "solve", str(ROOT / "instances" / f"{instance}.json"), "--json", *args]
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
    total = time.perf_counter() - start
    doc = json.loads(out.stdout)
    return doc["solver"]["wall_time"], total, doc


def main() -> None:
    print("# Solve times on the AMP paper instances\n")
    print("Command: `python benchmarks/paper_timing.py > benchmarks/results/paper_timing.md`  ")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    print(f"Machine: {os.cpu_count()} cores, {cpu_model()}, Python {platform.python_version()}; commit {commit}  ")
    print(f"Each cell: median of {REPEATS} runs of `python -m amp_opt solve INSTANCE --json ...` as a child process.\n")
    print("| instance | configuration | best plan (tp, dp, pp, mb) | predicted s | solver wall_time s | whole process s |")
    print("|---|---|---|---|---|---|")
    for instance in INSTANCES:
        for label, args in CONFIGS:
            runs = [run(instance, args) for _ in range(REPEATS)]
            search = statistics.median(r[0] for r in runs)
            total = statistics.median(r[1] for r in runs)
            doc = runs[0][2]
            p = doc["plan"]
            print(f"| {instance} | {label} | {p['tp']}, {p['dp']}, {p['pp']}, {p['micro_batch']} "
                  f"| {doc['predicted_time']:.4f} | {search:.3f} | {total:.2f} |")
    print("\nAMP's reference implementation: about 500 s (homogeneous), 500 s (het_cluster) and 200 s (het_model) "
          "per search, as reported in the AMP paper.")


if __name__ == "__main__":
    main()
