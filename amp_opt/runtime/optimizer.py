"""The optimizer step measured: the runtime's Adam over the whole model's parameters (eq. H15).

H15 prices a stage's step as params_s x (2o + g + w) / B, a pass over the optimizer states at the
device's memory bandwidth B.  A CPU has no datasheet B, so ``profile`` measures the step the
runtime takes (``torch.optim.Adam``, as :mod:`amp_opt.runtime.pipeline` builds it, on the model's
own parameter tensors with gradients set) and writes B = N (2o + g + w) / seconds: the bandwidth
at which H15 reproduces the measured step for the whole model's N parameters.  Median over
``repeats`` after two warm-up steps (the first allocates Adam's moments), in this process, with
``threads`` intra-op threads (the runs' per-process count).
"""

from __future__ import annotations

import statistics
import time

from ._torch import require_torch
from .modules import build_model, parameter_count, torch_dtype
from .provenance import set_threads

torch = require_torch()

WARMUP = 2  # steps before timing: the first allocates the moments


def measure_optimizer_step(shape, *, bytes_per_param: float, device: str = "cpu", dtype=None, attention: str = "eager",
                           threads: int | None = None, repeats: int = 20, seed: int = 0) -> dict:
    """Seconds of one Adam step over the model's parameters and the bytes/s H15 divides by.

    Returns
    -------
    dict
        ``{"parameters", "seconds", "bytes_per_param", "bandwidth", "repeats", "threads"}``: seconds the
        median step, bandwidth = parameters x bytes_per_param / seconds.
    """
    before = torch.get_num_threads()
    used = set_threads(threads)
    try:
        layers = build_model(shape, attention=attention, dtype=torch_dtype(dtype, shape), device=device, seed=seed)
        params = list({id(p): p for p in layers.parameters()}.values())
        for p in params:
            p.grad = torch.randn_like(p)
        opt = torch.optim.Adam(params, lr=1e-4)
        times = []
        for r in range(WARMUP + repeats):
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            opt.step()
            if device == "cuda":
                torch.cuda.synchronize()
            if r >= WARMUP:
                times.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(before)
    n = parameter_count(layers)
    seconds = statistics.median(times)
    return {"parameters": n, "seconds": seconds, "bytes_per_param": float(bytes_per_param),
            "bandwidth": n * bytes_per_param / seconds, "repeats": repeats, "threads": used}
