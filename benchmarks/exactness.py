"""Every solver against the brute force over raw plans, on fresh random tiny instances.

Usage (from the project root):

    python benchmarks/exactness.py > benchmarks/results/exactness.md
    python benchmarks/exactness.py --count 20 --solvers enumerate,cpsat

Draws ``--count`` instances (seeds from ``--first``, 10^6 by default, which no test uses) of
2-4 GPUs of two types on 2-4 nodes and 3-5 layers, with every decision open (micro-batches 1, 2,
4; every recomputation mode; ZeRO 0-3; sequence parallelism; 1 or 2 virtual stages), the engine
and ``search.idle`` drawn too; for each, under the time and the cost objective and (time) a
budget of half the cluster's price, compares each solver's value with the brute force of
``amp_opt.bench.brute`` (every raw plan the evaluator accepts) to 1e-7 relative, or both
infeasible.  Prints a Markdown report: one line per disagreement, then the counts.
"""

from __future__ import annotations

import argparse
import platform
import random
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from amp_opt import InfeasibleError, parse_instance, solve  # noqa: E402
from amp_opt.bench.brute import brute_force  # noqa: E402
from amp_opt.model.generate import generate_instance  # noqa: E402

REL = 1e-7
SOLVERS = "enumerate,cpsat,cbc,highs,cpsat-assign,highs-assign,cbc-nokinds"


def instance(seed: int):
    rng = random.Random(seed)
    nodes = rng.randint(2, 4)
    per_node = 2 if nodes == 2 and rng.random() < 0.5 else 1
    doc = generate_instance(seed, nodes=nodes, devices_per_node=per_node, device_types=2, layers=rng.randint(3, 5),
                            global_batch=rng.choice([4, 8]))
    doc["search"].update({"micro_batches": [1, 2, 4], "recompute": ["none", "selective", "full"],
                          "zero_stages": [0, 1, 2, 3], "sequence_parallel": [False, True], "virtual_stages": [1, 2],
                          "engine": rng.choice(["megatron", "deepspeed"]), "idle": rng.random() < 0.8})
    return parse_instance(doc)


def value(inst, solver, objective, budget):
    try:
        result = solve(inst, solver=solver, objective=objective, budget=budget)
    except InfeasibleError:
        return None, None
    return result.solver.objective, result.solver.within


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=200, help="instances (default 200)")
    ap.add_argument("--first", type=int, default=10**6, help="first seed (default 10^6)")
    ap.add_argument("--solvers", default=SOLVERS, help=f"comma-separated solver names (default {SOLVERS})")
    args = ap.parse_args()
    solvers = args.solvers.split(",")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    print("# Exactness: every solver against the brute force over raw plans\n")
    print(f"Command: `python benchmarks/exactness.py --count {args.count} --first {args.first} --solvers {args.solvers}`  ")
    print(f"Machine: {platform.machine()}, {len(__import__('os').sched_getaffinity(0))} cores, Python "
          f"{platform.python_version()}; commit {commit}; {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC\n")
    cases = agree = infeasible = within = 0
    disagreements = []
    brute_seconds = solve_seconds = 0.0
    started = time.perf_counter()
    for seed in range(args.first, args.first + args.count):
        inst = instance(seed)
        price = sum(inst.device_types[n.device_type].price_per_hour * n.devices for n in inst.nodes)
        for objective, budget in (("time", None), ("cost", None), ("time", price / 2)):
            t = time.perf_counter()
            truth = brute_force(inst, objective=objective, budget=budget)
            brute_seconds += time.perf_counter() - t
            expected = None if truth is None else truth.value
            infeasible += expected is None
            for solver in solvers:
                cases += 1
                t = time.perf_counter()
                found, narrowed = value(inst, solver, objective, budget)
                solve_seconds += time.perf_counter() - t
                within += narrowed is not None
                same = (found is None and expected is None) or (
                    found is not None and expected is not None and abs(found - expected) <= REL * expected)
                agree += same
                if not same:
                    disagreements.append(f"- seed {seed}, {objective}, budget {budget}, {solver}: "
                                         f"brute force {expected}, solver {found}")
        print(f"seed {seed} done", file=sys.stderr, flush=True)
    print(f"{args.count} instances x 3 problems (time, cost, time with a budget of half the cluster's price) x "
          f"{len(solvers)} solvers = {cases} comparisons.\n")
    print(f"- agree to {REL:g} relative (or both infeasible): **{agree} of {cases}**")
    print(f"- problems the brute force proves infeasible: {infeasible} of {3 * args.count}")
    print(f"- results that say \"optimal within\" (search.idle false drawn): {within}")
    print(f"- seconds: brute force {brute_seconds:.0f}, solvers {solve_seconds:.0f}, "
          f"all {time.perf_counter() - started:.0f}\n")
    print("Disagreements:\n")
    print("\n".join(disagreements) if disagreements else "none")


if __name__ == "__main__":
    main()
