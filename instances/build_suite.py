"""Build the benchmark scale suite: instances/suite/scale/*.json (deterministic).

Usage (from the project root):

    python instances/build_suite.py

Rewrites every file of instances/suite/scale/ from the tables below; the output
is checked in.  The paper suite is not built here: it is the three
instances/amp_*.json files (packaged for `bench --suite` as amp_opt/bench/data/).

Choices (stated once, used by every instance)
---------------------------------------------
Models (``"model": {"preset": ...}``, expanded at load time by amp_opt/presets.py):

* GPT-3 family, sizes of Brown et al. 2020 (Table 2.1) as trained with
  Megatron-LM (Narayanan et al. 2021): seq_len 2048, vocab 51200 (GPT-2's
  50257 padded to a multiple of 1024, as Megatron does), tied embeddings,
  learned positions, ffn = 4h.
  1.3B: h 2048, 24 layers, 16 heads;   2.7B: h 2560, 32 layers, 32 heads;
  6.7B: h 4096, 32 layers, 32 heads;   13B: h 5120, 40 layers, 40 heads;
  175B: h 12288, 96 layers, 96 heads.
* Llama-2 70B (Touvron et al. 2023): h 8192, 80 layers, 64 heads, 8 KV heads,
  ffn 28672, vocab 32000, seq_len 4096.
* Llama-3 70B (Llama Team 2024, "The Llama 3 Herd of Models", Table 3): same
  shape with vocab 128256, seq_len 8192.
* Layer lists therefore hold 26 to 98 entries (transformer layers +
  embedding + head); the generated 1024-GPU instance has 96.

Global batches (samples per iteration) follow the papers, rounded to a power of
two so that many data-parallel degrees divide them: GPT-3 used 0.5M tokens
(1.3B, 2.7B: 256 x 2048) to 2M (6.7B, 13B: 1024 x 2048) and 3.2M tokens
(175B: 1536 x 2048, here 2048); Llama-2 used 4M tokens (1024 x 4096); Llama-3
70B 16M tokens at 8192 (2048 x 8192).

GPUs are catalog names (amp_opt/catalog.py).  Nodes hold 8 GPUs (HGX/DGX
boards, p3.16xlarge, g4dn.metal).  The link between two GPUs of a node is the
catalog's ``intra_node_bandwidth`` (NVLink per direction; PCIe for T4).  The
network link of a node (one NIC rate per node, per direction) is:

    H100-80GB 400 Gbit/s, A100-80GB 400 Gbit/s, A100-40GB 200 Gbit/s,
    V100-32GB 50 Gbit/s, V100-16GB 25 Gbit/s (p3.16xlarge), T4 50 Gbit/s.

``search.tp`` is [1, 2, 4, 8]; the other search options keep their defaults
(micro-batches: powers of two up to the global batch; pp up to the layer count).
Training: mixed-precision Adam (2 + 2 + 12 bytes per parameter), no ZeRO,
1 GiB reserve: the instance defaults.  No profiles: every layer time is the
FLOPs estimate (formulations/hetero.md, H2) at the default 40% of peak.

Node order (which fixes Megatron's rank order, used by the AMP and expert
baselines) is newest GPU first, as a scheduler filling the best machines first
would hand them out.

The 1024-GPU case of the project's issue ("128 nodes x 8 GPUs, 4 GPU types, 96
layers") exists twice: ``s1024-gpt3-175b-4types`` (a real model, 96 transformer
layers) and ``generated-1024`` (the instance generator's output for
``python -m amp_opt generate --seed 1 --nodes 128 --devices-per-node 8
--device-types 4 --layers 96``, byte for byte).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "suite" / "scale"
sys.path.insert(0, str(HERE.parent))  # run from a checkout without installing

from amp_opt.model.catalog import CATALOG  # noqa: E402
from amp_opt.model.generate import generate_instance  # noqa: E402

NETWORK_GBIT = {"H100-80GB": 400, "A100-80GB": 400, "A100-40GB": 200, "V100-32GB": 50, "V100-16GB": 25, "T4": 50}
GPUS_PER_NODE = 8


def gpt3(name: str, hidden: int, layers: int, heads: int) -> dict:
    return {"preset": "gpt", "name": name, "hidden": hidden, "layers": layers, "heads": heads,
            "seq_len": 2048, "vocab": 51200}


def llama70b(name: str, vocab: int, seq_len: int) -> dict:
    return {"preset": "llama", "name": name, "hidden": 8192, "layers": 80, "heads": 64, "kv_heads": 8,
            "ffn": 28672, "vocab": vocab, "seq_len": seq_len}


MODELS = {
    "gpt3-1.3b": gpt3("gpt3-1.3b", 2048, 24, 16),
    "gpt3-2.7b": gpt3("gpt3-2.7b", 2560, 32, 32),
    "gpt3-6.7b": gpt3("gpt3-6.7b", 4096, 32, 32),
    "gpt3-13b": gpt3("gpt3-13b", 5120, 40, 40),
    "gpt3-175b": gpt3("gpt3-175b", 12288, 96, 96),
    "llama2-70b": llama70b("llama2-70b", 32000, 4096),
    "llama3-70b": llama70b("llama3-70b", 128256, 8192),
}

# name, model, global batch, [(GPU, node count)] in rank order (newest first).
SCALE = [
    ("s0016-gpt3-1.3b-a100", "gpt3-1.3b", 256, [("A100-40GB", 2)]),
    ("s0016-gpt3-1.3b-a100-v100", "gpt3-1.3b", 256, [("A100-40GB", 1), ("V100-16GB", 1)]),
    ("s0064-gpt3-2.7b-a100-v100", "gpt3-2.7b", 256, [("A100-80GB", 4), ("V100-32GB", 4)]),
    ("s0064-gpt3-6.7b-3types", "gpt3-6.7b", 1024, [("A100-40GB", 4), ("V100-32GB", 2), ("T4", 2)]),
    ("s0256-gpt3-13b-3types", "gpt3-13b", 1024, [("A100-80GB", 16), ("A100-40GB", 8), ("V100-32GB", 8)]),
    ("s1024-gpt3-175b-4types", "gpt3-175b", 2048,
     [("H100-80GB", 32), ("A100-80GB", 32), ("A100-40GB", 32), ("V100-32GB", 32)]),
    ("s1024-llama2-70b-h100-a100", "llama2-70b", 1024, [("H100-80GB", 64), ("A100-80GB", 64)]),
    ("s4096-llama3-70b-4types", "llama3-70b", 2048,
     [("H100-80GB", 256), ("A100-80GB", 128), ("A100-40GB", 64), ("V100-32GB", 64)]),
]

GENERATED = ("generated-1024", dict(seed=1, nodes=128, devices_per_node=8, device_types=4, layers=96))


def node_doc(gpu: str, count: int) -> dict:
    return {"name": gpu.lower(), "count": count, "device_type": gpu, "devices": GPUS_PER_NODE,
            "intra_bandwidth": f"{CATALOG[gpu].intra_node_bandwidth / 1e9:g} GB/s",
            "inter_bandwidth": f"{NETWORK_GBIT[gpu]} Gbit/s"}


def scale_instance(name: str, model: str, batch: int, nodes: list[tuple[str, int]]) -> dict:
    gpus = sum(count for _, count in nodes) * GPUS_PER_NODE
    mix = " + ".join(f"{count} x {GPUS_PER_NODE} {gpu}" for gpu, count in nodes)
    return {
        "format": "amp_opt.instance",
        "version": 1,
        "name": name,
        "description": f"{MODELS[model]['name']} on {gpus} GPUs ({mix}), global batch {batch}; "
                       f"written by instances/build_suite.py",
        "model": MODELS[model],
        "nodes": [node_doc(gpu, count) for gpu, count in nodes],
        "training": {"global_batch": batch},
        "search": {"tp": [1, 2, 4, 8]},
    }


def documents() -> dict[str, dict]:
    """File name (without .json) -> instance document, for every scale instance."""
    docs = {name: scale_instance(name, model, batch, nodes) for name, model, batch, nodes in SCALE}
    name, kwargs = GENERATED
    docs[name] = generate_instance(**kwargs)
    return docs


def write(text_by_name: dict[str, str], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.json"):
        if stale.stem not in text_by_name:
            stale.unlink()
    for name, text in text_by_name.items():
        (out / f"{name}.json").write_text(text)


def main() -> int:
    from amp_opt.model.load import parse_instance

    texts = {}
    for name, doc in documents().items():
        parse_instance(doc, default_name=name)  # every instance must load
        # indent=1 as `amp-opt generate` writes, so generated-1024 matches its command byte for byte
        texts[name] = json.dumps(doc, indent=1) + "\n"
    write(texts, OUT)
    for name in texts:
        print(OUT.relative_to(HERE.parent) / f"{name}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
