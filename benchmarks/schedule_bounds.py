"""How far the closed 1F1B formula (H6), the 1F1B formula H13 and the linear path bound are from the 1F1B schedule.

Usage (from the project root, after `pip install .`):

    python benchmarks/schedule_bounds.py > benchmarks/results/schedule_bounds.md

On seeded random stage times it compares, for the same per-stage terms, the event simulation
of Megatron's non-interleaved 1F1B order (``amp_opt.model.schedule.simulate``, the reference),
H6's (n-1) max E + sum E + sum P and H13's max_s c_s E_s + sum E + 2 sum P
(``amp_opt.model.costs.iteration.iteration_time``, the closed and the 1F1B schedule) and the path
bound (``amp_opt.model.schedule.path_bound``).  Allreduce is left out (it is the same term
in all three).  Forward is a third of a stage's time, as everywhere in the cost model.  No
measurement is involved: this is about the formulas, so it is exact and repeatable.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from amp_opt.model.costs.iteration import iteration_time  # noqa: E402
from amp_opt.model.schedule import path_bound, simulate  # noqa: E402

STAGES = (2, 4, 8)
MICRO = (1, 2, 4, 8, 16, 32, 64)
#   label: (spread of stage times around 1, p2p as a share of the mean stage time)
SETTINGS = {
    "balanced (E in [0.9, 1.1]), no p2p": (0.1, 0.0),
    "uneven (E in [0.5, 2]), no p2p": (None, 0.0),
    "uneven, p2p up to 5% of a stage": (None, 0.05),
    "uneven, p2p up to 20% of a stage": (None, 0.2),
}


def _stage_times(rng, pp: int, spread):
    if spread is None:
        return rng.uniform(0.5, 2.0, pp)
    return rng.uniform(1 - spread, 1 + spread, pp)


def compare(rng, pp: int, n: int, spread, p2p_share: float, samples: int):
    """Relative errors against the simulated makespan: H6's and H13's (signed) and the path bound's (below)."""
    h6, h13, paths = [], [], []
    for _ in range(samples):
        compute = _stage_times(rng, pp, spread)
        p2p = rng.uniform(0, p2p_share * compute.mean(), pp) if p2p_share else np.zeros(pp)
        p2p[-1] = 0.0
        sched = simulate([[float(c)] for c in compute], list(map(float, p2p)), [0.0] * pp, n).makespan
        h6.append(iteration_time(n, compute, p2p[:-1] if pp > 1 else [0.0], [0.0]) / sched - 1)
        h13.append(iteration_time(n, compute, p2p[:-1] if pp > 1 else [0.0], [0.0], 1, "1f1b") / sched - 1)
        paths.append(1 - path_bound(list(compute), list(p2p), n) / sched)
    return np.array(h6), np.array(h13), np.array(paths)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200, help="random stage-time draws per (pp, n); default 200")
    parser.add_argument("--seed", type=int, default=0, help="random seed; default 0")
    args = parser.parse_args()
    if args.samples < 1:
        parser.error("--samples must be at least 1")
    rng = np.random.default_rng(args.seed)
    print("# H6, H13 and the path bound against the simulated 1F1B schedule\n")
    print(f"Command: `python benchmarks/schedule_bounds.py --samples {args.samples} --seed {args.seed}`  ")
    print("Machine: any (no timing: exact arithmetic on seeded random stage times)\n")
    print("Errors relative to the simulated makespan of the same stage terms (allreduce left out). "
          "H6 (signed: + above the schedule) is above it when it charges a wait the schedule fills, and "
          "below it when p2p round trips make stages wait (H6 counts one transfer per boundary); the path bound is a "
          "lower bound by construction (both of its families are paths of the dependency graph), and H13 "
          "(what the hetero model optimises) is its family b alone, so never above it. "
          "\"exact\": within 1e-9.\n")
    for label, (spread, share) in SETTINGS.items():
        print(f"## {label}\n")
        print("| pp | n | H6: exact | H6: median | H6: min .. max | H13: exact | H13: median | H13: min .. max | "
              "path bound: exact | path bound: median under | path bound: max under |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for pp in STAGES:
            for n in MICRO:
                h6, h13, paths = compare(rng, pp, n, spread, share, args.samples)
                print(f"| {pp} | {n} | {np.mean(np.abs(h6) < 1e-9):.0%} | {100 * np.median(h6):+.1f}% | "
                      f"{100 * h6.min():+.1f} .. {100 * h6.max():+.1f}% | {np.mean(np.abs(h13) < 1e-9):.0%} | "
                      f"{100 * np.median(h13):+.1f}% | {100 * h13.min():+.1f} .. {100 * h13.max():+.1f}% | "
                      f"{np.mean(np.abs(paths) < 1e-9):.0%} | "
                      f"{100 * np.median(paths):.1f}% | {100 * paths.max():.1f}% |")
        print()


if __name__ == "__main__":
    main()
