"""Reality check: amp_opt's predicted per-GPU throughput against published training runs.

Usage (from the project root):

    python benchmarks/published.py > benchmarks/results/published.md
    python benchmarks/published.py --solve-time-limit 0        # skip the solve runs
    python benchmarks/published.py --write-instances DIR       # also write each row's instance and plan

For every row of ``benchmarks/published/configs.json`` (read ``benchmarks/published/SOURCES.md``
first) the script builds an amp_opt instance (the row's model as a ``gpt`` or ``llama`` preset, the
row's GPU count as nodes of ``gpus_per_node`` catalog GPUs with the links of the system the source
ran on, see ``SYSTEMS``), builds the published plan (every degree and setting the source states;
a field the source leaves open is chosen by amp_opt's model: every value of amp_opt's own search
space that the engine allows is evaluated with everything else fixed, and the fastest plan that fits
in memory is kept, ties going to the engine's default), scores it with the one evaluator (``amp_opt.evaluate``, cost model
``hetero``, nothing calibrated: ``training.analytic_efficiency`` stays at its default) and turns the
predicted iteration time into per-GPU TFLOP/s with the SOURCE's own FLOP formula, so that the
prediction and the published number count the same FLOPs.  The ratio predicted / published is
then the ratio of the published iteration time to the predicted one.

Then ``amp_opt.solve`` runs on a few rows (``SOLVE_ROWS``, all decisions open, ``--solve-time-limit``
seconds each, with the default free placement and with rank order) to show what amp_opt would pick
on the same cluster; a search that fails is reported, not raised.

Nothing here is fitted to the published numbers.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import amp_opt  # noqa: E402
from amp_opt.bench.writers import machine_info  # noqa: E402
from amp_opt.errors import InputError  # noqa: E402
from amp_opt.model.engines import even_partition  # noqa: E402
from amp_opt.model.engines import ENGINES  # noqa: E402
from amp_opt.model.profiles import layer_times  # noqa: E402

CONFIGS = ROOT / "benchmarks" / "published" / "configs.json"
COMMAND = "python benchmarks/published.py > benchmarks/results/published.md"
COST_MODEL = "hetero"
WITHIN = 0.25  # the target: predicted within 25% of the published measurement
GB_S = 1e9  # bytes/s
GBIT_S = 1e9 / 8  # bytes/s
FP8_H100 = 1979e12  # H100 SXM5 dense FP8 tensor peak (3,958 TFLOPS with sparsity, halved; NVIDIA datasheet)


# ---------------------------------------------------------------- hardware

@dataclass(frozen=True)
class System:
    """One machine a source ran on: the catalog GPU and the links (bytes/s), with where they come from."""

    name: str
    gpu: str  # catalog name
    intra: float  # per GPU and direction, between two GPUs of a node
    inter: float  # per node: the sum of its network adapters for application traffic
    assumption: str


SYSTEMS = {
    "selene": System(
        "DGX A100 80GB (Selene)", "A100-80GB", 300 * GB_S, 8 * 200 * GBIT_S,
        "8 x A100-80GB per node. Intra-node: NVLink 3 through NVSwitch, 600 GB/s bidirectional per GPU "
        "(DGX A100 datasheet; the papers do not state it), i.e. 300 GB/s per direction, the catalog's "
        "A100 link. Inter-node: the sources' 8 x 200 Gb/s HDR InfiniBand adapters per node for "
        "application traffic = 200 GB/s per node (the 2 storage adapters left out)."),
    "dgx-a100-2020": System(
        "DGX A100 40GB (2020)", "A100-40GB", 300 * GB_S, 8 * 200 * GBIT_S,
        "The 2020 README says DGX-A100 without a memory size; in September 2020 the DGX A100 shipped "
        "with the 40 GB A100 (the 80 GB part was announced in November 2020), so A100-40GB. Links as "
        "for Selene (NVLink 3 300 GB/s per direction; 8 x 200 Gb/s HDR per node), not stated in the "
        "source."),
    "dgx-h100": System(
        "DGX H100", "H100-80GB", 450 * GB_S, 8 * 400 * GBIT_S,
        "8 x H100-80GB SXM5 per node (the sources say H100 or DGX-H100 without the variant). "
        "Intra-node: NVLink 4 through NVSwitch, 900 GB/s bidirectional per GPU (DGX H100 datasheet) = "
        "450 GB/s per direction, the catalog's H100 link. Inter-node: 8 x 400 Gb/s NDR InfiniBand "
        "(ConnectX-7) per node = 400 GB/s per node. Not stated in the sources."),
    "meta-h100": System(
        "Meta H100 cluster (Llama 3)", "H100-80GB", 450 * GB_S, 8 * 400 * GBIT_S,
        "8 x H100-80GB HBM3 (700 W) per Grand Teton server, NVLink inside (bandwidth not stated; "
        "HGX H100 NVLink 4 = 450 GB/s per direction assumed). RoCE at 400 Gb/s per GPU (stated) = "
        "8 x 400 Gb/s = 400 GB/s per node. The 1:7 oversubscription above a 3,072-GPU pod is not "
        "modelled (amp_opt has one link rate per node)."),
    "jean-zay": System(
        "Jean Zay A100 80GB (BLOOM)", "A100-80GB", 300 * GB_S, 4 * 100 * GBIT_S,
        "8 x A100-80GB per node. The README says 'NVLink 4 inter-gpu connects, 4 OmniPath links': "
        "NVLink taken at the catalog's A100 rate (300 GB/s per direction), and Omni-Path at its "
        "100 Gb/s per port, 4 x 100 Gb/s = 50 GB/s per node (port speed not stated in the source)."),
}


# ---------------------------------------------------------------- FLOP conventions (per iteration)

def narayanan_eq3(row) -> float:
    """Narayanan et al. 2021 eq. (3): 96 B s l h^2 (1 + s/(6h) + V/(16 l h)); counts the recompute forward."""
    B, s, l, h, V = _dims(row)
    return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))


def korthikanti_eq7(row) -> float:
    """Korthikanti et al. 2022 eq. (7), model FLOPs: 72 B L s h^2 (1 + s/(6h) + V/(12 h L))."""
    B, s, l, h, V = _dims(row)
    return 72 * B * l * s * h * h * (1 + s / (6 * h) + V / (12 * h * l))


def megatron_flops(row, causal: bool = False) -> float:
    """Megatron-Core ``num_floating_point_operations`` (training.py at f2e5db402c), also NeMo 24.07's llama
    and gpt3 formulas: 12 B s L h^2 ((1 + g/a + s/h) + (f/h)(3/2 if SwiGLU) + V/(2 L h)); with ``causal``
    the s/h attention term is halved (Megatron-Bridge, NeMo after Aug 2025)."""
    B, s, l, h, V = _dims(row)
    m = row["model"]
    a = m["heads"]
    g = m.get("kv_heads") or a
    f = m.get("ffn") or 4 * h
    gated = 1.5 if _is_llama(row) else 1.0
    attn = s / h * (0.5 if causal else 1.0)
    return 12 * B * s * l * h * h * ((1 + g / a + attn) + f / h * gated + V / (2 * l * h))


def chowdhery_flops(row) -> float:
    """MFU as in Chowdhery et al. 2022 (PaLM), Appendix B: (6 N + 12 L H Q T) per token, N the
    parameters that multiply every token (all but the input embedding table), H Q = hidden."""
    B, s, l, h, V = _dims(row)
    return B * s * (6 * matmul_params(row) + 12 * l * h * s)


def six_n_flops(row) -> float:
    """The issue's MFU: 6 x parameters x tokens (all parameters)."""
    B, s, _, _, _ = _dims(row)
    return 6 * all_params(row) * B * s


CONVENTIONS = {
    "eq3": ("Narayanan eq. (3), recompute forward counted", narayanan_eq3),
    "eq7": ("Korthikanti eq. (7), model FLOPs", korthikanti_eq7),
    "megatron": ("Megatron-Core / NeMo 24.07 formula, no causal discount", megatron_flops),
    "megatron-causal": ("Megatron-Bridge formula, causal discount", lambda row: megatron_flops(row, causal=True)),
    "chowdhery": ("Chowdhery et al. 6N + 12LHQT per token", chowdhery_flops),
}


def _is_llama(row) -> bool:
    return row["model"]["family"].startswith("llama")


def _vocab(row) -> int:
    return row["model"]["vocab"] or 51200


def _dims(row):
    m = row["model"]
    return row["global_batch"], m["seq_len"], m["layers"], m["hidden"], _vocab(row)


def all_params(row) -> float:
    from amp_opt.model.presets import preset_summary
    return preset_summary(model_spec(row)[0])["params_total"]


def matmul_params(row) -> float:
    """Parameters without the input embedding table (a lookup, no multiply); an untied output
    projection stays in, a tied one is counted once."""
    from amp_opt.model.presets import preset_summary
    summary = preset_summary(model_spec(row)[0])
    embedding = summary["params_by_kind"]["embedding"]
    return summary["params_total"] - embedding + summary["tied_params"]


# ---------------------------------------------------------------- sources

@dataclass(frozen=True)
class Source:
    key: str
    title: str
    prefix: tuple[str, ...]  # row id prefixes
    convention: str
    system: str
    citation: str
    fp8: bool = False


SOURCES = [
    Source("narayanan2021", "Narayanan et al. 2021, Tables 1 and 2 (A100, PTD-P and ZeRO-3)", ("megatron-2021-",), "eq3",
           "selene",
           "Deepak Narayanan, Mohammad Shoeybi, Jared Casper, Patrick LeGresley, Mostofa Patwary, Vijay Korthikanti, "
           "Dmitri Vainbrand, Prethvi Kashinkunti, Julie Bernauer, Bryan Catanzaro, Amar Phanishayee, Matei Zaharia. "
           "*Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM.* SC 2021, arXiv:2104.04473. "
           "Tables 1 and 2, Sec. 5."),
    Source("readme2021", "NVIDIA/Megatron-LM README 2021, GPT-3 175B example", ("megatron-readme-2021",), "eq3", "selene",
           "NVIDIA/Megatron-LM `README.md` \"GPT-3 Example\" and `examples/pretrain_gpt3_175B.sh` at commit "
           "50a4b5fa0280a160cc1b03a1c15faddbc1b1da9a."),
    Source("readme2020", "NVIDIA/Megatron-LM README 2020, Megatron v1 scaling (DGX-A100)", ("megatron-readme-2020",), "eq3",
           "dgx-a100-2020",
           "NVIDIA/Megatron-LM `README.md` and `images/tables.tex` at commit 5281919420ac4eb649e6aee9652ff39bb94d462a "
           "(2020-09-11)."),
    Source("korthikanti2022", "Korthikanti et al. 2022, Tables 3 and 5 (A100)", ("korthikanti-2022",), "eq7", "selene",
           "Vijay Korthikanti, Jared Casper, Sangkug Lym, Lawrence McAfee, Michael Andersch, Mohammad Shoeybi, "
           "Bryan Catanzaro. *Reducing Activation Recomputation in Large Transformer Models.* MLSys 2023, "
           "arXiv:2205.05198. Tables 3 and 5, Sec. 6.3, abstract."),
    Source("mcore2024", "NVIDIA/Megatron-LM README 2024, Megatron-Core weak scaling (H100)", ("megatron-core-2024",),
           "megatron", "dgx-h100",
           "NVIDIA/Megatron-LM `README.md` \"Training Speed and Scalability\" and `images/model_table.png` at commit "
           "f2e5db402c44ae309aa6448bcb4ae87e8ae0f5f4 (2024-07-15); FLOP formula from `megatron/training/training.py` "
           "at the same commit."),
    Source("llama3", "Llama 3 405B, Table 4 (H100)", ("llama3-2024",), "chowdhery", "meta-h100",
           "Llama Team, AI @ Meta. *The Llama 3 Herd of Models.* arXiv:2407.21783 (2024). Table 4, Table 3, "
           "Sec. 3.2-3.3."),
    Source("bloom", "BLOOM-176B training log (A100)", ("bloom-176b",), "eq3", "jean-zay",
           "bigscience-workshop/bigscience `train/tr11-176B-ml/README.md` (commit "
           "e726b15982fa088fb6d9a4c869c19c3d4dbc84a7) and `train/tr11-176B-ml/tr11-176B-ml.slurm` (commit "
           "003b25057ea7dd7b476dd2feb28668725b1cbdaa); log line at iteration 85,376."),
    Source("mtnlg", "MT-NLG 530B (A100, secondary)", ("mtnlg-",), "eq3", "selene",
           "Smith et al. *Using DeepSpeed and Megatron to Train Megatron-Turing NLG 530B.* arXiv:2201.11990, "
           "Sec. 2.4, as quoted by `cli99/llm-analysis` `examples/megatron-turing-nlg/README.md` (secondary)."),
    Source("nemo2407", "NeMo 24.07 performance summary (H100, FP8)", ("nemo-2407",), "megatron", "dgx-h100",
           "NVIDIA/NeMo `docs/source/performance/performance_summary.md` at commit "
           "fe98ad77f6add888aab185e6bff8775d595adcd9 (\"24.07 perf numbers\"), Pretraining table; Llama shapes from "
           "`nemo/collections/llm/gpt/model/llama.py` at the same commit.", fp8=True),
    Source("bridge", "Megatron-Bridge performance summary archive (H100, FP8)", ("megatron-bridge",), "megatron-causal",
           "dgx-h100",
           "NVIDIA-NeMo/Megatron-Bridge `docs/performance-summary-archive.md` at commit "
           "067f987df03b8355b03192d88d70f1709fedf51a (25.11, 26.04 and 26.04.01 sections).", fp8=True),
]


def source_of(row) -> Source:
    for src in SOURCES:
        if row["id"].startswith(src.prefix):
            return src
    raise KeyError(row["id"])


def engine_of_row(row) -> str:
    """DeepSpeed for the runs made with it (ZeRO-3 rows, BLOOM's and MT-NLG's Megatron-DeepSpeed);
    Megatron-LM's rules otherwise (Meta's own engine has interleaving, CP and SP like Megatron)."""
    rid = row["id"]
    if "zero3" in rid or rid.startswith(("bloom", "mtnlg")):
        return "deepspeed"
    return "megatron"


# ---------------------------------------------------------------- instances

def model_spec(row) -> tuple[dict, list[str]]:
    """The preset of a row's model and the assumptions it makes."""
    m, rid = row["model"], row["id"]
    llama = _is_llama(row)
    h = m["hidden"]
    spec = {"preset": "llama" if llama else "gpt", "name": rid, "hidden": h, "layers": m["layers"],
            "heads": m["heads"], "seq_len": m["seq_len"], "vocab": _vocab(row)}
    notes = []
    if m["vocab"] is None:
        notes.append("vocabulary 51,200 (GPT-2 BPE padded to a multiple of 128 x tp; the value eq. (3) reproduces)")
    if llama:
        spec["ffn"] = m["ffn"]
        spec["kv_heads"] = m["kv_heads"]
    elif m.get("ffn") and m["ffn"] != 4 * h:
        spec["ffn"] = m["ffn"]
    if not llama and not m.get("ffn"):
        notes.append("standard GPT block (MHA, 4h GeLU MLP), not stated; it reproduces the size labels")
    if row["flash_attention"] is False:
        spec["attention"] = "eager"
    else:
        spec["attention"] = "flash"
        if row["flash_attention"] is None:
            notes.append("FlashAttention (not stated; the default of Megatron-Core/TE, NeMo and Meta's stack in 2024)")
    if not llama:
        if rid.startswith("megatron-core-2024"):
            spec["tied_embeddings"] = False
            notes.append("untied embedding and output layer (reproduces the size labels)")
        if rid.startswith("bloom"):
            spec["position_embeddings"] = False  # ALiBi
            notes.append("ALiBi, no position table; embedding LayerNorm not modelled")
    return spec, notes


def instance_dict(row, *, inter_divisor: float = 1, intra_divisor: float = 1, peak: float | None = None) -> dict:
    """The amp_opt instance of a row: its model, its GPUs as nodes of the source's system.

    ``inter_divisor`` and ``intra_divisor`` divide the links (the sensitivities); ``peak``
    overrides the GPU's peak FLOP/s (the FP8 variant)."""
    system = SYSTEMS[source_of(row).system]
    per_node = min(row["gpus_per_node"] or 8, row["gpus"])
    if row["gpus"] % per_node:
        raise ValueError(f"{row['id']}: {row['gpus']} GPUs are not whole nodes of {per_node}")
    gpu = system.gpu
    out = {
        "format": "amp_opt.instance", "version": 1, "name": row["id"],
        "description": f"{row['id']}: {row['where']}",
        "model": model_spec(row)[0],
        "nodes": [{"name": "node", "count": row["gpus"] // per_node, "device_type": gpu, "devices": per_node,
                   "intra_bandwidth": system.intra / intra_divisor, "inter_bandwidth": system.inter / inter_divisor}],
        "training": {"global_batch": row["global_batch"]},
        "search": {"engine": engine_of_row(row)},
    }
    if peak is not None:
        out["device_types"] = [{"name": gpu, "catalog": gpu, "peak_flops": peak}]
    return out


def partition(instance, pp: int, v: int) -> tuple[tuple[int, ...] | None, str]:
    """The layer split of pp*v chunks, as the engines do it: transformer layers evenly (embedding with
    the first chunk, head with the last); else, when the layer list itself divides, embedding and head
    counted as one layer each (BLOOM's 'type:transformer|embedding', Llama 3's 'one layer fewer on the
    first and last stage', Megatron's --account-for-embedding/loss-in-pipeline-split); else (no
    interleaving) the first stages one transformer layer more."""
    parts = pp * v
    exact = even_partition(instance, parts, exact=True)
    if exact is not None:
        return exact, ""
    n = instance.num_layers
    if n % parts == 0:
        return tuple(i * n // parts for i in range(parts + 1)), "embedding and head counted as a layer in the split"
    if v == 1:
        return even_partition(instance, parts), "uneven split: the first stages hold one layer more"
    return None, ""


# ---------------------------------------------------------------- plans

RECOMPUTE_BY_ENGINE = {"megatron": ("none", "selective", "full"), "deepspeed": ("none", "full")}


def plan_space(row, instance) -> tuple[dict, dict, list[str]]:
    """(fixed fields, open fields with the values to try, notes).  Open values are ordered with the
    engine's default first, so that a tie keeps the default."""
    engine = ENGINES[engine_of_row(row)]
    tp, pp, dp, cp = row["tp"], row["pp"], row["dp"], row["cp"] or 1
    fixed = {"tp": tp, "pp": pp, "dp": dp, "cp": cp}
    open_, notes = {}, []
    per_replica = row["global_batch"] // dp
    if row["micro_batch"]:
        fixed["micro_batch"] = row["micro_batch"]
    elif source_of(row).key == "readme2020":
        fixed["micro_batch"] = per_replica
        notes.append("micro-batch = the per-replica batch: Megatron at that commit has no gradient accumulation "
                     "(`--batch-size`: 'Batch size per model instance (local batch size)')")
    else:  # amp_opt's own search values (search.micro_batches: powers of two) that divide the replica's batch
        open_["micro_batch"] = [b for b in instance.search.micro_batches if per_replica % b == 0]
    if row["virtual_stages"]:
        fixed["virtual_stages"] = row["virtual_stages"]
    elif pp == 1 or not engine.interleaving:
        fixed["virtual_stages"] = 1
        if pp > 1:
            notes.append("no interleaving (DeepSpeed's pipeline has none)")
    else:  # amp_opt's own search values (search.virtual_stages, default 1, 2, 4) that split the layers
        open_["virtual_stages"] = [v for v in instance.search.virtual_stages if partition(instance, pp, v)[0] is not None]
    if isinstance(row["sequence_parallel"], bool):
        fixed["sequence_parallel"] = row["sequence_parallel"]
    elif tp > 1 and engine.sequence_parallel:
        open_["sequence_parallel"] = [False, True]
    else:
        fixed["sequence_parallel"] = False
    if row["recompute"] in ("none", "selective", "full"):
        fixed["recompute"] = row["recompute"]
    else:
        open_["recompute"] = list(RECOMPUTE_BY_ENGINE[engine.name])
    zero = row["zero_stage"]
    if isinstance(zero, int):
        fixed["zero_stage"] = zero
    elif isinstance(zero, str):  # Llama 3's FSDP: optimizer states and gradients sharded, parameters not
        fixed["zero_stage"] = 2 if pp == 1 else engine.sharded_zero_with_pipeline
        notes.append(f"FSDP sharding optimizer states and gradients (ZeRO-2-like) taken as ZeRO-"
                     f"{fixed['zero_stage']}, the most the engine rules allow with pp > 1 "
                     "(ZeRO-1 and -2 move the same bytes in amp_opt's model; ZeRO-1 keeps whole gradients)")
    elif row["distributed_optimizer"] is True:
        fixed["zero_stage"] = 1
        notes.append("distributed optimizer = ZeRO-1")
    elif row["distributed_optimizer"] is False or dp * cp == 1:
        fixed["zero_stage"] = 0
    else:
        open_["zero_stage"] = [0, 1]
    return fixed, open_, notes


@dataclass
class Choice:
    plan: dict
    evaluation: object
    chosen: tuple[str, ...]  # fields amp_opt chose
    tried: int
    notes: list[str]
    unconstrained: tuple[float, dict] | None = None  # (time, plan) of the fastest plan, when it does not fit


def overflow(ev) -> float:
    """Bytes by which the fullest stage of an evaluation exceeds its capacity (0 when it fits)."""
    return max(0.0, max(s.memory - s.capacity for s in ev.stages))


def choose_plan(row, instance) -> Choice:
    """The published plan; its open fields set to the fastest combination that fits (else, as amp_opt's
    own infeasibility report does, the least overfull one)."""
    fixed, open_, notes = plan_space(row, instance)
    keys = list(open_)
    best = best_fit = None
    everything = []
    tried = 0
    for values in itertools.product(*(open_[k] for k in keys)):
        fields = dict(fixed, **dict(zip(keys, values)))
        bounds, how = partition(instance, fields["pp"], fields.get("virtual_stages", 1))
        if bounds is None:
            continue
        plan = dict(fields, partition=list(bounds))
        try:
            ev = amp_opt.evaluate(instance, amp_opt.parse_plan(plan), COST_MODEL)
        except InputError:
            continue  # a combination the engine cannot run
        tried += 1
        entry = (ev.predicted_time, plan, ev, how)
        everything.append(entry)
        if best is None or (overflow(ev), ev.predicted_time) < (overflow(best[2]), best[0]):
            best = entry
        if ev.feasible and (best_fit is None or entry[0] < best_fit[0]):
            best_fit = entry
    pick = best_fit or best
    if pick is None:
        raise RuntimeError(f"{row['id']}: no plan the engine can run")
    if pick[3]:
        notes.append(pick[3])
    fastest = min(everything, key=lambda e: e[0])
    free = (fastest[0], fastest[1]) if fastest[0] < pick[0] else None
    return Choice(pick[1], pick[2], tuple(keys), tried, notes, free)


def describe_plan(plan: dict, chosen) -> str:
    def mark(key, text):
        return text + ("\\*" if key in chosen else "")

    parts = [f"tp{plan['tp']}", f"pp{plan['pp']}", f"dp{plan['dp']}"]
    if plan.get("cp", 1) > 1:
        parts.append(f"cp{plan['cp']}")
    parts.append(mark("micro_batch", f"mb{plan['micro_batch']}"))
    v = plan.get("virtual_stages", 1)
    if plan["pp"] > 1:
        parts.append(mark("virtual_stages", f"v{v}"))
    if plan["tp"] > 1:
        parts.append(mark("sequence_parallel", "SP" if plan.get("sequence_parallel") else "no-SP"))
    parts.append(mark("recompute", {"none": "no-rc", "selective": "sel-rc", "full": "full-rc"}[plan["recompute"]]))
    if plan.get("zero_stage"):
        parts.append(mark("zero_stage", f"Z{plan['zero_stage']}"))
    elif "zero_stage" in chosen:
        parts.append(mark("zero_stage", "Z0"))
    return " ".join(parts)


# ---------------------------------------------------------------- comparison

@dataclass
class Result:
    row: dict
    source: Source
    choice: Choice
    flops: float  # per iteration, source convention
    published: float  # TFLOP/s per GPU
    published_how: str
    predicted: float  # TFLOP/s per GPU
    ratio: float
    extra: dict  # other numbers for the analysis

    @property
    def row_fp8_ratio(self) -> float:
        """Ratio predicted / published with the FP8 peak on every FLOP (FP8 rows only)."""
        return self.flops / (self.extra["time_fp8"] * self.row["gpus"]) / 1e12 / self.published


def published_tflops(row, flops: float) -> tuple[float, str]:
    m = row["measured"]
    if m.get("tflops_per_gpu"):
        return float(m["tflops_per_gpu"]), "published"
    if m.get("iteration_time_s"):
        return flops / (m["iteration_time_s"] * row["gpus"]) / 1e12, "from the published iteration time"
    if m.get("mfu"):
        return m["mfu"] * 312.0, "published MFU x 312"
    raise ValueError(f"{row['id']}: no published speed")


def within(ratio: float) -> bool:
    return 1 - WITHIN <= ratio <= 1 + WITHIN


def tp_comm_share(instance, plan: dict) -> float:
    """Share of the stage compute time that is tensor-parallel communication (eq. H2's second term)."""
    name = instance.nodes[0].device_type
    intra = instance.nodes[0].intra_bandwidth
    with_comm = layer_times(instance, name, intra, plan["tp"], plan["micro_batch"]).seconds.sum()
    without = layer_times(instance, name, math.inf, plan["tp"], plan["micro_batch"]).seconds.sum()
    return 1 - without / with_comm


def attention_share(instance) -> float:
    """Share of the model's training FLOPs in the attention core as executed (4 s^2 h forward per layer,
    half of it for a causal FlashAttention kernel; x3 for forward and backward)."""
    total = sum(layer.flops for layer in instance.layers)
    return sum(3 * layer.attention_flops for layer in instance.layers) / total


def modelled_flops(instance, plan: dict) -> float:
    """FLOPs the model charges for one iteration: every layer's forward+backward FLOPs plus what the
    plan's recomputation runs again (eq. H8), times the global batch."""
    mode = plan["recompute"]
    total = 0.0
    for layer in instance.layers:
        extra = 0.0
        if layer.recomputes and mode == "full":
            extra = layer.flops / 3
        elif layer.recomputes and mode == "selective":
            extra = layer.attention_flops
        total += layer.flops + extra
    return total * instance.training.global_batch


def evaluate_on(row, plan: dict, **variant) -> float:
    """Predicted seconds of a plan on a variant of the row's instance (``instance_dict`` options)."""
    instance = amp_opt.load_instance(instance_dict(row, **variant))
    return amp_opt.evaluate(instance, amp_opt.parse_plan(plan), COST_MODEL).predicted_time


def run_row(row) -> Result:
    src = source_of(row)
    instance = amp_opt.load_instance(instance_dict(row))
    choice = choose_plan(row, instance)
    flops = CONVENTIONS[src.convention][1](row)
    pub, how = published_tflops(row, flops)
    ev = choice.evaluation
    T = ev.predicted_time
    pred = flops / (T * row["gpus"]) / 1e12
    dev = instance.device_types[instance.nodes[0].device_type]
    slowest = max(s.compute for s in ev.stages)
    v = choice.plan.get("virtual_stages", 1)
    extra = {
        "time": T, "feasible": ev.feasible, "breakdown": dict(ev.breakdown), "n_micro": ev.n_micro,
        "steady": ev.n_micro * slowest,  # n x slowest stage: the pipeline without its bubble
        "bubble": ev.breakdown["stage_compute"] - slowest / v,  # (sum E - max E) / v
        "tp_comm": tp_comm_share(instance, choice.plan), "attention": attention_share(instance),
        "memory": max(s.memory for s in ev.stages), "capacity": min(s.capacity for s in ev.stages),
        # The most the model can predict whatever the bubble and communication: every modelled FLOP
        # (recomputation included) at analytic_efficiency x peak, in the source's FLOP count.
        "efficiency": instance.training.analytic_efficiency,
        "ceiling": flops * dev.peak_flops * instance.training.analytic_efficiency
        / modelled_flops(instance, choice.plan) / 1e12,
        # Time on the inter-node links: the plan again with them (almost) infinitely fast.
        "network": T - evaluate_on(row, choice.plan, inter_divisor=1e-9),
        # And with every link (almost) infinitely fast: the time if all communication were hidden.
        "time_no_comm": evaluate_on(row, choice.plan, inter_divisor=1e-9, intra_divisor=1e-9),
    }
    if row["gpus"] > row["gpus_per_node"]:
        # Sensitivity to the inter-node link: divided by tp (the tp ranks of a node run their rings and
        # p2p at once, each through its share of the adapters) and by the GPUs per node (every GPU held to
        # its own adapter).
        if row["tp"] > 1:
            extra["time_link_tp"] = evaluate_on(row, choice.plan, inter_divisor=row["tp"])
        extra["time_link_gpu"] = evaluate_on(row, choice.plan, inter_divisor=row["gpus_per_node"])
    if src.fp8:
        fp8 = amp_opt.load_instance(instance_dict(row, peak=FP8_H100))
        choice8 = choose_plan(row, fp8)
        extra["time_fp8"] = choice8.evaluation.predicted_time
        extra["plan_fp8"] = describe_plan(choice8.plan, choice8.chosen)
    if src.key == "llama3":
        extra["mfu_chowdhery"] = flops / (T * row["gpus"] * dev.peak_flops)
        extra["mfu_6n"] = six_n_flops(row) / (T * row["gpus"] * dev.peak_flops)
        extra["peak"] = dev.peak_flops
    if row["measured"].get("iteration_time_s"):
        extra["published_time"] = row["measured"]["iteration_time_s"]
    return Result(row, src, choice, flops, pub, how, pred, pred / pub, extra)


# ---------------------------------------------------------------- solve

SOLVE_ROWS = [
    "korthikanti-2022-table5-175b-sp-selective",
    "megatron-2021-table1-145p6b",
    "megatron-core-2024-h100-70b",
    "llama3-2024-table4-405b-16384gpu-seq8192",
]


def run_solve(row, time_limit: float, placement: str | None = None) -> dict:
    """amp_opt.solve on the row's instance, all decisions open; any failure is reported, not raised."""
    instance = amp_opt.load_instance(instance_dict(row))
    start = time.perf_counter()
    try:
        result = amp_opt.solve(instance, cost_model=COST_MODEL, time_limit=time_limit, placement=placement)
    except Exception as exc:  # noqa: BLE001 - a crash of the search is a finding to report
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                "wall": time.perf_counter() - start}
    best = result.best
    used = best.devices_used
    flops = CONVENTIONS[source_of(row).convention][1](row)
    peak = sum(instance.device_types[instance.nodes[int(instance.device_node[d])].device_type].peak_flops
               for stage in best.plan.stages for group in stage for d in group)
    return {"plan": best.plan.to_json(), "time": best.predicted_time, "used": used, "status": result.solver.status,
            "gap": result.solver.gap, "wall": time.perf_counter() - start,
            "tflops": flops / (best.predicted_time * used) / 1e12, "feasible": best.feasible,
            "mfu_6n": six_n_flops(row) / (best.predicted_time * peak)}


def solve_describe(plan: dict) -> str:
    modes = plan["recompute"]
    if isinstance(modes, str):
        return describe_plan(plan, ())
    return describe_plan(dict(plan, recompute=max(modes, key=("none", "selective", "full").index)), ()) + \
        f" (recompute per stage: {'/'.join(modes)})"


# ---------------------------------------------------------------- report

def fmt_ratio(r: float) -> str:
    return f"{r:.2f}"


def yes(flag: bool) -> str:
    return "yes" if flag else "**no**"


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
        return out.stdout.strip() + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--solve-time-limit", type=float, default=60.0,
                        help="seconds per solve run on SOLVE_ROWS; 0 skips them (default 60)")
    parser.add_argument("--write-instances", type=Path, default=None,
                        help="also write ROW.instance.json and ROW.plan.json for every rebuilt row into this folder")
    args = parser.parse_args(argv)

    rows = json.loads(CONFIGS.read_text())["rows"]
    complete = [r for r in rows if r["complete"]]
    incomplete = [r for r in rows if not r["complete"]]
    started = time.perf_counter()
    results = [run_row(r) for r in complete]
    eval_wall = time.perf_counter() - started
    solves = {}
    if args.solve_time_limit > 0:
        by_id = {r["id"]: r for r in rows}
        for rid in SOLVE_ROWS:  # the default placement (free), then rank order (the clusters are homogeneous)
            for placement in ("free", "rank-order"):
                solves[rid, placement] = run_solve(by_id[rid], args.solve_time_limit, placement)
    if args.write_instances:
        args.write_instances.mkdir(parents=True, exist_ok=True)
        for res in results:
            rid = res.row["id"]
            (args.write_instances / f"{rid}.instance.json").write_text(json.dumps(instance_dict(res.row), indent=1))
            (args.write_instances / f"{rid}.plan.json").write_text(json.dumps(res.choice.plan))
    report(results, incomplete, solves, eval_wall, args)


def report(results, incomplete, solves, eval_wall, args) -> None:
    info = machine_info()
    out = []
    p = out.append
    p("# Published training runs: predicted vs measured per-GPU throughput\n")
    cmd = COMMAND if args.solve_time_limit == 60 else COMMAND.replace(".py", f".py --solve-time-limit {args.solve_time_limit:g}")
    p(f"Command: `{cmd}`\n")
    p(f"Machine: cpu {info['cpu']}, cores {info['cores']}, python {info['python']}, platform {info['platform']}  ")
    p(f"Date: {info['date']}  ")
    p(f"amp_opt {info['amp_opt']}, commit {git_commit()}  ")
    p(f"Evaluating the {len(results)} rebuildable rows took {eval_wall:.0f} s.\n")
    p("Data: `benchmarks/published/configs.json` (66 rows) and `benchmarks/published/SOURCES.md`. "
      "Each rebuilt row is one amp_opt instance and one plan, scored by `amp_opt.evaluate(instance, plan, "
      f"\"{COST_MODEL}\")`; nothing is calibrated (`training.analytic_efficiency` is the default "
      "0.4, no measured profiles, no `calibration` section), so every layer time is the FLOPs estimate "
      "of eq. H2. The predicted time becomes TFLOP/s per GPU with the source's own FLOP formula "
      "(column \"FLOPs\"): predicted = F / (predicted time x GPUs). The ratio predicted / published is "
      "therefore published time / predicted time; above 1 the model is too optimistic.\n")

    counted = [r for r in results if not r.source.fp8]
    ok = [r for r in counted if within(r.ratio)]
    primary = [r for r in counted if not r.row["secondary"]]
    ok_primary = [r for r in primary if within(r.ratio)]
    fp8 = [r for r in results if r.source.fp8]
    p("## Summary\n")
    p(f"- Rows: {len(results) + len(incomplete)} in configs.json; {len(incomplete)} cannot be rebuilt "
      f"(`complete: false`, tp and pp unknown); {len(fp8)} are FP8 runs, evaluated but kept out of the count "
      f"(see below); {len(counted)} BF16/FP16 rows are compared.")
    p(f"- **Within 25%: {len(ok)} of {len(counted)} rows** ({len(ok_primary)} of {len(primary)} without the "
      f"3 secondary MT-NLG rows). Median ratio predicted / published: **{statistics.median(r.ratio for r in counted):.2f}** "
      f"(range {min(r.ratio for r in counted):.2f} to {max(r.ratio for r in counted):.2f}).")
    for src in SOURCES:
        rs = [r for r in counted if r.source is src]
        if rs:
            p(f"  - {src.title}: {sum(within(r.ratio) for r in rs)} of {len(rs)} within 25%, median ratio "
              f"{statistics.median(r.ratio for r in rs):.2f}")
    if fp8:
        p(f"- FP8 rows ({len(fp8)}): with the catalog's BF16 peak {sum(within(r.ratio) for r in fp8)} of {len(fp8)} "
          f"within 25% (median ratio {statistics.median(r.ratio for r in fp8):.2f}); with the FP8 peak for every "
          f"FLOP {sum(within(r.row_fp8_ratio) for r in fp8)} of {len(fp8)} (median "
          f"{statistics.median(r.row_fp8_ratio for r in fp8):.2f}).")
    capped = [r for r in counted if r.published > r.extra["ceiling"]]
    p(f"- Main cause of the gap: {len(capped)} of {len(counted)} rows published more than the model's "
      "ceiling (every modelled FLOP at 0.4 x peak, no bubble, no communication), i.e. the runs beat "
      "the model's one efficiency constant; see \"Where the model is off\", item 1.")
    infeasible = [r for r in counted if not r.extra["feasible"]]
    p(f"- Published plans amp_opt's memory model says do not fit: {len(infeasible)} of {len(counted)}"
      + (": " + ", ".join(f"`{r.row['id']}`" for r in infeasible) if infeasible else "") + ".")
    llama = [r for r in results if r.source.key == "llama3"]
    if llama:
        p("- Llama 3 405B, Meta's Table 4 configurations: predicted MFU (6 x parameters x tokens) "
          + ", ".join(f"{r.extra['mfu_6n']:.0%}" for r in llama) + " (Chowdhery's count "
          + ", ".join(f"{r.extra['mfu_chowdhery']:.0%}" for r in llama) + ") against Meta's "
          + ", ".join(f"{r.row['measured']['mfu']:.0%}" for r in llama) + ".")
    for (rid, placement), sv in solves.items():
        if rid.startswith("llama3") and "mfu_6n" in sv:
            p(f"- amp_opt's own plan for Llama 3 405B on 16,384 H100s (`solve`, placement {placement}, "
              f"{sv['wall']:.0f} s): predicted MFU (6N) {sv['mfu_6n']:.0%} (the issue's target: 25-65%).")
    failed = [(rid, placement, sv) for (rid, placement), sv in solves.items() if "error" in sv]
    if failed:
        p(f"- `solve` failed on {len(failed)} of {len(solves)} runs: "
          + "; ".join(f"`{rid}` ({placement}: {sv['error'].split(':')[0]} after {sv['wall']:.0f} s)"
                      for rid, placement, sv in failed) + " (section \"What amp_opt picks instead\").")
    p("")

    p("## How rows become instances and plans\n")
    p("**Clusters.** The row's GPU count as nodes of `gpus_per_node` GPUs (a single node of that many GPUs "
      "when fewer than 8). `inter_bandwidth` is the node's network link (README: \"the node's network link\"), "
      "so it is the sum of the node's application adapters. Per system:\n")
    for key, system in SYSTEMS.items():
        users = sorted({r.source.title for r in results if r.source.system == key})
        p(f"- **{system.name}** (`{system.gpu}`, intra {system.intra / GB_S:g} GB/s per direction, inter "
          f"{system.inter / GB_S:g} GB/s per node), used by {'; '.join(users)}. {system.assumption}")
    p("\n**Models.** `gpt` preset for GPT-style rows (biases, LayerNorm, learned positions, tied embeddings "
      "as Megatron's default, dropout on), `llama` preset for Llama rows (SwiGLU, GQA, RMSNorm, untied), with "
      "the row's hidden size, layers, heads, kv heads, FFN width, vocabulary and sequence length. Attention "
      "`eager` where the source ran without FlashAttention (2020-2022 rows), else `flash`.\n")
    p("**Plans.** tp, pp, dp, cp and every setting the source states are fixed. A field the source leaves "
      "open (marked `*` in the tables) is chosen by amp_opt's model, as a `solve` restricted to that field "
      "would: every value of amp_opt's default search space that the engine allows is evaluated with all "
      "else fixed (micro-batch: powers of two dividing the per-replica batch; virtual stages: 1, 2, 4 where "
      "they split the layers evenly; sequence parallelism off/on with tp > 1; recomputation "
      "none/selective/full, DeepSpeed none/full; ZeRO 0/1 when neither ZeRO nor a distributed optimizer is "
      "stated), and the fastest plan that fits in memory is kept (the least overfull if none fits), a tie "
      "keeping the engine's default (listed first). The 2020 rows take the micro-batch = the per-replica "
      "batch: Megatron at that commit had no gradient accumulation. Because amp_opt's analytic layer time is linear in the "
      "micro-batch (`batch_exponent` 1), the model always prefers the smallest micro-batch when pp > 1 "
      "(smallest bubble) and is indifferent when pp = 1. The layer split is Megatron's: transformer layers "
      "evenly, embedding with the first and head with the last stage; where that does not divide, the "
      "layer list with embedding and head counted as one layer each (BLOOM, Llama 3 405B), as those runs "
      "did. Engine rules: DeepSpeed for the ZeRO-3 rows, BLOOM and MT-NLG; Megatron-LM otherwise "
      "(also for Llama 3, whose engine has the same decisions).\n")
    p("**FLOP conventions** (\"FLOPs\" column), from SOURCES.md:\n")
    for key, (label, fn) in CONVENTIONS.items():
        p(f"- `{key}`: {label}. {fn.__doc__.splitlines()[0] if fn.__doc__ else ''}")
    p("- Published TFLOP/s per GPU: the published number where there is one; for Korthikanti's rows "
      "eq. (7) over the published iteration time (this reproduces their MFU); for the 530B dp=8 "
      "full-recompute row the published MFU x 312.\n")
    p("**FP8 rows.** amp_opt's catalog holds one dense FP16/BF16 peak per GPU and applies it to every "
      "FLOP; it has no FP8 rate. The FP8 rows (NeMo 24.07, Megatron-Bridge) are therefore kept out of the "
      "count and shown twice: with the catalog's BF16 peak (989.4 TFLOP/s, an FP8 run should beat it) and "
      "with an instance-level `peak_flops` override of 1,979 TFLOP/s, the H100's dense FP8 rate, applied "
      "to every FLOP (too fast: attention, norms and communication do not run at FP8 rate). The published "
      "number should fall between the two.\n")

    p("## Results per source\n")
    p("Columns: config (`*` = chosen by amp_opt, the source does not state it), published TFLOP/s/GPU, "
      "predicted TFLOP/s/GPU (same FLOP formula), ratio predicted / published, within 25%, and the "
      "predicted iteration time (published time in brackets where the source gives one). "
      "\"fits\" is amp_opt's memory verdict on the plan.\n")
    for src in SOURCES:
        rs = [r for r in results if r.source is src]
        if not rs:
            continue
        p(f"### {src.title}\n")
        p(f"Source: {src.citation}  ")
        p(f"FLOPs: `{src.convention}` ({CONVENTIONS[src.convention][0]}). System: {SYSTEMS[src.system].name}.\n")
        if src.fp8:
            p("| row | GPUs | config | published | predicted (BF16 peak) | ratio | predicted (FP8 peak) | ratio | "
              "between? | time s (BF16 / FP8 peak) | fits |")
            p("|---|---|---|---|---|---|---|---|---|---|---|")
            for r in rs:
                fp8_pred = r.flops / (r.extra["time_fp8"] * r.row["gpus"]) / 1e12
                between = r.predicted <= r.published <= fp8_pred
                p(f"| `{r.row['id']}` | {r.row['gpus']} | {describe_plan(r.choice.plan, r.choice.chosen)} | "
                  f"{r.published:.0f} | {r.predicted:.0f} | {fmt_ratio(r.ratio)} | {fp8_pred:.0f} | "
                  f"{fmt_ratio(r.row_fp8_ratio)} | {'yes' if between else 'no'} | "
                  f"{r.extra['time']:.2f} / {r.extra['time_fp8']:.2f} | {yes(r.extra['feasible'])} |")
        else:
            p("| row | GPUs | config | published | predicted | ratio | within 25% | time s (published) | fits |")
            p("|---|---|---|---|---|---|---|---|---|")
            for r in rs:
                pub_t = f" ({r.extra['published_time']:g})" if "published_time" in r.extra else ""
                mark = " (secondary)" if r.row["secondary"] else ""
                pub = f"{r.published:.1f}" + ("" if r.published_how == "published" else f" ({r.published_how})")
                p(f"| `{r.row['id']}`{mark} | {r.row['gpus']} | {describe_plan(r.choice.plan, r.choice.chosen)} | "
                  f"{pub} | {r.predicted:.1f} | {fmt_ratio(r.ratio)} | {'yes' if within(r.ratio) else '**no**'} | "
                  f"{r.extra['time']:.2f}{pub_t} | {yes(r.extra['feasible'])} |")
        notes = sorted({n for r in rs for n in r.choice.notes + model_spec(r.row)[1]})
        if notes:
            p("\nAssumptions for these rows: " + "; ".join(notes) + ".")
        p("")
    if incomplete:
        p("### Rows not rebuilt\n")
        for r in incomplete:
            p(f"- `{r['id']}`: {r['notes'].split('.')[0]}.")
        p("")

    llama = [r for r in results if r.source.key == "llama3"]
    if llama:
        p("## Llama 3 405B (Meta reports 38-43% BF16 MFU)\n")
        p("Predicted MFU of the Table 4 configurations, against the catalog's H100 peak "
          f"({llama[0].extra['peak'] / 1e12:.1f} TFLOP/s; Meta's figures imply about 1,000): with Chowdhery et al.'s "
          "count (the one the paper cites, 6N + 12LHQT per token, full attention) and with the issue's "
          "6 x parameters x tokens.\n")
        p("| row | config | predicted time s | predicted MFU (6N+12LHQT) | predicted MFU (6N) | Meta's MFU | "
          "predicted TFLOP/s | Meta's TFLOP/s | ratio |")
        p("|---|---|---|---|---|---|---|---|---|")
        for r in llama:
            p(f"| `{r.row['id']}` | {describe_plan(r.choice.plan, r.choice.chosen)} | {r.extra['time']:.2f} | "
              f"{r.extra['mfu_chowdhery']:.1%} | {r.extra['mfu_6n']:.1%} | {r.row['measured']['mfu']:.0%} | "
              f"{r.predicted:.0f} | {r.published:.0f} | {fmt_ratio(r.ratio)} |")
        p("")

    if solves:
        p(f"## What amp_opt picks instead (`amp_opt.solve`, all decisions open, {args.solve_time_limit:g} s limit)\n")
        p("Same instance as the row (same cluster, model and global batch, the engine's rules, idle GPUs "
          "allowed), solved twice: with the default placement (`free`) and with `rank-order` (the clusters "
          "are homogeneous, so both describe the same plans up to which devices form a group). TFLOP/s per "
          "used GPU with the source's formula; wall = the whole `solve` call on this machine. Every plan "
          "below is scored by the same uncalibrated model as the tables above, so a faster plan here is "
          "faster *in the model*; see \"Where the model is off\" for what the model ignores.\n")
        p("| row | published plan (as rebuilt) | its predicted time s | placement | amp_opt's plan | status | "
          "wall s | predicted time s | GPUs used | predicted TFLOP/s | MFU (6N) | published TFLOP/s |")
        p("|---|---|---|---|---|---|---|---|---|---|---|---|")
        by_id = {r.row["id"]: r for r in results}
        for (rid, placement), s in solves.items():
            r = by_id[rid]
            head = f"| `{rid}` | {describe_plan(r.choice.plan, r.choice.chosen)} | {r.extra['time']:.2f} | {placement} |"
            if "error" in s:
                p(f"{head} {s['error']} | failed | {s['wall']:.0f} | | | | | {r.published:.0f} |")
                continue
            p(f"{head} {solve_describe(s['plan'])} | {s['status']} | {s['wall']:.0f} | {s['time']:.2f} | "
              f"{s['used']} | {s['tflops']:.0f} | {s['mfu_6n']:.1%} | {r.published:.0f} |")
        p("")
        for (rid, placement), s in solves.items():
            if "error" not in s:
                continue
            if s["error"].startswith("RecursionError"):
                p(f"- `{rid}`, placement {placement}: the free-grouping enumerator crashed. `_moves` in "
                  "`amp_opt/search/free_grouping.py` recurses once per node in the canonical order, and this cluster "
                  f"has {by_id[rid].row['gpus'] // by_id[rid].row['gpus_per_node']} nodes, more than Python's "
                  "default recursion limit (1,000). A search bug, not a cost-model one; rank order solves the "
                  "same instance.")
            elif s["wall"] > 1.5 * args.solve_time_limit:
                p(f"- `{rid}`, placement {placement}: `{s['error']}` after {s['wall']:.0f} s, with a "
                  f"{args.solve_time_limit:g} s limit: the limit was not kept and no plan came back, while rank "
                  "order (the same plans on this homogeneous cluster) solves it in seconds. A search issue, "
                  "not a cost-model one.")
            else:
                p(f"- `{rid}`, placement {placement}: `{s['error']}`.")
        picks = [(rid, s) for (rid, placement), s in solves.items() if "plan" in s and placement == "rank-order"]
        short_cp = [(rid, s) for rid, s in picks if s["plan"]["cp"] > 1 and by_id[rid].row["model"]["seq_len"] <= 8192]
        if short_cp:
            p(f"- {len(short_cp)} of {len(picks)} picks use context parallelism at sequences of 2K-8K tokens ("
              + ", ".join(f"`{rid}`: cp {s['plan']['cp']} at s = {by_id[rid].row['model']['seq_len']}"
                          for rid, s in short_cp)
              + "). In the model cp costs only its K/V ring, while a GEMM over s/cp tokens runs at the same "
              "40% of peak as one over s (item 1 of \"Where the model is off\"); real kernels lose efficiency "
              "on the shorter sequences, so these picks are faster in the model, not necessarily on the "
              "machine.")
        p("")

    p("## Predicted time, term by term\n")
    p("Per row: the model's ceiling (every modelled FLOP, recomputation included, at analytic_efficiency x "
      "peak, no bubble, no communication, in the source's FLOP count: no plan can be predicted faster); "
      "the shares of the predicted iteration time spent in the steady state (n x the slowest stage), the "
      "pipeline bubble ((sum of stage times - slowest) / v), p2p on the fill path, the gradient "
      "synchronisation of the slowest-to-reduce stage, and on inter-node links in total (the same plan "
      "with infinitely fast inter-node links); the tensor-parallel communication inside the layer times "
      "(eq. H2); the ratio if every communication were hidden (the same plan with infinitely fast links); "
      "the attention core's share of the modelled FLOPs (4 s^2 h per layer forward, no causal mask); "
      "memory per device of the fullest stage.\n")
    p("| row | published | ceiling | ratio | steady % | bubble % | p2p % | DP sync % | inter-node % | "
      "TP comm % of compute | ratio, comm hidden | attention % of FLOPs | mem GiB / cap |")
    p("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        b, x, T = r.extra["breakdown"], r.extra, r.extra["time"]
        p(f"| `{r.row['id']}` | {r.published:.0f} | {x['ceiling']:.0f} | {fmt_ratio(r.ratio)} | "
          f"{100 * x['steady'] / T:.1f} | {100 * x['bubble'] / T:.1f} | {100 * b['p2p'] / T:.2f} | "
          f"{100 * b['allreduce'] / T:.1f} | {100 * x['network'] / T:.1f} | {100 * x['tp_comm']:.1f} | "
          f"{r.ratio * T / x['time_no_comm']:.2f} | {100 * x['attention']:.1f} | "
          f"{x['memory'] / 2**30:.1f} / {x['capacity'] / 2**30:.0f} |")
    p("")

    linked = [r for r in results if "time_link_gpu" in r.extra and not r.source.fp8]
    moved = [r for r in linked if abs(r.extra["time_link_gpu"] / r.extra["time"] - 1) > 0.01]
    p("## Sensitivity to the inter-node link\n")
    p("The headline gives each node its documented adapters as one link (`inter_bandwidth`, the sum). "
      "The same plans re-evaluated with that link divided by tp (each of a node's tp ranks runs its own "
      "data-parallel ring and p2p at the same time, through its share of the adapters) and by the GPUs "
      "per node (every GPU held to its own adapter, also for tp = 1). Rows whose prediction moves by more "
      f"than 1% ({len(moved)} of {len(linked)} multi-node BF16/FP16 rows):\n")
    p("| row | tp | ratio (node link) | ratio (link / tp) | ratio (link / GPUs per node) |")
    p("|---|---|---|---|---|")
    for r in moved:
        x = r.extra
        by_tp = f"{r.ratio * x['time'] / x['time_link_tp']:.2f}" if "time_link_tp" in x else "same"
        p(f"| `{r.row['id']}` | {r.row['tp']} | {fmt_ratio(r.ratio)} | {by_tp} | "
          f"{r.ratio * x['time'] / x['time_link_gpu']:.2f} |")
    counted = [r for r in results if not r.source.fp8]

    def ratio_with(r, key):
        return r.ratio * r.extra["time"] / r.extra.get(key, r.extra["time"])

    p(f"\nWithin 25% with the link divided by tp: {sum(within(ratio_with(r, 'time_link_tp')) for r in counted)} of "
      f"{len(counted)} rows; divided by the GPUs per node: "
      f"{sum(within(ratio_with(r, 'time_link_gpu')) for r in counted)} of {len(counted)} (headline: "
      f"{sum(within(r.ratio) for r in counted)}).\n")

    analysis(results, p)
    print("\n".join(out))


def analysis(results, p) -> None:
    counted = [r for r in results if not r.source.fp8]
    med = statistics.median(r.ratio for r in counted)
    low = [r for r in counted if r.ratio < 1 - WITHIN]
    high = [r for r in counted if r.ratio > 1 + WITHIN]
    p("## Where the model is off and why\n")
    p(f"The model is pessimistic on almost every row (median ratio {med:.2f}; {len(low)} rows below 0.75, "
      f"{len(high)} above 1.25). The numbers below come from the tables above; nothing was fitted.\n")

    # 1. Efficiency constant.
    capped = [r for r in counted if r.published > r.extra["ceiling"]]
    p(f"**1. One efficiency constant for every GEMM (the main cause).** Without a measured profile a "
      "layer takes FLOPs / (tp x peak x 0.4) (eq. H2, `training.analytic_efficiency`), whatever its "
      "shape, precision, software year or micro-batch (`batch_exponent` 1: a larger micro-batch is no "
      f"faster per sample). That caps every prediction at the \"ceiling\" column. {len(capped)} of "
      f"{len(counted)} compared rows published MORE than that ceiling, so no bubble or communication "
      "term could bring them within reach:")
    for src in SOURCES:
        rs = [r for r in capped if r.source is src]
        if rs:
            p(f"  - {src.title}: {len(rs)} row{'s' if len(rs) > 1 else ''}, published / ceiling "
              f"{min(r.published / r.extra['ceiling'] for r in rs):.2f} to "
              f"{max(r.published / r.extra['ceiling'] for r in rs):.2f}")
    t1 = [r for r in counted if r.row["id"].startswith("megatron-2021-table1")]

    def of_peak(rs):
        """Published speed as a fraction of peak in the model's FLOP count (recomputation included):
        published x efficiency / ceiling, to set against the model's efficiency."""
        fr = [r.published * r.extra["efficiency"] / r.extra["ceiling"] for r in rs]
        return f"{min(fr):.0%}-{max(fr):.0%}"

    if t1:
        old20 = [r for r in counted if r.source.key == "readme2020"]
        recent = [r for r in counted if r.source.key in ("korthikanti2022", "mcore2024", "llama3")]
        p(f"  The gap grows with model size: along Narayanan's Table 1 the published rate rises from "
          f"{t1[0].published:.0f} to {t1[-1].published:.0f} TFLOP/s (bigger GEMMs run closer to peak) while "
          f"the ratio falls from {t1[0].ratio:.2f} to {t1[-1].ratio:.2f}. The rows that agree best are the "
          f"2020 Megatron v1 rows (smaller GEMMs, 2020 software; they run at {of_peak(old20)} of peak in the "
          f"model's FLOP count, published x 0.4 / ceiling, against the model's 40%; ratios "
          + ", ".join(f"{r.ratio:.2f}" for r in old20)
          + f"). Korthikanti 2022, Megatron-Core 2024 and Llama 3 reach {of_peak(recent)} and are predicted "
          f"at a median {statistics.median(r.ratio for r in recent):.2f} of their speed. A constant cannot "
          "follow that; a GEMM-shape-aware rate (or measured profiles, or `calibration.compute_scale` from "
          "issue 15, fitted on measurements and not on these rows) is what would.\n")

    # 2. Overlap.
    mc = [r for r in counted if r.source.key == "mcore2024"]
    p("**2. Communication is never overlapped with compute.** Tensor-parallel collectives are added to "
      "each layer's time (eq. H2), the gradient synchronisation after the pipeline (eq. H6), ZeRO-3 "
      "gathers and context-parallel K/V passes to the stage time (H10). The Megatron-Core 2024 runs "
      "overlap all of these (`--tp-comm-overlap`, `--overlap-grad-reduce`, `--overlap-param-gather`). "
      "Hiding every communication (column \"ratio, comm hidden\") moves their ratios:")
    for r in mc:
        p(f"  - `{r.row['id']}` (tp {r.row['tp']}): {r.ratio:.2f} -> "
          f"{r.ratio * r.extra['time'] / r.extra['time_no_comm']:.2f} "
          f"(TP comm {100 * r.extra['tp_comm']:.1f}% of compute)")
    if mc:
        p("  Overlap explains up to about 15 points on the tp = 8 rows; the rest is item 1. Adding overlap "
          "to the model (a fraction of each collective hidden behind the GEMMs it overlaps with) would be "
          "a model change, not a constant.\n")

    # 3. Link sharing.
    shared = [r for r in counted if "time_link_tp" in r.extra]
    worst = max(shared, key=lambda r: r.extra["time_link_tp"] / r.extra["time"]) if shared else None
    p("**3. A node's network adapters are given whole to every ring crossing it.** `hetero_link` "
      "(`amp_opt/model/costs/terms.py`, eq. H3 and H4) prices a stage's data-parallel ring and a pipeline "
      "boundary at the slowest node link, without counting how many rings and p2p streams use that link "
      "at once. With tp ranks per node each running its own ring, a ring really gets 1/tp of the node's "
      "adapters. This is an optimistic bias, hidden here by the pessimism of items 1 and 2" + (
          f"; the largest change when the link is divided by tp is `{worst.row['id']}`, ratio "
          f"{worst.ratio:.2f} -> {worst.ratio * worst.extra['time'] / worst.extra['time_link_tp']:.2f} "
          "(section \"Sensitivity to the inter-node link\")" if worst else "")
      + ". It would decide plans on slow networks, where the search would put data-parallel rings across "
      "nodes that cannot feed them.\n")

    # 4. Bubble, schedule and memory.
    def differs(r, keys):
        t, plan = r.choice.unconstrained
        return any(plan.get(k) != r.choice.plan.get(k) for k in keys)

    rejected = [r for r in counted if r.choice.unconstrained is not None]
    forced = [r for r in rejected if differs(r, ("virtual_stages", "micro_batch", "sequence_parallel"))]
    rc_only = [r for r in rejected if r not in forced and r.choice.plan.get("zero_stage") != 3]
    p("**4. Pipeline bubble, interleaving and memory.** The bubble term is exact for equal stages under "
      "Megatron's interleaved 1F1B, but the interleaved schedule keeps more micro-batches in flight "
      "(eq. H11), and where the source leaves v or the micro-batch open, amp_opt picks within its own "
      "search values (v in 1, 2, 4). Where the model's memory rule rejected a faster setting:")
    for r in forced:
        t, plan = r.choice.unconstrained
        p(f"  - `{r.row['id']}`: picked {describe_plan(r.choice.plan, r.choice.chosen)} (bubble "
          f"{100 * r.extra['bubble'] / r.extra['time']:.0f}% of the time, ratio {r.ratio:.2f}); the fastest "
          f"setting, {describe_plan(plan, r.choice.chosen)}, does not fit and would give ratio "
          f"{r.ratio * r.extra['time'] / t:.2f}")
    if rc_only:
        p(f"  On {len(rc_only)} more rows (" + ", ".join(f"`{r.row['id']}`" for r in rc_only) + ") the memory "
          "rule only ruled out running without recomputation, and the sources did recompute (the 2020 "
          "README's example scripts pass `--checkpoint-activations`; MT-NLG is reported with it): a check "
          "that passes.")
    p("  Meta states that it tuned the number of micro-batches per schedule round and balanced the "
      "first and last stages to train 8K sequences without recomputation; amp_opt's memory rule has no "
      "such schedule, so on the 8,192-GPU row it falls back to v = 1 with 32 micro-batches through 16 "
      "stages. Steady-state p2p is not on the modelled critical path (only the fill path, AMP's "
      "convention); the p2p column stays below 1% on every row, so that omission is small here.\n")

    # 5. ZeRO-3.
    z3 = [r for r in counted if r.choice.plan.get("zero_stage") == 3]
    if z3:
        p("**5. ZeRO-3 at scale (H9, H10).** Narayanan's ZeRO-3 rows keep the global batch and "
          "double the GPUs, so each GPU's micro-batch shrinks while the parameter gathers per micro-batch "
          "stay the same. Published and predicted:")
        for r in z3:
            p(f"  - `{r.row['id']}`: published {r.published:.0f}, predicted {r.predicted:.0f} TFLOP/s (ratio "
              f"{r.ratio:.2f}; inter-node {100 * r.extra['network'] / r.extra['time']:.0f}% of the predicted "
              f"time; with each GPU held to its own adapter, ratio "
              f"{r.ratio * r.extra['time'] / r.extra['time_link_gpu']:.2f})")
        p("  The published rate falls about 3x from the smallest to the largest run; the model's falls "
          "much less, because it moves the gathers at the node's whole 200 GB/s and has no per-message "
          "latency (ring collectives over 1,536-2,240 ranks, three per layer per micro-batch). Holding each "
          f"GPU to its own {SYSTEMS['selene'].inter / 8 / GB_S:g} GB/s adapter reproduces the slope better (last number above), which suggests "
          "the gathers did not use the node's adapters together; the rows cannot separate that from "
          "latency or from DeepSpeed's 2021 implementation.")
        p("  Memory: the published ZeRO-3 plans need "
          + ", ".join(f"{r.extra['memory'] / 2**30:.0f} GiB" for r in z3)
          + " per GPU (80 GiB A100s) in the model: the sharded model state (H9) plus one gathered layer. "
          "(Until this check found it, H9 counted the gathered layer once per replica, which made ZeRO-3 "
          "look impossible on any cluster with more than a handful of replicas; fixed in `CandidateTerms.memory` "
          "and the MIP's buffer rows, with a test by hand in `tests/test_strategies.py`.)\n")

    # 6. Attention FLOPs.
    att = sorted(results, key=lambda r: r.extra["attention"], reverse=True)[:4]
    p("**6. Attention FLOPs: what the kernel executes.** The presets charge the attention core (Q K^T "
      "and scores x V) as the kernel executes it: 4 s^2 h forward per layer for an eager kernel, which "
      "computes the whole square and masks it, and half of that for FlashAttention with a causal mask "
      "(the presets' default, `causal`), whose kernels skip the masked blocks (less still with Llama 3's "
      "document mask, not modelled). The sources' FLOP conventions differ on purpose (Megatron-Bridge "
      "halves, Megatron-Core and NeMo 24.07 do not), which is why every ratio above uses the source's own "
      "count for both sides. Largest attention shares of the executed FLOPs:")
    for r in att:
        p(f"  - `{r.row['id']}` (s = {r.row['model']['seq_len']}): attention core {100 * r.extra['attention']:.1f}% "
          "of the modelled FLOPs")
    p("  At 2K-8K tokens this is a few percent; at Llama 3's 131,072 tokens it is a large part of the "
      "prediction (and, with the context-parallel ring, of which cp the search picks).\n")

    # 7. Recomputation: a check that passes.
    pairs = {}
    for r in counted:
        if r.source.key == "korthikanti2022" and "published_time" in r.extra:
            key = r.row["id"].replace("-full-recompute", "").replace("-sp-selective", "")
            pairs.setdefault(key, {})["full" if "full" in r.row["id"] else "sel"] = r
    p("**7. Relative effects: recomputation and sequence parallelism right, data-parallel scaling loss "
      "too small.** Korthikanti's paired rows run the same plan with full recomputation and with sequence parallelism "
      "plus selective recomputation. The absolute times are off by item 1, but the speed-up is not:")
    for key, pair in pairs.items():
        if len(pair) == 2:
            f, s = pair["full"], pair["sel"]
            p(f"  - {key}: published {f.extra['published_time'] / s.extra['published_time']:.2f}x, predicted "
              f"{f.extra['time'] / s.extra['time']:.2f}x")
    old20 = {}
    for r in counted:
        if r.source.key == "readme2020":
            old20.setdefault(r.row["id"].split("-")[3], []).append(r)
    if old20:
        p("  The 2020 rows' loss per GPU from one node to 128-way data parallelism (the data-parallel "
          "allreduce over InfiniBand), published vs predicted: "
          + "; ".join(f"{size}: {1 - big.published / one.published:.1%} vs {1 - big.predicted / one.predicted:.1%}"
                      for size, (one, big) in old20.items())
          + ". The model sees the direction but only part of the loss (no latency, no straggler or "
            "synchronisation cost).")
    p("")

    # 8. FP8.
    fp8 = [r for r in results if r.source.fp8]
    if fp8:
        between = sum(r.predicted <= r.published <= r.flops / (r.extra["time_fp8"] * r.row["gpus"]) / 1e12
                      for r in fp8)
        p(f"**8. FP8.** The model has no FP8 rate. With the BF16 peak every FP8 row is predicted at "
          f"{min(r.ratio for r in fp8):.2f}-{max(r.ratio for r in fp8):.2f} of the published speed; with "
          f"the FP8 peak on every FLOP at {min(r.row_fp8_ratio for r in fp8):.2f}-"
          f"{max(r.row_fp8_ratio for r in fp8):.2f}. The published value lies between the two predictions "
          f"for {between} of {len(fp8)} rows: even at the FP8 peak the model is mostly too slow, for the reason "
          f"of item 1 (in their own FLOP counts these runs reach {min(r.published for r in fp8) / FP8_H100 * 1e12:.0%}-"
          f"{max(r.published for r in fp8) / FP8_H100 * 1e12:.0%} of the dense FP8 peak, against the model's 40%). "
          "Supporting FP8 "
          "needs a per-device FP8 peak in the catalog and a split of each layer's FLOPs into the GEMMs that "
          "run in FP8 and the rest (attention core, norms), which the presets already know.\n")

    p("**9. What the rows cannot tell.** Where a source leaves a field open the model picks it (marked "
      "`*`), which favours the model; Megatron-Core 2024's model shape (MHA, 4h MLP, untied embeddings) is "
      "inferred from its size labels; the MT-NLG rows are secondary; the 2020 rows' GPU memory is "
      "inferred from the date. A chosen micro-batch or v moves a row by at most its bubble share in the "
      "term-by-term table; the memory-driven choice of item 4 is the exception.\n")


if __name__ == "__main__":
    main()
