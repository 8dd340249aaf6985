"""The issue's scale target on many random instances: 1024 GPUs, 60 s, gap at most 1%.

Usage (from the project root, after `pip install .`):

    python benchmarks/gap_1024.py --seeds 0-9 --solvers cpsat,cbc > benchmarks/results/gap_1024.md
    python benchmarks/gap_1024.py --seeds 0-19 --solvers cpsat --engine amp_opt > benchmarks/results/gap_1024_uneven.md
    python benchmarks/gap_1024.py --seeds 0-9 --device-types 2 --engine amp_opt > benchmarks/results/gap_1024_uneven_2types.md

``--engine amp_opt`` sets the generated instance's ``search.engine``, which opens the plans whose
stages and replicas differ (``formulations/uneven-search.md``); ``--device-types`` (default 4) the
number of GPU types the generated clusters mix.

For each seed it runs, as a child process,

    python -m amp_opt generate --seed S --nodes 128 --devices-per-node 8 --device-types T --layers 96 -o FILE
    python -m amp_opt solve FILE --solver SOLVER --time-limit 60 --json

and tabulates the solver block (status, wall time, objective, bound, gap), the solve
process's peak resident memory (its own ``ru_maxrss``, from ``os.wait4``) and the plan, or
the one-line message of a non-zero exit code (3: no plan fits; 4: none found in time).
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

from amp_opt.bench.writers import commit, machine_info  # noqa: E402
from amp_opt.bench.rows import plan_label  # noqa: E402
from amp_opt.bench.runner import run_measured  # noqa: E402


def shape(types: int) -> list[str]:
    """The generator's options for one 1024-GPU instance of ``types`` GPU types."""
    return ["--nodes", "128", "--devices-per-node", "8", "--device-types", str(types), "--layers", "96"]


def seeds(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def run(seed: int, solver: str, time_limit: float, folder: Path, engine: str | None = None, types: int = 4) -> dict:
    path = folder / f"g1024-s{seed}.json"
    subprocess.run([sys.executable, "-m", "amp_opt", "generate", "--seed", str(seed), *shape(types), "-o", str(path)],
                   check=True, capture_output=True, cwd=ROOT)
    if engine is not None:
        doc = json.loads(path.read_text())
        doc.setdefault("search", {})["engine"] = engine
        path.write_text(json.dumps(doc))
    done = run_measured([sys.executable, "-m", "amp_opt", "solve", str(path), "--solver", solver,
                         "--time-limit", str(time_limit), "--json"], cwd=ROOT)
    row = {"seed": seed, "solver": solver, "exit": done.code, "process_s": done.wall, "peak_mib": done.peak_mib}
    if done.code == 0:
        result = json.loads(done.stdout)
        row.update(result["solver"])
        plan = result["plan"]
        row["plan"] = plan_label(plan)
    else:
        row["message"] = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-9")
    parser.add_argument("--solvers", default="cpsat")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--engine", default=None, help="the instances' search.engine (amp_opt: the uneven plans too)")
    parser.add_argument("--device-types", type=int, default=4, help="GPU types per generated cluster (1 to 10, the catalog's)")
    args = parser.parse_args()
    if not 1 <= args.device_types <= 10:
        parser.error("--device-types: must be 1 to 10")
    machine = machine_info()
    print(f"# 1024 GPUs, 96 layers, {args.device_types} GPU types: gap after {args.time_limit:g} s\n")
    print(f"Command: `python benchmarks/gap_1024.py --seeds {args.seeds} --solvers {args.solvers}"
          f"{'' if args.time_limit == 60 else f' --time-limit {args.time_limit:g}'}"
          f"{'' if args.device_types == 4 else f' --device-types {args.device_types}'}"
          f"{'' if args.engine is None else f' --engine {args.engine}'}` (commit {commit(ROOT)})\n")
    print("Machine: " + ", ".join(f"{k} {v}" for k, v in machine.items()) + "\n")
    engine = "" if args.engine is None else f', with `"search": {{"engine": "{args.engine}"}}`'
    print("Instance per seed: `python -m amp_opt generate --seed S " + " ".join(shape(args.device_types)) + f"`{engine}; "
          f"solve: `python -m amp_opt solve FILE --solver SOLVER --time-limit {args.time_limit:g}`.\n")
    print("| seed | solver | status | solve s | objective s | bound s | gap | peak MiB | plan |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for seed in seeds(args.seeds):
            for solver in args.solvers.split(","):
                row = run(seed, solver, args.time_limit, Path(folder), args.engine, args.device_types)
                rows.append(row)
                if row["exit"] == 0:
                    print(f"| {seed} | {solver} | {row['status']} | {row['wall_time']:.1f} | {row['objective']:.6f} | "
                          f"{row['bound']:.6f} | {100 * row['gap']:.2f}% | {row['peak_mib']:.0f} | {row['plan']} |", flush=True)
                else:
                    print(f"| {seed} | {solver} | exit {row['exit']} | {row['process_s']:.1f} | - | - | - | "
                          f"{row['peak_mib']:.0f} | {row['message']} |", flush=True)
    solved = [r for r in rows if r["exit"] == 0]
    within = [r for r in solved if r["gap"] <= 0.01]
    proven = [r for r in rows if r["exit"] == 3]  # infeasible (exit 3); exit 4: no plan in time, nothing proven
    timed_out = [r for r in rows if r["exit"] not in (0, 3)]
    optimal = [r for r in solved if r["status"] == "OPTIMAL"]
    print(f"\n{len(within)} of {len(solved)} runs with a plan have a gap of at most 1% ({len(optimal)} proven "
          f"optimal); {len(proven)} of {len(rows)} runs proved the instance infeasible (exit 3), and "
          f"{len(timed_out)} ended at the time limit without a plan or a proof.")


if __name__ == "__main__":
    main()
