"""What ``--top-k K`` costs against one plan, and whether its list is the K best plans.

Usage (from the project root):

    python benchmarks/top_k.py > benchmarks/results/top_k.md

Per instance, as child processes, one after the other: ``python -m amp_opt solve FILE --json``
(one plan), ``--top-k K --json`` (the default solver: on these clusters ``auto`` picks CP-SAT,
whose candidates are listed exactly where the enumerator can walk them, search/mip/listing.py),
and ``--solver enumerate --top-k K --json`` (the enumerator's exact list, where it runs).  The
lists agree when their values agree to 1e-9 relative.  The generated instances are written to a
temporary directory.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from amp_opt.bench.runner import run_measured  # noqa: E402
from amp_opt.bench.writers import commit as git_commit, machine_info  # noqa: E402

# (name, generate arguments or a bundled file)
INSTANCES = [
    ("amp_het_cluster (16 GPUs, 3 types)", ROOT / "instances/amp_het_cluster.json"),
    ("generated, 320 GPUs of 2 types", ["--seed", "7", "--nodes", "40", "--devices-per-node", "8",
                                        "--device-types", "2", "--layers", "34", "--global-batch", "512"]),
    ("g0256-s108-t2-l32 (256 GPUs, 2 types)", ROOT / "instances/suite/gen/g0256-s108-t2-l32.json"),
]


def run(path: Path, *args: str, limit: float) -> dict:
    """One solve: its seconds, status, within text and the values of its plans (or the error line)."""
    done = run_measured([sys.executable, "-m", "amp_opt", "solve", str(path), "--time-limit", f"{limit:g}",
                         "--json", *args], cwd=ROOT)
    if done.code != 0:
        lines = done.stderr.strip().splitlines()
        return {"seconds": done.wall, "error": f"exit {done.code}: {lines[-1] if lines else ''}"}
    doc = json.loads(done.stdout)
    plans = doc.get("top") or [doc]
    values = [p["predicted_time"] for p in plans]
    return {"seconds": done.wall, "status": doc["solver"]["status"], "within": doc["solver"].get("within"),
            "values": values, "solver": doc["solver"]["name"], "memory": done.peak_mib}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=10, help="plans to list (default: 10)")
    parser.add_argument("--time-limit", type=float, default=600.0, help="seconds per solve (default: 600)")
    args = parser.parse_args()
    commit = git_commit(ROOT)
    print("# `--top-k` against one plan\n")
    print(f"- Command: `python benchmarks/top_k.py --k {args.k} --time-limit {args.time_limit:g}` (commit {commit})")
    print("  Machine: " + ", ".join(f"{k} {v}" for k, v in machine_info().items()) + "\n")
    print(f"Per instance: `solve FILE --json` (one plan), `solve FILE --top-k {args.k} --json` (the default "
          f"solver) and `solve FILE --solver enumerate --top-k {args.k} --json`; each with "
          f"`--time-limit {args.time_limit:g}`. \"same list\": the two top-{args.k} lists' values agree to 1e-9 relative.\n")
    print(f"| instance | one plan s | top-{args.k} s | ratio | top-{args.k} solver, status | within (top-{args.k}) "
          f"| enumerate top-{args.k} s | same list | peak MiB (top-{args.k}) |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, source in INSTANCES:
            if isinstance(source, list):
                path = Path(tmp) / "generated.json"
                subprocess.run([sys.executable, "-m", "amp_opt", "generate", *source, "--check", "0", "-o", str(path)],
                               cwd=ROOT, check=True, capture_output=True)
            else:
                path = source
            one = run(path, limit=args.time_limit)
            top = run(path, "--top-k", str(args.k), limit=args.time_limit)
            enum = run(path, "--solver", "enumerate", "--top-k", str(args.k), limit=args.time_limit)
            if "error" in top or "error" in one:
                print(f"| {name} | {one['seconds']:.1f} | {top['seconds']:.1f} | - | {top.get('error', '')} | - | - | - | - |")
                continue
            same = ("-" if "error" in enum else
                    "yes" if len(enum["values"]) == len(top["values"]) and all(
                        abs(a - b) <= 1e-9 * abs(b) for a, b in zip(top["values"], enum["values"])) else "NO")
            enum_s = enum.get("error") or f"{enum['seconds']:.1f}"
            within = [part for part in (top["within"] or "").split("; ") if "--top-k" in part]
            print(f"| {name} | {one['seconds']:.1f} | {top['seconds']:.1f} | {top['seconds'] / one['seconds']:.2f}x "
                  f"| {top['solver']}, {top['status']} | {'; '.join(within) or 'the K best plans'} | {enum_s} | {same} "
                  f"| {top['memory']:.0f} |", flush=True)
    print("\n\"within (top-k)\" quotes only the part of `solver.within` that concerns the list (each run also "
          "says which plans it covers, e.g. whole nodes when idle devices are too many to search).")


if __name__ == "__main__":
    main()
