"""Random heterogeneous instances: deterministic for a seed, valid by construction.

A generated instance mixes catalog GPUs (their real memory and speed ratios),
gives each node type a realistic network (older GPUs sit behind slower links),
and builds a GPT-like model whose transformer layers are uneven (each layer's
MLP width is drawn at random, as in models with mixed layer sizes).  The model
size is drawn relative to the cluster's memory so that memory sometimes binds
and some instances have no feasible plan at all.  Half of the device types get
synthetic "measured" profiles at two micro-batch sizes (the analytic time with
a per-type efficiency and per-layer noise); the rest use the FLOPs estimate.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import InputError
from .catalog import CATALOG
from .fields import whole_number
from .presets import expand_preset

# GPU types the generator draws from, oldest first, with typical node links (Gbit/s).
GPU_POOL = ["T4", "V100-16GB", "V100-32GB", "A10G", "L4", "RTX-4090", "A100-40GB", "A100-80GB", "H100-80GB", "H200"]
NETWORK_GBPS = {
    "T4": [25, 50], "V100-16GB": [10, 25, 100], "V100-32GB": [25, 100], "A10G": [25, 50], "L4": [50, 100],
    "RTX-4090": [25, 100], "A100-40GB": [100, 200, 400], "A100-80GB": [200, 400], "H100-80GB": [400, 800],
    "H200": [400, 800],
}


def _check(value, name: str, minimum: int = 1) -> int:
    return whole_number(value, f"--{name.replace('_', '-')}", minimum=minimum)


def generate_instance(seed: int = 0, *, nodes: int = 4, devices_per_node: int = 4, device_types: int = 2,
                      layers: int = 8, global_batch: int = 16) -> dict:
    """A random instance document (the JSON format), deterministic for the arguments.

    ``layers`` counts every entry of the layer list (embedding and head included).
    """
    _check(nodes, "nodes")
    _check(devices_per_node, "devices_per_node")
    _check(device_types, "device_types")
    _check(layers, "layers", 3)
    _check(global_batch, "global_batch")
    if device_types > len(GPU_POOL):
        raise InputError("--device-types", f"at most {len(GPU_POOL)} GPU types are available, got {device_types}")
    if device_types > nodes:
        raise InputError("--device-types", f"cannot place {device_types} GPU types on {nodes} nodes")
    rng = np.random.default_rng(seed)

    types = sorted(rng.choice(GPU_POOL, size=device_types, replace=False).tolist(), key=GPU_POOL.index)
    # Every type gets at least one node; the rest are drawn with random weights.
    weights = rng.dirichlet(np.ones(device_types))
    counts = np.ones(device_types, dtype=int) + rng.multinomial(nodes - device_types, weights)
    node_docs = []
    for t, count in zip(types, counts):
        spec = CATALOG[t]
        # Some machines of a type sit on an older, slower network than the rest.
        split = int(rng.integers(1, count)) if count > 1 and rng.random() < 0.3 else count
        speeds = sorted(rng.choice(NETWORK_GBPS[t], size=2), reverse=True)
        for part, (size, inter) in enumerate(((split, speeds[0]), (count - split, speeds[1]))):
            if size:
                node_docs.append({"name": f"{t.lower()}-net{part}", "count": int(size), "device_type": t,
                                  "devices": devices_per_node, "intra_bandwidth": spec.intra_node_bandwidth,
                                  "inter_bandwidth": f"{float(inter):g} Gbit/s"})

    model = _model(rng, types, counts, devices_per_node, layers)
    profiles = _profiles(rng, types, model, devices_per_node)
    return {
        "format": "amp_opt.instance",
        "version": 1,
        "name": f"generated-s{seed}-n{nodes}x{devices_per_node}-t{device_types}-l{layers}",
        "description": f"amp_opt generate --seed {seed} --nodes {nodes} --devices-per-node {devices_per_node} "
                       f"--device-types {device_types} --layers {layers} --global-batch {global_batch}",
        "model": {"name": "generated-gpt", "layers": model},
        "device_types": [{"name": t} for t in types],
        "nodes": node_docs,
        "profiles": profiles,
        "training": {"global_batch": global_batch},
        "search": {"tp": [m for m in (1, 2, 4, 8) if devices_per_node % m == 0]},
    }


def _model(rng, types, counts, devices_per_node, layers) -> list[dict]:
    """A GPT-like layer list sized against the cluster's memory, with uneven blocks."""
    total_memory = sum(CATALOG[t].memory_bytes * c * devices_per_node for t, c in zip(types, counts))
    blocks = layers - 2
    # Model state (16 bytes/param) between 1% and 80% of the cluster's memory (log-uniform):
    # small models fit anywhere, large ones only with enough pipeline stages, or not at all.
    target_params = math.exp(rng.uniform(math.log(0.01), math.log(0.8))) * total_memory / 16
    h = 256 * max(1, round(math.sqrt(target_params / (12 * blocks)) / 256))
    heads = max(1, h // 128)
    seq = int(rng.choice([512, 1024, 2048]))
    vocab = int(rng.choice([32000, 50304]))
    # Eager attention over the whole s x s square, as the generator always made them: the same seed
    # gives the same instance as before FlashAttention became the presets' default.
    base = expand_preset({"preset": "gpt", "hidden": h, "layers": blocks, "heads": heads, "seq_len": seq,
                          "vocab": vocab, "attention": "eager", "causal": False})
    out = []
    for i, layer in enumerate(base):
        if layer["kind"] == "transformer":
            scale = float(rng.choice([0.5, 1.0, 1.0, 1.5, 2.0, 3.0]))  # uneven MLP widths
            layer = dict(layer)
            layer["params"] = {k: round(v * scale) for k, v in layer["params"].items()}
            layer["flops"] = layer["flops"] * scale
            # The whole block's activation memory, its attention scores included (selective
            # recomputation frees the scores, never more than the block keeps).
            for key in ("activation_memory_bytes", "attention_memory_bytes"):
                layer[key] = {k: v * scale for k, v in layer[key].items()}
            layer["name"] = f"block{i - 1}"
        out.append(layer)
    return out


def _profiles(rng, types, model, devices_per_node) -> list[dict]:
    """Synthetic measurements for half of the types: FLOPs time over a drawn efficiency, with noise."""
    measured = [t for t in types if rng.random() < 0.5]
    docs = []
    for t in measured:
        spec = CATALOG[t]
        eff = rng.uniform(0.3, 0.55)
        for tp in (1, 2):
            if devices_per_node % tp:
                continue
            for b in (1, 4):
                # Larger micro-batches run closer to peak: up to 15% better per sample at b = 4.
                gain = 1.0 if b == 1 else 1.0 + 0.15 * rng.random()
                times = []
                for layer in model:
                    compute = b * layer["flops"] / (tp * spec.peak_flops * eff * gain)
                    comm = 2 * (tp - 1) / tp * b * layer["tp_comm_bytes"] / spec.intra_node_bandwidth if tp > 1 else 0
                    times.append(float((compute + comm) * rng.uniform(0.95, 1.05)))
                docs.append({"device_type": t, "tp": tp, "micro_batch": b, "layer_times": times})
    return docs
