"""The plans each iteration-time formula picks, held against the simulated 1F1B schedule.

Usage::

    python benchmarks/schedule_objectives.py > benchmarks/results/schedule_objectives.md

For the three AMP paper instances and eight small generated clusters, solve once under the
``hetero`` model (eq. H13, the 1F1B schedule's position weights) and once under
``hetero-closed`` (AMP's closed form H6), each to a proven optimum, then run both plans'
stage terms (priced by ``hetero``) through the event simulation of Megatron's 1F1B order
(:func:`amp_opt.model.schedule.schedule_of`, what ``plot`` draws).  The simulation is the
judge here: a formula that ranks plans the way the schedule runs them picks the plan the
schedule runs fastest.  No timing: the numbers repeat exactly.
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import amp_opt
from amp_opt.errors import InfeasibleError
from amp_opt.model.generate import generate_instance
from amp_opt.model.schedule import schedule_of

ROOT = Path(__file__).resolve().parent.parent
PAPER = ("amp_homogeneous", "amp_het_cluster", "amp_het_model")
SEEDS = range(8)
MODELS = ("hetero", "hetero-closed")


def instances():
    """The paper instances, then the generated ones (3-5 nodes of 4 GPUs, 2-3 types, 12-20 layers)."""
    for name in PAPER:
        yield amp_opt.load_instance(ROOT / "instances" / f"{name}.json")
    for seed in SEEDS:
        yield amp_opt.parse_instance(generate_instance(seed, nodes=3 + seed % 3, devices_per_node=4,
                                                       device_types=2 + seed % 2, layers=12 + 4 * (seed % 3),
                                                       global_batch=32))


def describe(plan) -> str:
    return f"pp {plan.pp} dp {plan.dp} tp {plan.tp} b {plan.micro_batch} [{', '.join(map(str, plan.partition))}]"


def main() -> None:
    print("# Iteration-time formulas against the simulated 1F1B schedule\n")
    print(f"Command: `python {' '.join(sys.argv)} > benchmarks/results/schedule_objectives.md`  ")
    print(f"Machine: {platform.machine()}, Python {platform.python_version()}, amp_opt {amp_opt.__version__} "
          "(no timing: every number repeats exactly)\n")
    print("Each instance solved to a proven optimum under each formula; both plans' stage terms (hetero) run "
          "through the event simulation of Megatron's 1F1B order. `predicted` is the formula's own value, "
          "`simulated` the schedule's makespan, `error` predicted over simulated minus one.\n")
    print("| instance | formula | plan | micro-batches | predicted s | simulated s | error |")
    print("|---|---|---|---|---|---|---|")
    ratios, errors = [], {m: [] for m in MODELS}
    for inst in instances():
        sims = {}
        for model in MODELS:
            try:
                best = amp_opt.solve(inst, cost_model=model).best
            except InfeasibleError:
                print(f"| {inst.name} | {model} | infeasible | | | | |")
                continue
            ev = amp_opt.evaluate(inst, best.plan, "hetero")
            sim = schedule_of(inst, ev).makespan
            sims[model] = sim
            errors[model].append(best.predicted_time / sim - 1)
            print(f"| {inst.name} | {model} | {describe(best.plan)} | {ev.n_micro} | {best.predicted_time:.4f} | "
                  f"{sim:.4f} | {100 * (best.predicted_time / sim - 1):+.2f}% |")
        if len(sims) == 2:
            ratios.append((inst.name, sims["hetero"] / sims["hetero-closed"]))
    print("\nSimulated time of the H13 plan over that of the H6 plan:\n")
    for name, ratio in ratios:
        print(f"- {name}: {ratio:.4f}")
    for model in MODELS:
        e = errors[model]
        print(f"\n{model}: error against the simulation from {100 * min(e):+.2f}% to {100 * max(e):+.2f}% "
              f"(median {100 * sorted(e)[len(e) // 2]:+.2f}%) over {len(e)} plans.")


if __name__ == "__main__":
    main()
