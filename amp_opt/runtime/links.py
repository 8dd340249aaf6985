"""Measured link bandwidths between local processes (gloo on CPU, NCCL on CUDA).

* p2p: rank 0 sends ``n`` bytes to rank 1, which sends them back; one-way
  seconds = round trip / 2, bandwidth = n / one-way seconds (what eq. H3 divides by).
* allreduce: every rank all-reduces ``n`` bytes; bandwidth = 2 (p-1)/p * n / seconds,
  the ring "bus bandwidth" eq. H4 divides by.
* latency: the same two with one float (4 bytes), ``LATENCY_REPEATS`` times: the one-way p2p
  seconds and the allreduce seconds over its 2 (p-1) ring steps, seconds per message (eq. H19).

Medians over ``repeats`` after ``WARMUP`` untimed rounds per size, bytes/s.  On one host these are
shared-memory / loopback figures, a property of this machine, not of a network.
"""

from __future__ import annotations

import statistics
import time
from typing import Sequence

from ..errors import InputError

from ._torch import require_torch
from .launch import launch
from .provenance import provenance, resolve_device, set_threads

torch = require_torch()

DEFAULT_SIZES = (2**16, 2**20, 2**23)
LATENCY_REPEATS = 200  # tiny messages take microseconds: many repeats for a stable median
# Untimed rounds before each size's timed ones: gloo's first collectives of a size on a fresh group
# run several times slower than its later ones (benchmarks/results/tp_latency.md), so one warm-up
# left the first size measured far above its steady time.
WARMUP = 5


def measure_links(*, processes: int = 2, sizes: Sequence[int] = DEFAULT_SIZES, repeats: int = 5,
                  device: str | None = None, timeout: float = 300.0) -> dict:
    """p2p and allreduce bandwidth (bytes/s) between ``processes`` local processes, per message size.

    Returns
    -------
    dict
        ``{"p2p": [{"bytes", "seconds", "bandwidth"}], "allreduce": [...], "latency": {"bytes",
        "p2p_seconds", "allreduce_seconds", "seconds", "repeats"}, "provenance": {...}}``; p2p is between
        ranks 0 and 1; ``latency.seconds`` is the allreduce's seconds per ring step.

    Examples
    --------
    >>> links = measure_links(sizes=(2**20,), repeats=3, device="cpu")  # doctest: +SKIP
    >>> links["allreduce"][0]["bandwidth"] > 0  # doctest: +SKIP
    True
    """
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 2:
        raise InputError("processes", f"must be an integer >= 2, got {processes!r}")
    if not sizes or any(isinstance(n, bool) or not isinstance(n, int) or n < 4 for n in sizes):
        raise InputError("sizes", f"must be byte counts of at least 4, got {list(sizes)!r}")
    task = {"kind": "links", "sizes": list(sizes), "repeats": repeats, "device": resolve_device(device)}
    result = launch(task, processes, timeout=timeout, threads=1)
    if result.status != "ok" or result.results[0] is None:
        raise RuntimeError(f"link measurement failed ({result.status}): {result.stderr.strip()[-1500:]}")
    return result.results[0]


def links_worker(task: dict, rank: int, world: int) -> dict:
    """Worker side of :func:`measure_links` (process group initialised)."""
    import torch.distributed as dist

    device = task["device"]
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    threads = set_threads(1)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    def timed(buf, repeats):
        """Median one-way p2p and allreduce seconds of ``buf`` over ``repeats`` (after WARMUP rounds)."""
        trips, reduces = [], []
        for r in range(repeats + WARMUP):
            dist.barrier()
            start = time.perf_counter()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            elif rank == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            sync()
            trip = time.perf_counter() - start
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(buf)
            sync()
            reduce = time.perf_counter() - start
            if r >= WARMUP:
                trips.append(trip)
                reduces.append(reduce)
        return statistics.median(trips) / 2, statistics.median(reduces)

    p2p, allreduce = [], []
    for n in task["sizes"]:
        buf = torch.zeros(n // 4, dtype=torch.float32, device=device)
        one_way, seconds = timed(buf, task["repeats"])
        nbytes = buf.numel() * 4
        p2p.append({"bytes": nbytes, "seconds": one_way, "bandwidth": nbytes / one_way})
        allreduce.append({"bytes": nbytes, "seconds": seconds,
                          "bandwidth": 2 * (world - 1) / world * nbytes / seconds})
    one_way, seconds = timed(torch.zeros(1, dtype=torch.float32, device=device), LATENCY_REPEATS)
    latency = {"bytes": 4, "p2p_seconds": one_way, "allreduce_seconds": seconds,
               "seconds": seconds / (2 * (world - 1)), "repeats": LATENCY_REPEATS}
    return {"p2p": p2p, "allreduce": allreduce, "latency": latency,
            "provenance": provenance(device, torch.float32, threads, processes=world, backend=dist.get_backend(),
                                     repeats=task["repeats"])}
