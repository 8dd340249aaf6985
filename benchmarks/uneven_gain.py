"""What plans whose stages and replicas differ gain over uniform plans, in-model, per instance.

Usage (from the project root):

    python benchmarks/uneven_gain.py > benchmarks/results/uneven_gain.md
    python benchmarks/uneven_gain.py --time-limit 10 --only amp_het_cluster   # a quick run

For each instance (instances/suite/gen/*.json with 2-4 GPU types, instances/amp_het_cluster.json,
docs/hetero/*.json, and the mixed 16,384-GPU cluster instances/llama3_405b_mixed_16k.json) it writes two copies, ``search.engine`` "megatron" (uniform plans only) and
"amp_opt" (uniform plans and those whose stages and replicas differ), and runs on each, as a
child process, ``python -m amp_opt solve FILE --time-limit T --json`` (the copies in a temporary
folder, the model's ``hf_config`` path made absolute).  The gain is
(uniform - uneven) / uniform of the predicted iteration seconds; the in-run gain compares the
"amp_opt" run's best plan with the best uniform plan of that same run (``solver.uneven.uniform_objective``),
which is what the plans whose stages differ add (the uniform searches of the two runs, both cut by
the time limit, may end on different plans); the status and the ``within`` text of each say on
which space each result is proven, and the uneven bound is the "amp_opt" run's lower bound on
that space (``solver.bound``; its gap, (plan - bound) / plan).  The two solves of an instance run one
after the other.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from amp_opt.bench.runner import run_measured  # noqa: E402
from amp_opt.bench.writers import commit as git_commit, machine_info  # noqa: E402


def instances(only: str | None) -> list[Path]:
    """The instances of the table, the 2-4 type generated suite first."""
    gen = [p for p in sorted((ROOT / "instances/suite/gen").glob("*.json"))
           if 2 <= len(json.loads(p.read_text())["device_types"]) <= 4]
    docs = [p for p in sorted((ROOT / "docs/hetero").glob("*.json")) if "nodes" in json.loads(p.read_text())]
    paths = gen + [ROOT / "instances/amp_het_cluster.json"] + docs + [ROOT / "instances/llama3_405b_mixed_16k.json"]
    if only:
        paths = [p for p in paths if any(word in p.stem for word in only.split(","))]
    return paths


def solve(path: Path, engine: str, time_limit: float) -> dict:
    """One solve of the instance under an engine: the solver block and plan, or the error line."""
    doc = json.loads(path.read_text())
    doc.setdefault("search", {})["engine"] = engine
    config = doc.get("model", {}).get("hf_config")
    if config:  # the one path an instance holds, relative to its file: made absolute for the copy
        doc["model"]["hf_config"] = str((path.parent / config).resolve())
    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / f"{path.stem}-{engine}.json"
        copy.write_text(json.dumps(doc))
        done = run_measured([sys.executable, "-m", "amp_opt", "solve", str(copy), "--time-limit", f"{time_limit:g}",
                             "--json"], cwd=ROOT)
    if done.code != 0:
        lines = done.stderr.strip().splitlines()
        return {"exit": done.code, "seconds": done.wall, "message": lines[-1] if lines else ""}
    result = json.loads(done.stdout)
    return {"exit": 0, "seconds": done.wall, **result["solver"], "plan": result["plan"],
            "time": result.get("predicted_time", result["solver"]["objective"])}


def shape(path: Path) -> tuple[int, int]:
    """GPUs and GPU types of an instance file."""
    doc = json.loads(path.read_text())
    gpus = sum(n.get("count", 1) * n["devices"] for n in doc["nodes"])
    return gpus, len({n["device_type"] for n in doc["nodes"]})  # device types may come from the catalog


def cell(row: dict) -> str:
    if row["exit"] != 0:
        return f"exit {row['exit']}: {row['message']}"
    plan = row["plan"]
    label = f"tp={plan['tp']} dp={plan['dp']} pp={plan['pp']}" + (" shares" if plan.get("shares") else "")
    return f"{row['status']} within {row.get('within') or 'the whole space'} ({label})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--only", default=None, help="comma-separated words; keep the instances whose name has one")
    args = parser.parse_args()
    command = "python benchmarks/uneven_gain.py" + ("" if args.time_limit == 60 else f" --time-limit {args.time_limit:g}") \
        + (f" --only {args.only}" if args.only else "")
    commit = git_commit(ROOT)
    print("# Plans whose stages and replicas differ: in-model gain over uniform plans\n")
    print(f"Command: `{command}` (commit {commit})\n")
    print("Machine: " + ", ".join(f"{k} {v}" for k, v in machine_info().items()) + "\n")
    print(f"Per instance: `python -m amp_opt solve FILE --time-limit {args.time_limit:g} --json` with `search.engine` "
          "\"megatron\" (uniform) and \"amp_opt\" (uneven); gain = (uniform - uneven) / uniform of the predicted "
          "seconds per iteration; in-run gain = (the amp_opt run's own best uniform plan - its best plan) / the former "
          "(what the plans whose stages differ add, apart from the two uniform searches ending differently at the "
          "time limit).\n")
    print("| instance | GPUs | types | uniform s | uneven s | gain | in-run gain | uneven bound s (gap) | uniform result | "
          "uneven result | solve s (uniform, uneven) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    gains, in_runs = [], []
    for path in instances(args.only):
        gpus, types = shape(path)
        uni, une = (solve(path, engine, args.time_limit) for engine in ("megatron", "amp_opt"))
        both = uni["exit"] == 0 and une["exit"] == 0
        gain = 100 * (uni["time"] - une["time"]) / uni["time"] if both else None
        own = une.get("uneven", {}).get("uniform_objective") if une["exit"] == 0 else None
        in_run = 100 * (own - une["time"]) / own if own else None
        if gain is not None:
            gains.append(gain)
        if in_run is not None:
            in_runs.append(in_run)
        fmt = lambda row: f"{row['time']:.6g}" if row["exit"] == 0 else "-"  # noqa: E731
        bound = f"{une['bound']:.6g} ({100 * une['gap']:.1f}%)" if une["exit"] == 0 else "-"
        print(f"| {path.stem} | {gpus} | {types} | {fmt(uni)} | {fmt(une)} | "
              f"{'-' if gain is None else f'{gain:.2f}%'} | {'-' if in_run is None else f'{in_run:.2f}%'} | {bound} | "
              f"{cell(uni)} | {cell(une)} | "
              f"{uni['seconds']:.1f}, {une['seconds']:.1f} |", flush=True)
    if gains and in_runs:
        print(f"\nIn-run: {sum(g > 0.01 for g in in_runs)} of {len(in_runs)} instances gain more than 0.01% "
              f"(largest {max(in_runs):.2f}%). Against the megatron run: {sum(g > 0.01 for g in gains)} of {len(gains)} "
              f"gain more than 0.01%, {sum(g < -0.01 for g in gains)} lose more than 0.01% (largest gain "
              f"{max(gains):.2f}%, largest loss {-min(gains):.2f}%). Load average at the end: {machine_info()['load']}.")


if __name__ == "__main__":
    main()
