"""How often P1 rules out plans of several pipelines, what it costs, and what a brute force says.

Usage (from the project root):

    python benchmarks/pipelines_bound.py > benchmarks/results/pipelines_bound.md
    python benchmarks/pipelines_bound.py --seeds 0-4      # a quick run

On random tiny instances (single-GPU nodes of two types, `search.engine` "amp_opt", idle GPUs
allowed, 3 layers), ``solve`` runs twice: with ``pipelines="skip"`` (the default) and with
``pipelines="bound"`` (formulations/exactness.md, X6, P1). The table gives, per shape, the
instances with a plan, those on which P1 ruled out every plan of several pipelines, the solve
time with and without it, and the raw brute force over every plan of two pipelines (and of three
on three GPUs, :func:`amp_opt.bench.brute.brute_force_pipelines`) against the one-pipeline
optimum: how many instances a plan of several pipelines beats it on (P1 must never have ruled
those out), and the least ratio of the best such plan to the optimum.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import amp_opt  # noqa: E402
from amp_opt.bench.brute import brute_force_pipelines  # noqa: E402
from amp_opt.bench.writers import commit as git_commit, machine_info  # noqa: E402
from amp_opt.model.generate import generate_instance  # noqa: E402

SHAPES = ((2, 4), (2, 8), (3, 4), (3, 8))  # (single-GPU nodes, global batch)


def tiny(seed: int, devices: int, batch: int):
    doc = generate_instance(seed, nodes=devices, devices_per_node=1, device_types=2, layers=3, global_batch=batch)
    doc["search"].update({"engine": "amp_opt", "micro_batches": [1, 2, 4], "recompute": ["none", "full"],
                          "zero_stages": [0], "sequence_parallel": [False], "virtual_stages": [1], "idle": True})
    return amp_opt.parse_instance(doc)


def timed(inst, **options):
    start = time.perf_counter()
    result = amp_opt.solve(inst, **options)
    return result, time.perf_counter() - start


def row(devices: int, batch: int, seeds) -> list[str]:
    planned = ruled = beaten = 0
    skip_s, bound_s, ratios, solves = [], [], [], []
    for seed in seeds:
        inst = tiny(seed, devices, batch)
        try:
            plain, t0 = timed(inst)
        except amp_opt.InfeasibleError:
            continue
        result, t1 = timed(inst, pipelines="bound")
        proof = result.solver.extra["pipelines"]
        assert result.best.predicted_time == plain.best.predicted_time  # P1 changes what is proven, not the plan
        planned += 1
        ruled += proof["ruled_out"]
        skip_s.append(t0)
        bound_s.append(t1)
        solves.append(proof["sub_solves"])
        value = plain.best.predicted_time
        several = [b.value for q in range(2, devices + 1) for b in [brute_force_pipelines(inst, pipelines=q)]
                   if b is not None]
        if several:
            ratios.append(min(several) / value)
            if min(several) < value * (1 - 1e-9):
                beaten += 1
                assert not proof["ruled_out"], f"seed {seed}: P1 ruled out a faster plan of several pipelines"
    med = statistics.median
    return [f"{devices}", f"{batch}", f"{planned}", f"{ruled}", f"{beaten}",
            f"{min(ratios):.3f}" if ratios else "-", f"{med(solves):.0f} (max {max(solves)})" if solves else "-",
            f"{med(skip_s) * 1e3:.0f}", f"{med(bound_s) * 1e3:.0f} (max {max(bound_s) * 1e3:.0f})" if bound_s else "-"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0-29", help="seed range a-b (inclusive; default 0-29)")
    args = ap.parse_args(argv)
    lo, hi = (int(x) for x in args.seeds.split("-"))
    seeds = range(lo, hi + 1)
    m = machine_info()
    print("# Plans of several pipelines ruled out by P1 on tiny instances\n")
    print(f"Command: `python benchmarks/pipelines_bound.py --seeds {args.seeds}` (commit {git_commit(ROOT)})\n")
    print("Machine: " + ", ".join(f"{k} {v}" for k, v in m.items()) + "\n")
    print("Instances: `generate_instance(seed, nodes=N, devices_per_node=1, device_types=2, layers=3, "
          "global_batch=B)` with `search.engine` \"amp_opt\", idle GPUs allowed, micro-batches 1, 2, 4, "
          f"recomputation none or full, ZeRO 0; seeds {args.seeds}.\n")
    print("| GPUs | batch | with a plan | P1 ruled out | several pipelines faster (brute force) | "
          "best several / one, least | sub-solves, median | solve ms, skip | solve ms, bound |")
    print("|---|---|---|---|---|---|---|---|---|")
    for devices, batch in SHAPES:
        print("| " + " | ".join(row(devices, batch, seeds)) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
