"""Profile a small model on this machine, then run plans for real and put measured next to predicted.

Usage (needs PyTorch; about a minute on 2 cores)::

    python benchmarks/runtime_measure.py [--out measured.json]

Steps: profile every layer (tp=1 at micro-batches 1, 2, 4, 8; tp=2 at 2 and 4),
merge the profiles into a 2-device CPU instance, then for each plan evaluate it
with the hetero cost model and run it (gloo, local processes), and print the
term-by-term comparison.  Nothing here is tuned: every number is measured.
"""

from __future__ import annotations

import argparse
import json

from amp_opt.model.evaluate import evaluate
from amp_opt.runtime.compare import compare_run
from amp_opt.runtime.profile import merge_profiles, profile_model
from amp_opt.runtime.run import run_plan
from amp_opt.model.load import load_instance
from amp_opt.model.plan import parse_plan

MODEL = {"preset": "gpt", "hidden": 128, "layers": 4, "heads": 4, "seq_len": 64, "vocab": 512, "dropout": False,
         "dtype_bytes": 4}
DOC = {"format": "amp_opt.instance", "version": 1, "name": "engine_cpu", "model": MODEL,
       "device_types": [{"name": "cpu", "memory": "8 GiB", "peak_flops": 1e11}],
       "nodes": [{"name": "host", "device_type": "cpu", "devices": 2, "intra_bandwidth": "1 GB/s",
                  "inter_bandwidth": "1 GB/s"}],
       "training": {"global_batch": 16, "memory_reserve": 0}}
PLANS = [
    {"tp": 1, "dp": 1, "pp": 2, "micro_batch": 2, "partition": [0, 3, 6]},
    {"tp": 1, "dp": 2, "pp": 1, "micro_batch": 2, "partition": [0, 6]},
    {"tp": 2, "dp": 1, "pp": 1, "micro_batch": 2, "partition": [0, 6]},
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write profiles, records and comparisons as JSON here")
    args = parser.parse_args()
    # One process per device in the runs: profile tp=1 with one thread, as each rank runs.
    profiles = list(profile_model(MODEL, micro_batches=(1, 2, 4, 8), device="cpu", device_type="cpu", threads=1,
                                  repeats=7))
    profiles += list(profile_model(MODEL, micro_batches=(2, 4), device="cpu", device_type="cpu", tp=2, threads=1,
                                   repeats=7))
    for p in profiles:
        print(f"profile tp={p.tp} b={p.micro_batch}: layer medians (ms) "
              + " ".join(f"{t * 1e3:.2f}" for t in p.layer_times)
              + "  saved bytes " + " ".join(str(m) for m in p.activation_memory_bytes))
    document = merge_profiles(DOC, profiles)
    instance = load_instance(document)
    out = {"profiles": [p.to_json() for p in profiles], "runs": [], "comparisons": []}
    for raw in PLANS:
        record = run_plan(document, raw, iterations=5, warmup=2, threads=1, timeout=300)
        out["runs"].append(record)
        if record.get("failed"):
            print(raw, "FAILED", record)
            continue
        comparison = compare_run(record, evaluate(instance, parse_plan(raw), "hetero"), instance)
        out["comparisons"].append(comparison.to_json())
        it = comparison.iteration_time
        print(f"\nplan {raw}: iteration measured {it.measured * 1e3:.2f} ms, predicted {it.predicted * 1e3:.2f} ms "
              f"(ratio {it.ratio:.2f}); peak memory {record['peak_memory']} B ({record['measured']['memory_kind']})")
        for s in comparison.stages:
            print(f"  stage {s.stage} {list(s.layers)}: compute/mb {s.compute_per_micro_batch.measured * 1e3:.2f} vs "
                  f"{s.compute_per_micro_batch.predicted * 1e3:.2f} ms; p2p(blocked) {s.p2p.measured * 1e3:.2f} vs "
                  f"{s.p2p.predicted * 1e3:.3f} ms; allreduce {s.allreduce.measured * 1e3:.2f} vs "
                  f"{s.allreduce.predicted * 1e3:.2f} ms; memory {s.memory.measured:.0f} vs {s.memory.predicted:.0f} B")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
