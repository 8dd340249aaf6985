"""Today's strategy space at scale: `solve --time-limit 60` with every decision open.

Usage (from the project root):

    python benchmarks/strategy_space.py > benchmarks/results/strategy_space.md
    python benchmarks/strategy_space.py --time-limit 20 --only llama3_405b_h100_16k
    python benchmarks/strategy_space.py --spaces today,block > benchmarks/results/strategy_space_block.md
    python benchmarks/strategy_space.py --spaces deepspeed-uniform,deepspeed > benchmarks/results/strategy_space_deepspeed.md

Runs ``python -m amp_opt solve INSTANCE --time-limit S --json`` as a whole process on the
bundled Llama 3 405B instances and the scale ladder (`instances/suite/scale`), each instance
once with its search space as it is (every decision open, idle GPUs allowed) and once with
the decisions of 2022 only (no cp, sequence parallelism, recomputation or interleaving, ZeRO
as the instance says, no idle GPUs), or (``--spaces``) also with Megatron's block
recomputation searched (``search.recompute_layers`` 1, 2, 4, 8), or on DeepSpeed's rules with
each stage choosing its recomputation or one mode for all stages, and records wall time, peak memory, the plan, its
predicted time and MFU, and the proven gap.  Timings depend on the machine's load, which is
recorded next to each run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from amp_opt.bench.writers import commit as git_commit  # noqa: E402
from amp_opt.bench.runner import run_measured  # noqa: E402
INSTANCES = [ROOT / "instances" / "llama3_405b_h100_16k.json", ROOT / "instances" / "llama3_405b_mixed_16k.json"]
INSTANCES += sorted((ROOT / "instances" / "suite" / "scale").glob("*.json"), key=lambda p: p.name)
OLD_SPACE = {"cp": [1], "sequence_parallel": [False], "recompute": ["none"], "virtual_stages": [1], "idle": False}
BLOCK_COUNTS = [1, 2, 4, 8]
# solver.within's phrases, in short for the status column ("OPTIMAL within classes, even chunks")
WITHIN_SHORT = {"whole nodes": "nodes", "whole node classes": "classes", "use every device": "all devices",
                "even split": "even chunks"}
SPACES = {"today": "the instance's search space (every decision open, idle GPUs allowed)",
          "2022": "cp 1, no sequence parallelism, no recomputation, no interleaving, no idle GPUs",
          "block": f"today's, and Megatron's block recomputation with r in {BLOCK_COUNTS} (search.recompute_layers)",
          "deepspeed": "DeepSpeed's rules (no cp, sequence parallelism, selective recomputation or interleaving; ZeRO "
                       "2-3 only with pp 1), each stage choosing full recomputation or none",
          "deepspeed-uniform": "DeepSpeed's rules, one recomputation mode for every stage (search.per_stage_recompute "
                               "false)"}


def describe(plan: dict) -> str:
    parts = [f"tp{plan['tp']}"] + ([f"cp{plan['cp']}"] if plan.get("cp", 1) > 1 else [])
    parts += [f"dp{plan['dp']}", f"pp{plan['pp']}", f"mb{plan['micro_batch']}"]
    if plan.get("virtual_stages", 1) > 1:
        parts.append(f"v{plan['virtual_stages']}")
    if plan.get("sequence_parallel"):
        parts.append("SP")
    modes = plan.get("recompute", "none")
    if isinstance(modes, list):  # per stage: how many stages recompute
        parts.append(f"rc-full {modes.count('full')}/{len(modes)} stages")
    elif modes != "none":
        parts.append(f"rc-{modes}" + (f"/{plan['recompute_layers']}" if plan.get("recompute_layers") else ""))
    parts.append(f"Z{plan.get('zero_stage', 0)}")
    return " ".join(parts)


def run(path: Path, limit: float, space: str) -> dict:
    """One whole-process solve; the result record."""
    doc = json.loads(path.read_text())
    if space == "2022":
        doc.setdefault("search", {}).update(OLD_SPACE, zero_stages=[doc.get("training", {}).get("zero_stage", 0)])
    elif space == "block":
        doc.setdefault("search", {})["recompute_layers"] = BLOCK_COUNTS
    elif space.startswith("deepspeed"):
        doc.setdefault("search", {}).update(engine="deepspeed", per_stage_recompute=space == "deepspeed")
    with tempfile.TemporaryDirectory() as tmp:
        inst = Path(tmp) / path.name
        inst.write_text(json.dumps(doc))
        load = os.getloadavg()[0]
        done = run_measured([sys.executable, "-m", "amp_opt", "solve", str(inst), "--time-limit", str(limit),
                             "--json"], cwd=ROOT)
    stdout, stderr = done.stdout, done.stderr
    record = {"instance": path.stem, "space": space, "exit": done.code, "wall": done.wall,
              "peak_mib": done.peak_mib, "load": load}
    try:
        result = json.loads(stdout)
    except json.JSONDecodeError:
        record["error"] = (stderr.strip().splitlines() or ["no output"])[-1]
        return record
    if "plan" not in result:
        record["error"] = f"{result.get('status')}: {result.get('reason')}"
        return record
    solver = result["solver"]
    within = solver.get("within")  # what the search left out of the evaluator's space, in short
    short = [] if within is None else [part for key, part in WITHIN_SHORT.items() if key in within]
    record.update(plan=describe(result["plan"]), time=result["predicted_time"],
                  status=solver["status"] + (f" within {', '.join(short)}" if short else ""),
                  gap=solver["gap"], mfu=result.get("model_flops_utilization"),
                  used=result.get("devices_used"), solver=solver["name"])
    return record


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per solve (default 60)")
    ap.add_argument("--only", default=None, help="instance names (comma-separated stems) to run")
    ap.add_argument("--spaces", default="today,2022", help=f"search spaces to run, of {', '.join(SPACES)} "
                                                           "(default today,2022)")
    args = ap.parse_args()
    spaces = args.spaces.split(",")
    unknown = [s for s in spaces if s not in SPACES]
    if unknown:
        ap.error(f"--spaces: unknown space {unknown[0]!r} (known: {', '.join(SPACES)})")
    paths = [p for p in INSTANCES if args.only is None or p.stem in args.only.split(",")]
    rows = []
    for path in paths:
        for space in spaces:
            rows.append(run(path, args.time_limit, space))
            print(f"{path.stem} ({rows[-1]['space']}): {rows[-1].get('plan', rows[-1].get('error'))}", file=sys.stderr)
    commit = git_commit(ROOT)
    print("# Today's strategy space at scale\n")
    command = f"python benchmarks/strategy_space.py --time-limit {args.time_limit:g}"
    command += "" if args.spaces == "today,2022" else f" --spaces {args.spaces}"
    command += "" if args.only is None else f" --only {args.only}"
    print(f"Command: `{command}`  ")
    print(f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}; commit {commit}; {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC  ")
    print("Each row is one whole process (`solve --time-limit S --json`); wall time and peak memory are the "
          "process's, load is the 1-minute load average when it started (2 cores: above 2 the runs shared "
          "the machine). " + "; ".join(f"\"{s}\": {SPACES[s]}" for s in spaces) + ". A status \"within\" names "
          "what the search left out of the evaluator's space (formulations/exactness.md): sets of devices other "
          "than whole nodes or whole node classes, interleaved chunkings other than the engine's even split.\n")
    print("| instance | space | plan | time s | MFU | GPUs used | status | gap | wall s | peak MiB | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['instance']} | {r['space']} | exit {r['exit']}: {r['error']} | | | | | | "
                  f"{r['wall']:.1f} | {r['peak_mib']:.0f} | {r['load']:.1f} |")
            continue
        mfu = "" if r["mfu"] is None else f"{r['mfu']:.1%}"
        print(f"| {r['instance']} | {r['space']} | {r['plan']} | {r['time']:.4g} | {mfu} | {r['used']} | "
              f"{r['status']} | {r['gap']:.2%} | {r['wall']:.1f} | {r['peak_mib']:.0f} | {r['load']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
