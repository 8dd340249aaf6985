"""Execute a plan for real on local processes and return its run record.

Everything that can be checked is checked before any process starts: the
instance (loader), the plan against it (``check_plan``), the model can be built
(preset or hf_config model, tensor-parallel divisibility), and the process count
against the usable cores.  Then one worker per device of the plan runs (gloo on CPU, NCCL on
CUDA; see :mod:`amp_opt.runtime.pipeline` for what they do and time), with a
timeout; a run never hangs and leaves no process behind.  A plan of several pipelines runs
when the pipelines holding each layer hold it at one tensor-parallel degree.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Callable, Mapping

from ..errors import InputError
from ..model.load import load_instance, load_json, parse_instance
from ..model.costs.pipelines import segments
from ..model.plan import Pipelines, Plan, check_plan, parse_plan

from ._torch import require_torch
from .launch import launch
from .layout import RUNNABLE, RUNNABLE_HINT, pipelines_of, world_of
from .modules import ATTENTION_KERNELS, model_shape, torch_dtype
from .provenance import resolve_device, usable_cores
from .record import run_memory_limit

require_torch()


def _positive(name: str, value, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InputError(name, f"must be an integer >= {low}, got {value!r}")
    return value


def prepare(instance, plan, *, oversubscribe: bool = False, base_dir=None):
    """(document, instance, checked plan, shape): every check done before processes start."""
    if isinstance(instance, (str, Path)):
        document, base_dir = load_json(instance, "instance"), Path(instance).parent
    else:
        document = dict(instance)
    inst = load_instance(document) if base_dir is None else _load_at(document, base_dir)
    plan = check_plan(inst, plan if isinstance(plan, (Plan, Pipelines)) else parse_plan(plan))
    several = isinstance(plan, Pipelines)
    for i, p in enumerate(plan.pipelines if several else (plan,)):
        refuse_unsupported(p, where=f"plan.pipelines[{i}]" if several else "plan")
    if several:
        _one_tp_per_segment(plan)
    pipes = pipelines_of(plan, global_batch=inst.training.global_batch)
    shape = model_shape(document, base_dir=base_dir or ".")
    for i, pipe in enumerate(pipes):
        where = f"plan.pipelines[{i}]" if several else "plan"
        lay = pipe.lay
        for s, tp in enumerate(lay.tp):
            for what, count in (("heads", shape.heads), ("kv_heads", shape.kv_heads), ("ffn", shape.ffn)):
                if count % tp:
                    at = f"{where}.tp" if lay.uniform else f"{where}.tp[{s}]"
                    raise InputError(at, f"tensor-parallel degree {tp} must divide model.{what} ({count})")
            if pipe.plan.get("sequence_parallel") and shape.seq_len % tp:
                raise InputError(f"{where}.sequence_parallel", f"needs every tensor-parallel degree to divide "
                                                               f"model.seq_len ({shape.seq_len}); stage {s} has tp {tp}")
    world, cores = world_of(pipes), usable_cores()
    if world > cores and not oversubscribe:
        raise InputError("plan", f"needs {_world_formula(pipes)} = {world} processes, this machine has {cores} "
                         "usable cores (run --oversubscribe, or oversubscribe=True from Python, runs it anyway: the "
                         "processes then share cores and their times say little)")
    return document, inst, plan, shape


def _world_formula(pipes) -> str:
    if len(pipes) > 1:
        return "the sum over pipelines and stages of tp_s*dp_s"
    return "tp*dp*pp" if pipes[0].lay.uniform else "the sum over stages of tp_s*dp_s"


def _one_tp_per_segment(plan: Pipelines) -> None:
    """The runtime reduces a layer's gradients over the pipelines that hold it piece by piece of the
    finest tensor-parallel sharding among them, so every holder's tp must divide the largest."""
    for a, b, holders in segments([p.partition for p in plan.pipelines]):
        tps = sorted({plan.pipelines[i].tp_at(s) for i, s in holders})
        if any(tps[-1] % t for t in tps):
            raise InputError("plan.pipelines", f"the runtime reduces each layer over the pipelines holding it in pieces "
                                               f"of the largest tp, which the others must divide; layers {a}-{b - 1} "
                                               f"are held at tp {', '.join(map(str, tps))} (evaluate prices such a plan)")


def refuse_unsupported(plan: Plan, *, where: str = "plan") -> None:
    """The runtime runs what :data:`~amp_opt.runtime.layout.RUNNABLE` states: tensor, data and pipeline
    parallelism (per stage, with uneven batch shares) with plain 1F1B, activation recomputation
    (none, selective, full, per stage, the block method), ZeRO stages 0 and 1 and sequence
    parallelism; a plan asking for
    anything else is refused (InputError naming the field, what runs, and how to get a runnable
    plan) rather than run without it.

    Examples
    --------
    >>> refuse_unsupported(parse_plan({"tp": 1, "dp": 1, "pp": 1, "micro_batch": 1, "partition": [0, 4],
    ...                                "zero_stage": 2}))
    Traceback (most recent call last):
    ...
    amp_opt.errors.InputError: plan.zero_stage: the runtime does not run ZeRO stage 2 (it runs 0, 1); ...
    """
    modes = (plan.recompute,) if isinstance(plan.recompute, str) else tuple(plan.recompute)
    asked = {"cp": (plan.cp,), "sequence_parallel": (plan.sequence_parallel,), "recompute": modes,
             "zero_stages": (plan.zero_stage or 0,), "virtual_stages": (plan.virtual_stages,)}
    what = {"cp": (f"{where}.cp", "context parallelism", f"cp {plan.cp}"),
            "sequence_parallel": (f"{where}.sequence_parallel", "sequence parallelism", "true"),
            "recompute": (f"{where}.recompute", "activation recomputation", repr(plan.recompute)),
            "zero_stages": (f"{where}.zero_stage", "ZeRO stage", str(plan.zero_stage)),
            "virtual_stages": (f"{where}.virtual_stages", "interleaved schedule",
                               f"of {plan.virtual_stages} virtual stages")}
    for key, allowed in RUNNABLE.items():
        if any(value not in allowed for value in asked[key]):
            field, name, got = what[key]
            runs = ", ".join(json_value(v) for v in allowed)
            raise InputError(field, f"the runtime does not run {name} {got} (it runs {runs}); {RUNNABLE_HINT}")


def json_value(value) -> str:
    """A setting as the plan's JSON writes it (false, "none", 1)."""
    import json

    return json.dumps(value)


def _load_at(document, base_dir):
    return parse_instance(document, base_dir=Path(base_dir))


def build_run_task(instance, plan, *, iterations: int = 5, warmup: int = 2, device: str | None = None, dtype=None,
                   attention: str = "eager", threads: int | Mapping[str, int] | None = None, seed: int = 0,
                   lr: float = 1e-3, timeout: float = 600.0, oversubscribe: bool = False,
                   memory_limit: int | None = None, dump_grads: str | None = None,
                   fault: Mapping | None = None) -> dict:
    """The checked, JSON-ready worker task of a run (options as in :func:`run_plan`).

    Write it to a file to run across nodes with torchrun
    (``torchrun ... -m amp_opt.runtime.worker --task task.json --out DIR``); rank 0's
    ``DIR/result.0.json`` then holds ``{"record": <run record>}``.

    Examples
    --------
    >>> task = build_run_task("instance.json", {"tp": 1, "dp": 2, "pp": 1, "micro_batch": 1,
    ...                       "partition": [0, 4]}, oversubscribe=True)  # doctest: +SKIP
    """
    document, inst, plan, shape = prepare(instance, plan, oversubscribe=oversubscribe)
    _positive("iterations", iterations)
    _positive("warmup", warmup, 0)
    if memory_limit is not None:
        _positive("memory_limit", memory_limit)
        reserve = inst.training.memory_reserve
        if memory_limit <= reserve:
            raise InputError("memory_limit", f"{memory_limit} bytes leave nothing beyond the instance's "
                                             f"training.memory_reserve ({reserve:.0f} bytes), which counts toward "
                                             "it as toward a device's memory")
    device = resolve_device(device)
    dt = torch_dtype(dtype, shape)
    if attention not in ATTENTION_KERNELS:
        raise InputError("attention", f"must be one of {', '.join(ATTENTION_KERNELS)}, got {attention!r}")
    pipes = pipelines_of(plan, global_batch=inst.training.global_batch)
    if threads is None:
        threads = max(1, usable_cores() // world_of(pipes))
    threads = rank_threads(inst, pipes, threads) if isinstance(threads, Mapping) else _positive("threads", threads)
    return {"kind": "run", "model": asdict(shape), "plan": plan.to_json(), "device": device,
            "dtype": str(dt).replace("torch.", ""), "attention": attention, "threads": threads, "seed": seed,
            "lr": lr, "iterations": iterations, "warmup": warmup, "global_batch": inst.training.global_batch,
            "memory_limit": memory_limit, "memory_reserve": inst.training.memory_reserve,
            "dump_grads": str(dump_grads) if dump_grads else None,
            "fault": dict(fault) if fault else None, "collective_timeout": timeout}


def rank_threads(inst, pipes, threads: Mapping[str, int]) -> list[int]:
    """Torch threads of every rank from its device type (a CPU stand-in for replicas on device
    types of different speeds: each type runs with the threads it was profiled with); ``pipes``
    the run's :func:`~.layout.pipelines_of`."""
    out = []
    for pipe in pipes:
        for rank in range(pipe.lay.world):
            s, r, j = pipe.lay.place(rank)
            out.append(_thread_count(inst, pipe.plan["stages"][s][r][j], threads))
    return out


def _thread_count(inst, device: int, threads: Mapping[str, int]) -> int:
    """The threads of a process on ``device``, by its device type."""
    kind = inst.nodes[int(inst.device_node[device])].device_type
    if kind not in threads:
        raise InputError("threads", f"gives no thread count for device type {kind!r}")
    return _positive(f"threads[{kind!r}]", threads[kind])


def run_plan(instance, plan, *, iterations: int = 5, warmup: int = 2, device: str | None = None, dtype=None,
             attention: str = "eager", threads: int | Mapping[str, int] | None = None, seed: int = 0, lr: float = 1e-3,
             timeout: float = 600.0, oversubscribe: bool = False, memory_limit: int | None = None,
             dump_grads: str | None = None, on_start: Callable | None = None, fault: Mapping | None = None) -> dict:
    """Run ``plan`` for real and return its run record (see :mod:`amp_opt.runtime.record`).

    Parameters
    ----------
    instance : path, or dict
        An instance file or document whose model is a preset or hf_config.
    plan : Plan or dict
        Checked against the instance before anything starts.
    iterations, warmup : measured and discarded training iterations.
    device : "cpu" or "cuda" (default cuda when available).
    dtype : "float32", "bfloat16", "float16", or None (the model's dtype_bytes).
    attention : "eager" or "flash".
    threads : torch threads per process (default: usable cores // processes, at least 1), or a
        mapping device type -> threads of the processes on devices of that type.
    seed : model initialisation and synthetic data.
    lr : Adam learning rate.
    timeout : seconds for the whole run; then every worker is stopped.
    oversubscribe : allow more processes than usable cores.
    memory_limit : bytes of memory each device stands for: a simulated out-of-memory once the
        tracked total (model state, reduction buffer and the instance's memory reserve, then
        saved activations and pipeline buffers) exceeds it (a CPU stand-in for a device's
        memory).  Written into the record as ``memory_limit``, as is a GPU's memory without it.
    dump_grads : folder; each rank saves its first iteration's reduced gradients there.
    on_start : called with the worker pids once started.
    fault : testing hook, see :mod:`amp_opt.runtime.worker`.

    Returns
    -------
    dict
        ``{"plan", "iteration_time", "peak_memory", "measured"}``, or
        ``{"plan", "failed": "oom" | "error", "error"}``; each with ``"memory_limit"`` when
        one applied (``memory_limit``, or the GPUs' memory).

    Raises
    ------
    InputError
        Before any process starts: a bad plan, a model that cannot be built,
        more processes than usable cores.

    Examples
    --------
    >>> record = run_plan("instance.json", {"tp": 1, "dp": 1, "pp": 2, "micro_batch": 1,
    ...                   "partition": [0, 2, 4]})  # doctest: +SKIP
    """
    task = build_run_task(instance, plan, iterations=iterations, warmup=warmup, device=device, dtype=dtype,
                          attention=attention, threads=threads, seed=seed, lr=lr, timeout=timeout,
                          oversubscribe=oversubscribe, memory_limit=memory_limit, dump_grads=dump_grads, fault=fault)
    world = world_of(pipelines_of(task["plan"], global_batch=task["global_batch"]))
    result = launch(task, world, timeout=timeout, on_start=on_start, threads=task["threads"])
    if result.status == "ok" and result.results[0] and "record" in result.results[0]:
        return result.results[0]["record"]
    return failed_record(result, parse_plan(task["plan"]).to_json(), memory_limit=memory_limit, timeout=timeout)


def failed_record(result, plan_json: dict, *, memory_limit: int | None, timeout: float) -> dict:
    """The record of a run that did not finish: ``failed`` "oom" when a rank ran out of memory, else
    "error" (a rank's error, the timeout, or how the workers exited), with the memory limit if one applied."""
    failures = [r for r in result.results if r and r.get("failed")]
    limit = run_memory_limit(memory_limit, failures)
    if any(r["failed"] == "oom" for r in failures):
        oom = next(r for r in failures if r["failed"] == "oom")
        return {"plan": plan_json, "failed": "oom", "error": f"rank {oom['rank']}: {oom['error']}",
                **({"memory_limit": limit} if limit is not None else {})}
    if result.status == "timeout":
        return {"plan": plan_json, "failed": "error", "error": f"timed out after {timeout:g} s"}
    if failures:
        first = failures[0]
        return {"plan": plan_json, "failed": "error", "error": f"rank {first['rank']}: {first['error']}"}
    codes = ", ".join(f"rank {r}: {c}" for r, c in enumerate(result.returncodes) if c)
    tail = result.stderr.strip().splitlines()[-1:] or [""]
    return {"plan": plan_json, "failed": "error", "error": f"worker exited ({codes}) {tail[0]}".strip()}
