"""Root LP bounds of the two layer formulations on the same candidates.

Usage (from the project root, after a bench run that wrote DIR/results.json):

    python benchmarks/lp_bounds.py --results DIR PATH... > lp_bounds.md

For every instance (PATHs: instance files, folders or globs, as for ``bench``) with a plan in
DIR/results.json, the candidate (tp, dp, pp, micro-batch) of the best plan any run found gets
its program built twice, with the prefix layer variables (eq. M1-M4) and with the assignment
formulation (eq. A1-A4), and the linear relaxation of each is solved with HiGHS
(``amp_opt.search.mip.relaxation.lp_bound``):

* under free grouping, the program the MIP driver solves (grouping M10-M14 included);
* with the grouping fixed to the best plan's own device groups, where the layer part is all
  that is left: the relaxations then compare with the exact optimum of that fixed grouping
  (the stage DP, ``optimal_path``).

Also printed: the cost model's bound of the candidate (B2/B3, what the drivers start from)
and the best plan's time.  All values are seconds per iteration under the hetero model.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from amp_opt import load_instance, parse_plan  # noqa: E402
from amp_opt.bench.suites import expand_paths  # noqa: E402
from amp_opt.bench.writers import machine_info  # noqa: E402
from amp_opt.search.context import Search  # noqa: E402
from amp_opt.search.mip.relaxation import lp_bound  # noqa: E402
from amp_opt.search.options import solve_options  # noqa: E402
from amp_opt.search.partition import fixed_placement_graph, optimal_path  # noqa: E402


def best_plans(results: Path) -> dict[str, dict]:
    """instance name -> the best plan (JSON) any run of the results found."""
    doc = json.loads((results / "results.json").read_text())
    best: dict[str, tuple[float, dict]] = {}
    for row in doc["rows"]:
        if row.get("plan_json") and row.get("amp_opt_s") is not None:
            if row["instance"] not in best or row["amp_opt_s"] < best[row["instance"]][0]:
                best[row["instance"]] = (row["amp_opt_s"], row["plan_json"])
    return {name: plan for name, (_, plan) in best.items()}


def fmt(x, spec=".4f"):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def ratio(a, b):
    return a / b if a is not None and b else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--results", required=True, type=Path)
    parser.add_argument("--time-limit", type=float, default=120.0, help="seconds per LP")
    args = parser.parse_args()
    plans = best_plans(args.results)
    machine = machine_info()
    print("# Root LP bounds: prefix (M1-M4) against assignment (A1-A4) layer variables\n")
    print(f"Command: `python benchmarks/lp_bounds.py --results {args.results} {' '.join(args.paths)}`\n")
    print(f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['python']}; {machine['date']}.\n")
    print("Seconds per iteration (hetero). best: the best plan any run found; B2/B3: the cost model's bound of its "
          "candidate; LP free: the root LP of the program the drivers solve (free grouping); fixed opt: the exact "
          "optimum with the best plan's device groups fixed; LP fixed: the root LP with those groups fixed "
          "(the layer part alone); closed = LP / fixed opt.\n")
    print("| instance | GPUs | candidate | best | B2/B3 | LP free prefix | LP free assign | fixed opt | "
          "LP fixed prefix | LP fixed assign | closed prefix | closed assign | vars prefix / assign | rows prefix / assign |")
    print("|" + "---|" * 14)
    closed = {"prefix": [], "assignment": []}
    tally = {"prefix": 0, "assignment": 0, "equal": 0}
    started = time.perf_counter()
    for _, path in expand_paths(args.paths):
        inst = load_instance(path)
        if inst.name not in plans:
            continue
        plan = parse_plan(plans[inst.name])
        cand = plan.candidate
        search = Search(inst, solve_options(solver="enumerate"))
        best = search.evaluate(plan).predicted_time
        bound = search.lower_bound(cand, labelled=True)
        free = {k: lp_bound(inst, cand, layers=k, time_limit=args.time_limit) for k in closed}
        fixed = {k: lp_bound(inst, cand, layers=k, stages=plan.stages, time_limit=args.time_limit) for k in closed}
        graph = fixed_placement_graph(search.stage_costs(cand, plan.stages), inst.num_layers)
        found = optimal_path(graph)
        opt = found[0] if found else None
        for k in closed:
            r = ratio(fixed[k].bound, opt)
            if r is not None:
                closed[k].append(r)
        a, b = fixed["prefix"].bound, fixed["assignment"].bound
        if a is not None and b is not None:
            tally["equal" if abs(a - b) <= 1e-7 * max(abs(a), 1e-12) else ("prefix" if a > b else "assignment")] += 1
        print(f"| {inst.name} | {inst.num_devices} | tp={cand.tp} dp={cand.dp} pp={cand.pp} mb={cand.micro_batch} | "
              f"{fmt(best)} | {fmt(bound)} | {fmt(free['prefix'].bound)} | {fmt(free['assignment'].bound)} | "
              f"{fmt(opt)} | {fmt(a)} | {fmt(b)} | {fmt(ratio(a, opt), '.3f')} | {fmt(ratio(b, opt), '.3f')} | "
              f"{free['prefix'].variables} / {free['assignment'].variables} | "
              f"{free['prefix'].constraints} / {free['assignment'].constraints} |", flush=True)
    print()
    for k, values in closed.items():
        if values:
            gm = math.exp(sum(math.log(max(v, 1e-12)) for v in values) / len(values))
            print(f"- {k}: LP fixed / fixed opt over {len(values)} candidates: geometric mean {gm:.3f}, "
                  f"min {min(values):.3f}, max {max(values):.3f}")
    print(f"- tighter root LP with the grouping fixed: prefix on {tally['prefix']}, assignment on "
          f"{tally['assignment']}, equal on {tally['equal']} candidates")
    print(f"- whole run {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
