"""Time ``calibrate`` on a 35-run set of large Megatron-style runs (three clusters and models).

Usage::

    python benchmarks/calibration_speed.py [--out DIR]

Writes three instances (GPT models of 13B, 39B and 175B parameters on 64, 128 and 512
A100s, no layer profile: the FLOP estimate is all there is) and RUNS.json with 35 runs
whose times are the model's under a fixed calibration section with 3% log-normal noise
(seed 0) (where fewer plans of a cluster fit, plans that do not fit are runs out of memory), then runs ``python -m amp_opt calibrate`` on them and prints the wall-clock
seconds.  Synthetic times: this measures the speed of the fit and whether it finds the
section back, not the model's accuracy on real runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from amp_opt import evaluate, parse_plan  # noqa: E402
from amp_opt.model.calibration import apply_calibration  # noqa: E402
from amp_opt.model.load import parse_instance  # noqa: E402

TRUTH = {"device_types": {"A100-80GB": {"compute_scale": 1.3, "step_overhead": 0.004}}, "links": {"inter": 0.6}}
CLUSTERS = {  # name: (hidden, layers, heads, nodes, global batch)
    "gpt13b_64": (5120, 40, 40, 8, 512),
    "gpt39b_128": (8192, 48, 64, 16, 768),
    "gpt175b_512": (12288, 96, 96, 64, 1536),
}


def instance(name: str) -> dict:
    hidden, layers, heads, nodes, batch = CLUSTERS[name]
    return {"version": 1, "name": name,
            "model": {"preset": "gpt", "hidden": hidden, "layers": layers, "heads": heads, "seq_len": 2048,
                      "vocab": 51200},
            "nodes": [{"name": "a100", "count": nodes, "device_type": "A100-80GB", "devices": 8,
                       "intra_bandwidth": "300 GB/s", "inter_bandwidth": "25 GB/s"}],
            "training": {"global_batch": batch}}


def even(layers: int, pp: int) -> list[int]:
    return [round(i * layers / pp) for i in range(pp + 1)]


def plans(name: str, count: int) -> list[dict]:
    _, layers, _, nodes, batch = CLUSTERS[name]
    devices, out = nodes * 8, []
    for tp in (8, 4, 2):
        for pp in (4, 8, 16, 2):
            for mb in (1, 2, 4):
                dp = devices // (tp * pp)
                if dp >= 1 and batch % (dp * mb) == 0:
                    out.append({"tp": tp, "dp": dp, "pp": pp, "micro_batch": mb, "partition": even(layers + 2, pp),
                                "recompute": "full"})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="folder for the instances and RUNS.json (default: a temporary one)")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="calibration_speed_"))
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    records = []
    for name, count in zip(CLUSTERS, (11, 12, 12)):
        doc = instance(name)
        (out / f"{name}.json").write_text(json.dumps(doc, indent=1))
        truth = apply_calibration(parse_instance(doc), TRUTH)
        priced = [(p, evaluate(truth, parse_plan(p))) for p in plans(name, count)]
        fit = [(p, ev) for p, ev in priced if ev.feasible][:count]
        for plan, ev in fit:
            records.append({"plan": plan, "iteration_time": ev.predicted_time * float(np.exp(rng.normal(0, 0.03))),
                            "instance": f"{name}.json"})
        # Plans that do not fit the 80 GB devices, as runs that ran out of memory, up to the count.
        for plan, _ in [(p, ev) for p, ev in priced if not ev.feasible][:count - len(fit)]:
            records.append({"plan": plan, "failed": "oom", "instance": f"{name}.json"})
    (out / "RUNS.json").write_text(json.dumps(records, indent=1))
    first = f"{next(iter(CLUSTERS))}.json"
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "amp_opt", "calibrate", first, "RUNS.json", "-o", "calibrated.json"],
                          cwd=out, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    print(done.stdout + done.stderr, end="")
    print(f"{len(records)} runs in {len(CLUSTERS)} groups: calibrate took {seconds:.1f} s (wall clock), in {out}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
