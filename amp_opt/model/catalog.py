"""Built-in GPU catalog: memory, peak tensor FLOP/s and a typical intra-node link.

Lets an instance say ``"gpu": "A100-80GB"`` instead of spelling out numbers.
Conventions, applied to every entry:

* ``memory_bytes`` is the nominal capacity with the vendor's "GB" read as GiB
  (2**30 bytes).  DRAM parts (HBM stacks and GDDR chips alike) come in binary
  sizes, and ``nvidia-smi`` reports e.g. 40960 MiB for an A100-40GB and 24564 MiB
  for an RTX 4090.  Nothing is subtracted for ECC, the CUDA context or the
  allocator: the memory model applies its own reserve.  H200's "141 GB" is the
  usable part of 144 GiB of HBM3e and is taken as 141 GiB.
* ``peak_flops`` is the dense (no 2:4 sparsity) FP16/BF16 tensor-core rate with
  FP32 accumulation, from the vendor datasheet; where a datasheet only quotes the
  sparse figure, half of it.
* ``intra_node_bandwidth`` is a convenience for the instance generator: the
  per-GPU, per-direction GPU-to-GPU bandwidth of a typical server for that GPU
  (half of NVIDIA's bidirectional NVLink figure; PCIe x16 per direction when
  the usual server has no NVLink).  Real clusters should state their own links.
* ``memory_bandwidth`` is the datasheet's peak device-memory bandwidth (bytes/s, decimal
  GB/s), which the optimizer step's memory-bound pass runs at (``formulations/hetero.md``
  H15); ``MEMORY_BANDWIDTH`` gives each value's datasheet line.
* ``price_per_hour`` is an on-demand list price in USD per GPU-hour (``PRICES``: the
  node's hourly price over its GPUs, with its provider, instance and date).  Prices
  move: an instance's ``device_types`` entry overrides it (``price_per_hour``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import InputError

GIB = 2**30
TERA = 1e12
GB_PER_S = 1e9

# Per-direction link rates used below (bytes/s).
_NVLINK2_V100 = 150 * GB_PER_S  # 300 GB/s bidirectional, DGX-1 / p3.16xlarge
_NVLINK3_A100 = 300 * GB_PER_S  # 600 GB/s bidirectional, HGX A100 NVSwitch
_NVLINK4_H100 = 450 * GB_PER_S  # 900 GB/s bidirectional, HGX H100/H200 NVSwitch
_PCIE3_X16 = 16 * GB_PER_S  # "32 GB/s" bidirectional in the T4 datasheet
_PCIE4_X16 = 32 * GB_PER_S  # "64 GB/s" bidirectional in the A10/L4 datasheets


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model: capacity (bytes), dense fp16/bf16 peak (FLOP/s), datasheet."""

    name: str
    memory_bytes: float
    peak_flops: float
    source: str
    intra_node_bandwidth: float | None = None  # bytes/s per direction; None if unknown
    price_per_hour: float | None = None  # USD per GPU-hour, on-demand list price (see PRICES)
    memory_bandwidth: float | None = None  # bytes/s of device memory, datasheet peak (see MEMORY_BANDWIDTH)


_AWS = "AWS us-east-1 on-demand Linux, instances.vantage.sh data of 2026-01-21 (after AWS's June 2025 P4/P5 cut)"

# USD per GPU-hour and where it comes from: the price of a whole node over its GPU count.
PRICES: dict[str, tuple[float, str]] = {
    "V100-16GB": (3.06, f"p3.16xlarge, 8 x V100-16GB, $24.48/h; {_AWS}"),
    "V100-32GB": (3.9015, f"p3dn.24xlarge, 8 x V100-32GB, $31.212/h; {_AWS}"),
    "T4": (0.978, f"g4dn.metal, 8 x T4, $7.824/h; {_AWS}"),
    "A10": (0.86, "Lambda on-demand 1 x A10 $0.86/h, as listed on 2026-05-07 (secondary source: "
                  "techbytes.app serverless GPU pricing matrix); no hyperscaler sells the A10 on demand"),
    "A10G": (2.036, f"g5.48xlarge, 8 x A10G, $16.288/h; {_AWS}"),
    "L4": (1.6688, f"g6.48xlarge, 8 x L4, $13.3504/h; {_AWS}"),
    "A100-40GB": (2.7447, f"p4d.24xlarge, 8 x A100-40GB, $21.9576/h; {_AWS}"),
    "A100-80GB": (3.4309, f"p4de.24xlarge, 8 x A100-80GB, $27.4471/h; {_AWS}"),
    "H100-80GB": (6.88, f"p5.48xlarge, 8 x H100-80GB, $55.04/h; {_AWS}"),
    "H200": (7.912, "p5en.48xlarge, 8 x H200, $63.296/h, AWS us-east-1 on-demand (dstack offer listing of 2026-08-06)"),
    "RTX-4090": (0.69, "RunPod Secure Cloud 1 x RTX 4090 $0.69/h (SkyPilot catalog snapshot, undated, likely 2025)"),
}


# Peak device-memory bandwidth (bytes/s) and the datasheet line it is read from.
MEMORY_BANDWIDTH: dict[str, tuple[float, str]] = {
    "V100-16GB": (900 * GB_PER_S, "NVIDIA Tesla V100 datasheet: SXM2, memory bandwidth 900 GB/s"),
    "V100-32GB": (900 * GB_PER_S, "NVIDIA Tesla V100 datasheet: SXM2, memory bandwidth 900 GB/s"),
    "T4": (320 * GB_PER_S, "NVIDIA T4 datasheet: GPU memory bandwidth 320+ GB/s (GDDR6)"),
    "A10": (600 * GB_PER_S, "NVIDIA A10 datasheet: GPU memory bandwidth 600 GB/s (GDDR6)"),
    "A10G": (600 * GB_PER_S, "AWS EC2 G5 (A10G, 24 GB GDDR6): 600 GB/s, as the A10; no public NVIDIA datasheet"),
    "L4": (300 * GB_PER_S, "NVIDIA L4 datasheet: GPU memory bandwidth 300 GB/s"),
    "A100-40GB": (1555 * GB_PER_S, "NVIDIA A100 datasheet: A100 40GB SXM, GPU memory bandwidth 1,555 GB/s"),
    "A100-80GB": (2039 * GB_PER_S, "NVIDIA A100 datasheet: A100 80GB SXM, GPU memory bandwidth 2,039 GB/s"),
    "H100-80GB": (3350 * GB_PER_S, "NVIDIA H100 datasheet: H100 SXM, GPU memory bandwidth 3.35 TB/s"),
    "H200": (4800 * GB_PER_S, "NVIDIA H200 datasheet: H200 SXM, GPU memory bandwidth 4.8 TB/s"),
    "RTX-4090": (1008 * GB_PER_S, "NVIDIA Ada Lovelace GPU architecture whitepaper: GeForce RTX 4090, "
                                  "memory bandwidth 1008 GB/s (GDDR6X)"),
}


def _spec(name, gib, tflops, source, link):
    price = PRICES[name][0] if name in PRICES else None
    bandwidth = MEMORY_BANDWIDTH[name][0] if name in MEMORY_BANDWIDTH else None
    return GpuSpec(name, float(gib * GIB), float(tflops * TERA), source, float(link), price, bandwidth)


CATALOG: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        _spec("V100-16GB", 16, 125.0,
              "NVIDIA Tesla V100 GPU datasheet: SXM2, 125 TFLOPS deep-learning (tensor) performance",
              _NVLINK2_V100),
        _spec("V100-32GB", 32, 125.0,
              "NVIDIA Tesla V100 GPU datasheet: SXM2, 125 TFLOPS deep-learning (tensor) performance",
              _NVLINK2_V100),
        _spec("T4", 16, 65.0,
              "NVIDIA T4 Tensor Core GPU datasheet: 65 TFLOPS mixed precision (FP16/FP32)",
              _PCIE3_X16),
        _spec("A10", 24, 125.0,
              "NVIDIA A10 Tensor Core GPU datasheet: FP16/BF16 Tensor Core 125 TF (250 TF with sparsity)",
              _PCIE4_X16),
        _spec("A10G", 24, 70.0,
              "AWS EC2 G5 NVIDIA A10G (AWS-specific A10 variant; ~70 TFLOPS FP16 tensor, "
              "lower than the A10's 125 TF): third-party spec comparison, no public NVIDIA datasheet",
              _PCIE4_X16),
        _spec("L4", 24, 121.0,
              "NVIDIA L4 Tensor Core GPU datasheet: FP16/BF16 Tensor Core 242 TFLOPS with sparsity, halved",
              _PCIE4_X16),
        _spec("A100-40GB", 40, 312.0,
              "NVIDIA A100 Tensor Core GPU datasheet: SXM4, BF16/FP16 Tensor Core 312 TFLOPS (624 with sparsity)",
              _NVLINK3_A100),
        _spec("A100-80GB", 80, 312.0,
              "NVIDIA A100 Tensor Core GPU datasheet: SXM4, BF16/FP16 Tensor Core 312 TFLOPS (624 with sparsity)",
              _NVLINK3_A100),
        _spec("H100-80GB", 80, 989.4,
              "NVIDIA H100 Tensor Core GPU datasheet: SXM5, BF16/FP16 Tensor Core 1,979 TFLOPS with sparsity, halved",
              _NVLINK4_H100),
        _spec("H200", 141, 989.4,
              "NVIDIA H200 Tensor Core GPU datasheet: SXM, 141 GB HBM3e, BF16/FP16 Tensor Core "
              "1,979 TFLOPS with sparsity, halved",
              _NVLINK4_H100),
        _spec("RTX-4090", 24, 165.2,
              "NVIDIA Ada Lovelace GPU architecture whitepaper (GeForce RTX 4090): peak FP16 Tensor TFLOPS "
              "with FP32 accumulate 165.2 (330.4 with sparsity; 330.3 dense with FP16 accumulate)",
              _PCIE4_X16),
    )
}

# Other spellings people use, mapped to catalog names (after normalisation).
_ALIASES = {
    "H100": "H100-80GB",
    "H100-SXM": "H100-80GB",
    "H100-SXM5": "H100-80GB",
    "H100-SXM-80GB": "H100-80GB",
    "H200-141GB": "H200",
    "H200-SXM": "H200",
    "T4-16GB": "T4",
    "A10-24GB": "A10",
    "A10G-24GB": "A10G",
    "L4-24GB": "L4",
    "RTX-4090-24GB": "RTX-4090",
    "GeForce-RTX-4090": "RTX-4090",
    "4090": "RTX-4090",
    "A100-SXM4-40GB": "A100-40GB",
    "A100-SXM4-80GB": "A100-80GB",
    "V100-SXM2-16GB": "V100-16GB",
    "V100-SXM2-32GB": "V100-32GB",
}


def normalize_name(name: str) -> str:
    """Case-folded name without '-', '_' or whitespace, the key ``lookup`` matches on."""
    return re.sub(r"[-_\s]+", "", name).casefold()


_INDEX: dict[str, str] = {normalize_name(n): n for n in CATALOG}
_INDEX.update({normalize_name(alias): target for alias, target in _ALIASES.items()})


def lookup(name: str, field: str) -> GpuSpec:
    """The catalog entry for ``name``, spelled loosely ("a100_80gb", "A100 80GB")."""
    if not isinstance(name, str):
        raise InputError(field, f"expected a GPU name (string), got {type(name).__name__}")
    key = _INDEX.get(normalize_name(name))
    if key is None:
        known = ", ".join(CATALOG)
        raise InputError(field, f"unknown GPU {name!r}; known GPUs: {known}")
    return CATALOG[key]
