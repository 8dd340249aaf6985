"""Every solver against the brute force over raw plans, on fresh random tiny instances.

Usage (from the project root):

    python benchmarks/exactness.py --jobs 2 > benchmarks/results/exactness.md
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
import functools
import multiprocessing
import platform
import random
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from amp_opt import InfeasibleError, parse_instance, solve  # noqa: E402
from amp_opt.bench.writers import commit as git_commit  # noqa: E402
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
    """The solver's value and its "within" (None, None when it proves infeasibility); an error
    is returned as its one line, so that it counts as a disagreement."""
    try:
        result = solve(inst, solver=solver, objective=objective, budget=budget)
    except InfeasibleError:
        return None, None
    except Exception as exc:  # noqa: BLE001 - a solver's failure is a result here
        return f"{type(exc).__name__}: {exc}", None
    return result.solver.objective, result.solver.within


def compare(seed: int, solvers: list[str]) -> dict:
    """One instance: its three problems against every solver (runs in a worker process)."""
    inst = instance(seed)
    price = sum(inst.device_types[n.device_type].price_per_hour * n.devices for n in inst.nodes)
    out = {"cases": 0, "agree": 0, "infeasible": 0, "within": 0, "brute": 0.0, "solve": 0.0, "rows": []}
    for objective, budget in (("time", None), ("cost", None), ("time", price / 2)):
        t = time.perf_counter()
        truth = brute_force(inst, objective=objective, budget=budget)
        out["brute"] += time.perf_counter() - t
        expected = None if truth is None else truth.value
        out["infeasible"] += expected is None
        for solver in solvers:
            out["cases"] += 1
            t = time.perf_counter()
            found, narrowed = value(inst, solver, objective, budget)
            out["solve"] += time.perf_counter() - t
            out["within"] += narrowed is not None
            same = (found is None and expected is None) or (
                isinstance(found, float) and expected is not None and abs(found - expected) <= REL * expected)
            out["agree"] += same
            if not same:
                out["rows"].append(f"- seed {seed}, {objective}, budget {budget}, {solver}: "
                                   f"brute force {expected}, solver {found}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=200, help="instances (default 200)")
    ap.add_argument("--first", type=int, default=10**6, help="first seed (default 10^6)")
    ap.add_argument("--solvers", default=SOLVERS, help=f"comma-separated solver names (default {SOLVERS})")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    args = ap.parse_args()
    solvers = args.solvers.split(",")
    commit = git_commit(ROOT)
    print("# Exactness: every solver against the brute force over raw plans\n")
    print(f"Command: `python benchmarks/exactness.py --count {args.count} --first {args.first} --solvers {args.solvers} "
          f"--jobs {args.jobs}`  ")
    print(f"Machine: {platform.machine()}, {len(__import__('os').sched_getaffinity(0))} cores, Python "
          f"{platform.python_version()}; commit {commit}; {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC\n")
    started = time.perf_counter()
    seeds = range(args.first, args.first + args.count)
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        parts = []
        for part in pool.imap(functools.partial(compare, solvers=solvers), seeds):
            parts.append(part)
            print(f"{len(parts)} of {args.count} done", file=sys.stderr, flush=True)
    total = {key: sum(p[key] for p in parts) for key in ("cases", "agree", "infeasible", "within", "brute", "solve")}
    cases, agree, infeasible, within = (total[k] for k in ("cases", "agree", "infeasible", "within"))
    brute_seconds, solve_seconds = total["brute"], total["solve"]
    disagreements = [row for p in parts for row in p["rows"]]
    print(f"{args.count} instances x 3 problems (time, cost, time with a budget of half the cluster's price) x "
          f"{len(solvers)} solvers = {cases} comparisons.\n")
    print(f"- agree to {REL:g} relative (or both infeasible): **{agree} of {cases}**")
    print(f"- problems the brute force proves infeasible: {infeasible} of {3 * args.count}")
    print(f"- results that say \"optimal within\" (search.idle false drawn): {within}")
    print(f"- seconds (summed over the workers): brute force {brute_seconds:.0f}, solvers {solve_seconds:.0f}; "
          f"wall {time.perf_counter() - started:.0f}\n")
    print("Disagreements:\n")
    print("\n".join(disagreements) if disagreements else "none")


if __name__ == "__main__":
    main()
