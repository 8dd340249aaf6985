"""Measure forward+backward seconds and saved activations of every layer, per micro-batch size.

The whole model is built once; every round times each layer once at each
micro-batch size (round-robin over sizes and layers, so slow drift of a loaded
machine hits all of them alike): forward on a fixed input, then backward from a
fixed output gradient (the loss itself for the head), wall-clock seconds
(``time.perf_counter``; CUDA synchronised).  ``warmup`` rounds are discarded,
``repeats`` rounds kept: the median (or, with ``statistic``, the first quartile or
the minimum) is the layer time, min / quartiles / median / max its spread.  The bytes kept for
backward are taken in the first warm-up round, untimed, which runs whatever ``warmup`` is
(so 0 and 1 both discard no timed round): on CPU the tensors
autograd saves (:mod:`amp_opt.runtime.memory`), on CUDA the allocator's growth
over the forward (which includes the layer's output).

tp > 1 runs ``tp`` local processes (gloo on CPU) with Megatron tensor-parallel
blocks; each round's time is the slowest rank's.  Embedding and head are not
vocab-parallel in the runtime: every rank runs them whole (a note says so).
"""

from __future__ import annotations

import gc
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import InputError
from ..model.presets import ModelShape

from ._torch import require_torch
from .launch import launch
from .memory import SavedTensorTracker
from .modules import Head, TensorParallel, build_layer, build_model, layer_names, model_shape, torch_dtype
from .provenance import provenance, resolve_device, set_threads

torch = require_torch()
from torch import nn  # noqa: E402

DEFAULT_MICRO_BATCHES = (1, 2, 4, 8)
REPLICATED_NOTE = "embedding and head are replicated on every tensor-parallel rank (not vocab-parallel)"


def is_oom(exc: BaseException) -> bool:
    """Whether an exception means the device ran out of memory."""
    return isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


class Timer:
    """Accumulates seconds reported with ``add``."""

    def __init__(self):
        self.total = 0.0

    def add(self, seconds: float) -> None:
        self.total += seconds


@dataclass(frozen=True)
class ProfileResult:
    """One measured profile: every layer at one (device type, tp, micro-batch).

    Times in seconds for one micro-batch (forward + backward), memory in bytes.
    ``oom`` results have no times.
    """

    device_type: str
    tp: int
    micro_batch: int
    layer_names: tuple[str, ...]
    layer_times: tuple[float, ...] | None  # medians
    spread: Mapping[str, tuple[float, ...]] | None  # "min", "q1", "q3", "max" per layer
    activation_memory_bytes: tuple[int, ...] | None
    tp_comm_seconds: tuple[float, ...] | None  # median all-reduce seconds inside each layer (tp > 1)
    oom: bool = False
    error: str | None = None
    provenance: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The ``profiles`` entry, with the measured extras beside the schema's fields."""
        out: dict[str, Any] = {"device_type": self.device_type, "tp": self.tp, "micro_batch": self.micro_batch}
        if self.oom:
            out.update(oom=True, error=self.error)
        else:
            out["layer_times"] = list(self.layer_times)
            out["layer_names"] = list(self.layer_names)
            out["spread"] = {k: list(v) for k, v in self.spread.items()}
            out["activation_memory_bytes"] = list(self.activation_memory_bytes)
            if self.tp_comm_seconds is not None:
                out["tp_comm_seconds"] = list(self.tp_comm_seconds)
        out["provenance"] = dict(self.provenance)
        if self.notes:
            out["notes"] = list(self.notes)
        return out


# ---------------------------------------------------------------- measuring, in this process

def _inputs(shape: ModelShape, b: int, dtype, device, seed: int):
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, shape.vocab, (b, shape.seq_len), generator=gen).to(device)
    hidden = torch.randn(b, shape.seq_len, shape.hidden, generator=gen).to(dtype=dtype, device=device)
    grad = (torch.randn(b, shape.seq_len, shape.hidden, generator=gen) * 1e-2).to(dtype=dtype, device=device)
    return tokens, hidden, grad


def _step(module, index, tokens, hidden, grad, device, tracker=None):
    """Forward + backward of one layer; returns (seconds, saved bytes or None)."""
    if device == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
    start = time.perf_counter()
    x = tokens if index == 0 else hidden.detach().requires_grad_()
    if tracker is not None:
        with tracker:
            out = module(x, tokens) if isinstance(module, Head) else module(x)
        saved = tracker.live
    else:
        out = module(x, tokens) if isinstance(module, Head) else module(x)
        saved = None
    if device == "cuda":
        saved = torch.cuda.memory_allocated() - before if tracker is not None else None
    if isinstance(module, Head):
        out.backward()
    else:
        out.backward(grad)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, saved


def _oom_result(base, names, error: str) -> ProfileResult:
    return ProfileResult(layer_names=names or (), layer_times=None, spread=None, activation_memory_bytes=None,
                         tp_comm_seconds=None, oom=True, error=error, **base)


STATISTICS = {"median": 50, "q1": 25, "min": 0}  # the percentile of the kept rounds written as layer_times


def _summaries(times: np.ndarray, statistic: str = "median"):
    q = np.percentile(times, [0, 25, 50, 75, 100], axis=0)
    spread = {"min": tuple(q[0]), "q1": tuple(q[1]), "median": tuple(q[2]), "q3": tuple(q[3]), "max": tuple(q[4])}
    kept = q[{"min": 0, "q1": 1, "median": 2}[statistic]]
    return tuple(float(t) for t in kept), {k: tuple(float(x) for x in v) for k, v in spread.items()}


@dataclass
class _Sizes:
    """The micro-batch sizes of one profiling pass: those still running (``alive``), their inputs and
    saved bytes, and those that ran out of memory (``failed``: size -> error)."""

    sizes: tuple
    device: str
    failed: dict = field(default_factory=dict)
    inputs: dict = field(default_factory=dict)
    saved: dict = field(default_factory=dict)
    alive: list = field(default_factory=list)

    def fail(self, b: int, exc: BaseException) -> None:
        """Record size b, and every larger one, as out of memory (any other error is raised)."""
        if not is_oom(exc):
            raise exc
        self.failed[b] = str(exc).splitlines()[0][:300]
        for later in self.sizes:
            if later > b and later not in self.failed:
                self.failed[later] = f"not run: micro_batch {b} already ran out of memory"
        self.alive[:] = [x for x in self.alive if x not in self.failed]
        self.inputs.pop(b, None)
        gc.collect()
        if self.device == "cuda":
            torch.cuda.empty_cache()


def _memory_pass(run: _Sizes, model, modules, shape, *, dtype, memory_limit, seed) -> None:
    """The untimed first warm-up round, size by size in increasing order: each layer's saved bytes."""
    for b in run.sizes:
        if b in run.failed:
            continue
        try:
            run.inputs[b] = _inputs(shape, b, dtype, run.device, seed)
            row = []
            for i, module in enumerate(modules):
                tracker = SavedTensorTracker(exclude=[model], limit=memory_limit)
                row.append(_step(module, i, *run.inputs[b], run.device, tracker)[1])
            run.saved[b] = row
            run.alive.append(b)
        except Exception as exc:  # noqa: BLE001 - only out-of-memory is recorded, the rest re-raised
            run.fail(b, exc)


def _timed_rounds(run: _Sizes, modules, timers, *, warmup: int, repeats: int) -> tuple[dict, dict]:
    """(times, tp all-reduce seconds) per size: per kept round, each layer's; every round times every
    layer once at every size still running."""
    times = {b: [] for b in run.alive}
    comm = {b: [] for b in run.alive}
    skip = max(warmup - 1, 0)
    for r in range(skip + repeats):
        for b in list(run.alive):
            try:
                row, comm_row = [], []
                for i, module in enumerate(modules):
                    before = timers[i].total if timers else 0.0
                    row.append(_step(module, i, *run.inputs[b], run.device)[0])
                    comm_row.append(timers[i].total - before if timers else 0.0)
            except Exception as exc:  # noqa: BLE001
                run.fail(b, exc)
                continue
            if r >= skip:
                times[b].append(row)
                comm[b].append(comm_row)
    return times, comm


def _profile_sizes(shape, sizes, *, device, device_type, dtype, attention, warmup, repeats, memory_limit,
                   seed, tp: TensorParallel, prov, reduce_max=None, statistic: str = "median") -> list[ProfileResult]:
    """Profile every size in this process (rank of a tp group when tp.size > 1).

    One model serves every size.  First, size by size in increasing order, the untimed
    memory pass (the first warm-up round); a size that runs out of memory and every
    larger one are recorded as such.  Then every round times every layer once at every
    size still running, so that a machine whose load drifts slows all sizes alike.
    """
    notes = (REPLICATED_NOTE,) if tp.size > 1 else ()
    timers = [Timer() for _ in range(shape.layers + 2)] if tp.size > 1 else None
    model = (_with_timers(shape, attention, dtype, device, seed, tp, timers) if timers else
             build_model(shape, attention=attention, dtype=dtype, device=device, seed=seed))
    names = tuple(model.keys())
    modules = list(model.values())
    run = _Sizes(tuple(sizes), device)
    try:
        _memory_pass(run, model, modules, shape, dtype=dtype, memory_limit=memory_limit, seed=seed)
        times, comm = _timed_rounds(run, modules, timers, warmup=warmup, repeats=repeats)
    finally:
        del model, modules
        run.inputs.clear()
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    results = []
    for b in sizes:
        base = dict(device_type=device_type, tp=tp.size, micro_batch=b, provenance=prov, notes=notes)
        if b in run.failed:
            results.append(_oom_result(base, names, run.failed[b]))
            continue
        measured = np.array(times[b]) if reduce_max is None else reduce_max(np.array(times[b]))
        medians, spread = _summaries(measured, statistic)
        comm_medians = tuple(float(c) for c in np.median(np.array(comm[b]), axis=0)) if timers else None
        results.append(ProfileResult(layer_names=names, layer_times=medians, spread=spread,
                                     activation_memory_bytes=tuple(int(x) for x in run.saved[b]),
                                     tp_comm_seconds=comm_medians, **base))
    return results


def _with_timers(shape, attention, dtype, device, seed, tp, timers):
    """The model with one all-reduce timer per layer (each block gets its own tp context)."""
    out = nn.ModuleDict()
    for i, name in enumerate(layer_names(shape)):
        ctx = TensorParallel(tp.size, tp.rank, tp.group, timers[i])
        word = out["embedding"].word if (name == "head" and shape.tied_embeddings) else None
        out[name] = build_layer(shape, i, attention=attention, dtype=dtype, device=device, seed=seed, tp=ctx,
                                word=word)
    return out


# ---------------------------------------------------------------- the public entry points

def _check_sizes(micro_batches) -> tuple[int, ...]:
    sizes = tuple(micro_batches)
    if not sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in sizes):
        raise InputError("micro_batches", f"must be positive integers, got {list(sizes)!r}")
    return tuple(sorted(set(sizes)))


def profile_model(model, *, micro_batches: Sequence[int] = DEFAULT_MICRO_BATCHES, device: str | None = None,
                  device_type: str | None = None, dtype=None, attention: str = "eager", warmup: int = 2,
                  repeats: int = 5, threads: int | None = None, tp: int = 1, seed: int = 0,
                  memory_limit: int | None = None, timeout: float = 1800.0,
                  statistic: str = "median") -> tuple[ProfileResult, ...]:
    """Forward+backward seconds and saved activation bytes of every layer, per micro-batch size.

    Parameters
    ----------
    model : ModelShape or dict
        A model spec or instance document with a preset / hf_config model.
    micro_batches : sizes to measure (samples per micro-batch).
    device : "cpu" or "cuda"; default cuda when available.
    device_type : name for the profile entries (default: the device's name).
    dtype : "float32", "bfloat16", "float16" or None (the model's dtype_bytes).
    attention : "eager" or "flash".
    warmup, repeats : rounds discarded (>= 0; the untimed memory round counts as the first) / kept
        (each round times every layer once).
    threads : torch intra-op threads per process (default: usable cores / tp).
    tp : tensor-parallel degree; > 1 runs tp local processes (gloo on CPU, NCCL on CUDA).
    memory_limit : bytes of saved activations one layer may keep; beyond it the size is
        recorded as out of memory (a CPU stand-in for a device's capacity).
    timeout : seconds for the tp > 1 processes.
    statistic : "median" (default), "q1" or "min": what of the kept rounds becomes a layer's
        time.  Interference only ever adds time, so on a shared machine whose load comes
        and goes the first quartile or the minimum is the device's own speed, where the
        median may land in either mode; the spread holds all of them.

    Returns
    -------
    tuple of ProfileResult, one per size (``oom=True`` for sizes that ran out of memory).

    Examples
    --------
    >>> spec = {"preset": "gpt", "hidden": 64, "layers": 2, "heads": 4, "seq_len": 16, "vocab": 100}
    >>> [r.micro_batch for r in profile_model(spec, micro_batches=(1, 2), device="cpu", repeats=3)]
    [1, 2]
    """
    shape = model_shape(model)
    sizes = _check_sizes(micro_batches)
    device = resolve_device(device)
    torch_dtype(dtype, shape)  # validate before any work
    if statistic not in STATISTICS:
        raise InputError("statistic", f"must be one of {', '.join(STATISTICS)}, got {statistic!r}")
    for name, value, low in (("warmup", warmup, 0), ("repeats", repeats, 1), ("tp", tp, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InputError(name, f"must be an integer >= {low}, got {value!r}")
    if tp > 1:
        return _profile_tp(shape, sizes, device=device, device_type=device_type, dtype=dtype, attention=attention,
                           warmup=warmup, repeats=repeats, threads=threads, tp=tp, seed=seed,
                           memory_limit=memory_limit, timeout=timeout, statistic=statistic)
    threads = set_threads(threads)
    dt = torch_dtype(dtype, shape)
    prov = provenance(device, dt, threads, attention=attention, warmup=warmup, repeats=repeats, processes=1,
                      statistic=statistic)
    return tuple(_profile_sizes(shape, sizes, device=device, device_type=device_type or prov["device"], dtype=dt,
                                attention=attention, warmup=warmup, repeats=repeats, memory_limit=memory_limit,
                                seed=seed, tp=TensorParallel(), prov=prov, statistic=statistic))


def _profile_tp(shape, sizes, *, device, device_type, dtype, attention, warmup, repeats, threads, tp, seed,
                memory_limit, timeout, statistic="median") -> tuple[ProfileResult, ...]:
    from .provenance import usable_cores

    if threads is None:
        threads = max(1, usable_cores() // tp)
    task = {"kind": "profile", "model": asdict(shape), "sizes": list(sizes), "device": device,
            "device_type": device_type, "dtype": str(torch_dtype(dtype, shape)).replace("torch.", ""),
            "attention": attention, "warmup": warmup, "repeats": repeats, "threads": threads, "seed": seed,
            "memory_limit": memory_limit, "statistic": statistic}
    result = launch(task, tp, timeout=timeout, threads=threads)
    if result.status != "ok" or result.results[0] is None:
        raise RuntimeError(f"tensor-parallel profiling failed ({result.status}, exit codes "
                           f"{list(result.returncodes)}): {result.stderr.strip()[-1500:]}")
    out = []
    for entry in result.results[0]["profiles"]:
        spread = entry.pop("spread", None)
        out.append(ProfileResult(**{**entry, "spread": spread}))
    return tuple(out)


def profile_worker(task: dict, rank: int, world: int) -> dict:
    """Worker side of tp > 1 profiling (process group already initialised)."""
    import torch.distributed as dist

    shape = ModelShape(**task["model"])
    device = task["device"]
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    threads = set_threads(task["threads"])
    dtype = torch_dtype(task["dtype"])
    prov = provenance(device, dtype, threads, attention=task["attention"], warmup=task["warmup"],
                      repeats=task["repeats"], processes=world, backend=dist.get_backend(),
                      statistic=task.get("statistic", "median"))

    def reduce_max(times):
        t = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.numpy()

    results = _profile_sizes(shape, task["sizes"], device=device, device_type=task["device_type"] or prov["device"],
                             dtype=dtype, attention=task["attention"], warmup=task["warmup"],
                             repeats=task["repeats"], memory_limit=task["memory_limit"], seed=task["seed"],
                             tp=TensorParallel(world, rank, None), prov=prov, reduce_max=reduce_max,
                             statistic=task.get("statistic", "median"))
    return {"profiles": [
        {f: (dict(getattr(r, f)) if f in ("spread", "provenance") and getattr(r, f) is not None else getattr(r, f))
         for f in ProfileResult.__dataclass_fields__} for r in results]}
