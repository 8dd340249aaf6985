"""Geometric-mean speed-ups of amp_opt's plans over AMP's pick and the expert default, from bench CSVs.

Usage: python benchmarks/summarize.py benchmarks/results/paper benchmarks/results/scale-mip
Only instances where a baseline exists count (AMP's pick must fit; the expert default must fit).
"""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def main(dirs: list[str]) -> None:
    print(f"Command: `python benchmarks/summarize.py {' '.join(dirs)}`\n")
    print("| results | solver | instances | x AMP (geo. mean) | x expert (geo. mean) | never slower | worst gap |")
    print("|---|---|---|---|---|---|---|")
    for d in dirs:
        rows = list(csv.DictReader(open(Path(d) / "results.csv")))
        for solver in sorted({r["solver"] for r in rows}):
            mine = [r for r in rows if r["solver"] == solver and r["amp_opt_s"]]
            amp = [float(r["speedup_vs_amp"]) for r in mine if r["speedup_vs_amp"]]
            expert = [float(r["speedup_vs_expert"]) for r in mine if r["speedup_vs_expert"]]
            never_slower = all(x >= 1 - 1e-9 for x in amp + expert)
            worst_gap = max((float(r["gap"]) for r in mine if r["gap"]), default=float("nan"))
            print(f"| {d} | {solver} | {len(mine)} | {geomean(amp):.3f} ({len(amp)}) | {geomean(expert):.3f} "
                  f"({len(expert)}) | {'yes' if never_slower else 'no'} | {worst_gap:.2%} |")


if __name__ == "__main__":
    main(sys.argv[1:])
