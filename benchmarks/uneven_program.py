"""The program over configurations (S5) against the DP per configuration, on the uneven space listed whole.

Usage (from the project root):

    python benchmarks/uneven_program.py > benchmarks/results/uneven_program.md
    python benchmarks/uneven_program.py --seeds 0-0      # a quick run

On random small instances (single-GPU nodes of two types, `search.engine` "amp_opt", idle GPUs
allowed), the uneven search (``amp_opt.search.uneven.search_uneven``, without the uniform search's
cutoff) runs once with the stage DP per configuration and setting (``--solver auto``) and once per MIP
backend with the one program over every configuration (``formulations/uneven-search.md``, S5), the
size limit PROGRAM_BINARIES lifted so that every program is solved. Per shape and seed: the
configurations, the program's binaries, the seconds of each, and whether every backend's plan has the
DP's value (relative 1e-7). The seconds against the binaries are what PROGRAM_BINARIES is set from.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import amp_opt  # noqa: E402
from amp_opt.bench.writers import commit as git_commit, machine_info  # noqa: E402
from amp_opt.model.generate import generate_instance  # noqa: E402
from amp_opt.model.tables import Tables  # noqa: E402
from amp_opt.search import uneven  # noqa: E402
from amp_opt.search.clock import Clock  # noqa: E402
from amp_opt.search.mip import graph_program  # noqa: E402
from amp_opt.search.options import solve_options  # noqa: E402
from amp_opt.search.uneven_space import configurations  # noqa: E402

SHAPES = ((3, 4), (3, 8), (4, 8), (4, 16), (4, 24))  # (single-GPU nodes, layers)
BACKENDS = ("cpsat", "cbc", "highs")


def small(seed: int, devices: int, layers: int):
    doc = generate_instance(seed, nodes=devices, devices_per_node=1, device_types=2, layers=layers, global_batch=8)
    doc["search"].update({"engine": "amp_opt", "micro_batches": [1, 2, 4], "recompute": ["none", "full"],
                          "zero_stages": [0, 1], "sequence_parallel": [False], "virtual_stages": [1], "idle": True})
    return amp_opt.parse_instance(doc)


def run(inst, confs, solver: str):
    """(best predicted time or None, seconds, binaries of the program or None)."""
    sizes = []
    solve = graph_program.solve_graphs

    def counted(parts, **kw):
        sizes.append(sum(p.binaries for p in parts))
        return solve(parts, **kw)

    graph_program.solve_graphs = counted
    try:
        start = time.perf_counter()
        found, done, by, _ = uneven.search_uneven(inst, solve_options(solver=solver), Tables(inst), confs,
                                               cutoff=math.inf, clock=Clock.of(None))
        seconds = time.perf_counter() - start
    finally:
        graph_program.solve_graphs = solve
    assert done and by == ("DP" if solver == "auto" else "program"), by
    return (found[0].predicted_time if found else None), seconds, (sizes[0] if sizes else None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0-2", help="seed range a-b (inclusive; default 0-2)")
    args = ap.parse_args(argv)
    lo, hi = (int(x) for x in args.seeds.split("-"))
    uneven.PROGRAM_BINARIES = math.inf  # every program is solved here, whatever its size
    m = machine_info()
    print("# The program over configurations against the DP per configuration\n")
    print(f"Command: `python benchmarks/uneven_program.py --seeds {args.seeds}` (commit {git_commit(ROOT)})\n")
    print("Machine: " + ", ".join(f"{k} {v}" for k, v in m.items()) + "\n")
    print("Instances: `generate_instance(seed, nodes=N, devices_per_node=1, device_types=2, layers=L, "
          "global_batch=8)` with `search.engine` \"amp_opt\", idle GPUs allowed, micro-batches 1, 2, 4, "
          f"recomputation none or full, ZeRO 0 or 1; seeds {args.seeds}. Seconds: the uneven search alone "
          "(pricing every configuration and setting, then the DP or the program), one process, one worker.\n")
    print("| GPUs | layers | seed | configurations | binaries | DP s | " + " | ".join(f"{b} s" for b in BACKENDS)
          + " | same value as the DP |")
    print("|---|---|---|---|---|---|" + "---|" * len(BACKENDS) + "---|")
    for devices, layers in SHAPES:
        for seed in range(lo, hi + 1):
            inst = small(seed, devices, layers)
            confs, complete = configurations(inst, limit=uneven.MAX_CONFIGURATIONS)
            assert complete
            best, dp_s, _ = run(inst, confs, "auto")
            cells, same, binaries = [], True, None
            for backend in BACKENDS:
                value, seconds, binaries = run(inst, confs, backend)
                cells.append(f"{seconds:.2f}")
                same &= (value is None) == (best is None) and (best is None or math.isclose(value, best, rel_tol=1e-7))
            print(f"| {devices} | {layers} | {seed} | {len(confs)} | {binaries} | {dp_s:.2f} | " + " | ".join(cells)
                  + f" | {'yes' if same else '**no**'} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
