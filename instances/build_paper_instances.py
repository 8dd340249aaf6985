"""Build the three AMP paper instances from the paper's measured profiles.

Usage (from the project root, with the AMP reference data beside it):

    python instances/build_paper_instances.py ../shared/amp-paper/profiles.json

Writes instances/amp_homogeneous.json, amp_het_cluster.json and amp_het_model.json.
The profiles are AMP's measured forward times of one sample; an instance holds
forward+backward times, which AMP takes as 3 x forward.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
FP16 = 2  # bytes per activation element (the paper trains in fp16)
BACKWARD_FACTOR = 3  # AMP: forward + backward = 3 x forward

T4 = {"name": "T4", "catalog": "T4", "memory": "16 GiB", "peak_flops": 65e12}
V100 = {"name": "V100-16GB", "catalog": "V100-16GB", "memory": "16 GiB", "peak_flops": 125e12}
# Bandwidths as the AMP experiments state them (inter-node, intra-node).
G4_NODE = {"device_type": "T4", "devices": 4, "intra_bandwidth": "50 Gbit/s", "inter_bandwidth": "50 Gbit/s"}
P3_NODE = {"device_type": "V100-16GB", "devices": 4, "intra_bandwidth": "170 Gbit/s", "inter_bandwidth": "10 Gbit/s"}


def korthikanti(s: int, h: int, a: int) -> dict:
    """Activation bytes kept per sample by one transformer block, fp16, no recompute.

    Korthikanti et al. 2022, eq. 2: s*h*(10 + 24/t + 5*a*s/(h*t)) at tensor degree t.
    """
    return {"replicated": 10 * s * h, "sharded": (24 + 5 * a * s / h) * s * h}


def gpt2_layers() -> list[dict]:
    """GPT-2 345M as AMP lists it: embed2h, noop, 24 blocks, noop, noop, embed2v, noop.

    Parameter counts follow AMP (12 h^2 per block, h*v for the tied word embedding);
    biases, layer norms and the 1M position-embedding weights are left out, as AMP does.
    """
    h, s, v, a = 1024, 1024, 52256, 16
    act = s * h * FP16
    block = {
        "kind": "transformer",
        "params": {"sharded": 12 * h * h},
        "activation_bytes": act,
        "activation_memory_bytes": korthikanti(s, h, a),
        "flops": 3 * (24 * s * h * h + 4 * s * s * h),
        "tp_comm_bytes": 4 * s * h * FP16,  # 2 allreduces forward, 2 backward
    }
    noop = {"kind": "noop", "params": 0, "flops": 0}
    layers = [
        {"name": "embed2h", "kind": "embedding", "params": {"sharded": h * v}, "tie": "word_embeddings",
         "activation_bytes": act, "activation_memory_bytes": s * h, "flops": 0},
        {"name": "noop0", **noop, "activation_bytes": act},
    ]
    layers += [{"name": f"transformer{i}", **block} for i in range(24)]
    layers += [
        {"name": "noop1", **noop, "activation_bytes": act},
        {"name": "noop2", **noop, "activation_bytes": act},
        # Output projection to the (vocab-parallel) logits: fp16 logits + fp32 cross-entropy copy.
        {"name": "embed2v", "kind": "head", "params": {"sharded": h * v}, "tie": "word_embeddings",
         "activation_bytes": {"sharded": s * v * FP16},
         "activation_memory_bytes": {"replicated": 2 * s * h, "sharded": (2 + 4) * s * v},
         "flops": 3 * 2 * s * h * v},
        {"name": "noop3", **noop, "activation_bytes": {"sharded": s * v * FP16}},
    ]
    return layers


TRANSGAN_WORK_IDS = [0] + list(range(3, 15)) + list(range(41, 53))


def transgan_layers() -> list[dict]:
    """TransGAN generator (h = 1024, depth [12,0,0,0,0,12], bottom width 9): AMP's 25 work layers.

    Entry 0 is the latent-to-tokens projection; AMP gives it no parameters and we keep
    AMP's count (its real size depends on the latent width, which the paper does not
    state).  Entries 1-12 are blocks at width h on 9x9 = 81 tokens; entries 13-24 are
    blocks at width h/64 on 72x72 = 5184 tokens, which TransGAN runs with grid
    self-attention: we charge attention over 16x16-token windows with 4 heads.
    Every entry sends h*81 elements per sample (AMP's volume).
    """
    h = 1024
    act = 81 * h * FP16
    layers = [{"name": "latent_proj", "kind": "linear", "params": 0, "activation_bytes": act,
               "activation_memory_bytes": act}]
    for i in range(12):
        s, a = 81, 16
        layers.append({"name": f"block_h{i}", "kind": "transformer", "params": {"sharded": 12 * h * h},
                       "activation_bytes": act, "activation_memory_bytes": korthikanti(s, h, a),
                       "flops": 3 * (24 * s * h * h + 4 * s * s * h), "tp_comm_bytes": 4 * s * h * FP16})
    for i in range(12):
        s, w, window, a = 5184, h // 64, 256, 4
        layers.append({"name": f"block_l{i}", "kind": "transformer", "params": {"sharded": 12 * w * w},
                       "activation_bytes": act,
                       "activation_memory_bytes": {"replicated": 10 * s * w, "sharded": 24 * s * w + 5 * a * s * window},
                       "flops": 3 * (24 * s * w * w + 4 * s * window * w), "tp_comm_bytes": 4 * s * w * FP16})
    return layers


def profiles(data: dict, model: str, machine: str, device_type: str, ids=None) -> list[dict]:
    out = []
    for tp in ("1", "2", "4"):
        forward = data[model][machine][tp]
        if ids is not None:
            forward = [forward[i] for i in ids]
        out.append({"device_type": device_type, "tp": int(tp), "micro_batch": 1,
                    "layer_times": [BACKWARD_FACTOR * t for t in forward]})
    return out


def instance(name, description, model, layers, device_types, nodes, profs, global_batch, micro_batches):
    return {
        "format": "amp_opt.instance",
        "version": 1,
        "name": name,
        "description": description,
        "model": {"name": model, "layers": layers},
        "device_types": device_types,
        "nodes": nodes,
        "profiles": profs,
        "training": {"global_batch": global_batch, "activation_element_bytes": FP16},
        "search": {"tp": [1, 2, 4], "micro_batches": micro_batches},
    }


def main(profiles_path: str) -> None:
    data = json.loads(Path(profiles_path).read_text())
    gpt_mb = [1, 2, 4, 8, 16, 32]
    built = {
        "amp_homogeneous": instance(
            "amp_homogeneous",
            "AMP paper, homogeneous experiment: GPT-2 345M on 4 x AWS g4dn.12xlarge (4 x T4 16 GB, PCIe), 50 Gbit/s links.",
            "gpt2-345m", gpt2_layers(), [T4],
            [{"name": "g4dn", "count": 4, **G4_NODE}],
            profiles(data, "gpt2", "G4", "T4"), 32, gpt_mb),
        "amp_het_cluster": instance(
            "amp_het_cluster",
            "AMP paper, heterogeneous cluster: GPT-2 345M on 3 x AWS p3.8xlarge (4 x V100 16 GB, NVLink; "
            "170 Gbit/s intra, 10 Gbit/s network) and 1 x g4dn.12xlarge (4 x T4, 50 Gbit/s).",
            "gpt2-345m", gpt2_layers(), [V100, T4],
            [{"name": "p3", "count": 3, **P3_NODE}, {"name": "g4dn", **G4_NODE}],
            profiles(data, "gpt2", "P3", "V100-16GB") + profiles(data, "gpt2", "G4", "T4"), 32, gpt_mb),
        "amp_het_model": instance(
            "amp_het_model",
            "AMP paper, heterogeneous model: TransGAN generator on 4 x AWS p3.8xlarge (4 x V100 16 GB; "
            "170 Gbit/s intra, 10 Gbit/s network). The 25 layers are AMP's work layers (ids 0, 3-14, 41-52 "
            "of the 56-entry DeepSpeed list).",
            "transgan", transgan_layers(), [V100],
            [{"name": "p3", "count": 4, **P3_NODE}],
            profiles(data, "transgan", "P3", "V100-16GB", TRANSGAN_WORK_IDS), 64, gpt_mb + [64]),
    }
    for name, doc in built.items():
        (HERE / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote instances/{name}.json")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(HERE.parent.parent / "shared" / "amp-paper" / "profiles.json"))
