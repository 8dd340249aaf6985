"""Build the generated suite of the formulation study: instances/suite/gen/*.json (deterministic).

Usage (from the project root):

    python instances/build_gen_suite.py

Twenty random heterogeneous clusters of 64 to 1024 GPUs, written by the same generator as
``python -m amp_opt generate`` (``amp_opt/model/generate.py``: catalog GPUs, a GPT-like
layer list sized against the cluster's memory, measured-style profiles with noise, some
nodes of a type on a slower network).  Every node holds 8 GPUs.  The grid: 8, 16, 32, 64
and 128 nodes (64 to 1024 GPUs), four instances each, with 2, 3, 4 and 4 GPU types and
32, 48, 64 and 96 layer-list entries in turn; global batch 256 (so that data-parallel
degrees up to 256 divide it); seeds 100 + k for the k-th instance.  Some of them have no
plan that fits in memory: a solver that proves it has solved them too.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from amp_opt.model.generate import generate_instance  # noqa: E402

NODES = (8, 16, 32, 64, 128)
TYPES = (2, 3, 4, 4)
LAYERS = (32, 48, 64, 96)
GLOBAL_BATCH = 256


def main() -> None:
    out = ROOT / "instances" / "suite" / "gen"
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.json"):
        old.unlink()
    k = 0
    for nodes in NODES:
        for types, layers in zip(TYPES, LAYERS):
            seed = 100 + k
            doc = generate_instance(seed, nodes=nodes, devices_per_node=8, device_types=types, layers=layers,
                                    global_batch=GLOBAL_BATCH)
            name = f"g{nodes * 8:04d}-s{seed}-t{types}-l{layers}"
            doc["name"] = name
            (out / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
            k += 1
    print(f"wrote {k} instances to {out}")


if __name__ == "__main__":
    main()
