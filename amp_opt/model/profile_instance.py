"""An instance document from measured profiles, made solvable as it stands (``profile`` writes it).

The measuring is the runtime's (:mod:`amp_opt.runtime.profile`, :mod:`amp_opt.runtime.links`, which
need PyTorch); what the measurements change in the instance is here, where a library user can
reach it without them: the profiles merged into the document (``merged``), then

* when the instance does not say how its training stores model state, the runtime's own
  (weights, gradients and two Adam moments in the run's dtype, :func:`runtime_training`); on CPU
  a memory reserve of 0;
* with ``runnable`` (the search settings ``python -m amp_opt run`` executes,
  :data:`amp_opt.runtime.layout.RUNNABLE`), the search restricted to them;
* the sizes that ran out of memory listed under ``measurements.out_of_memory``;
* with measured ``links``, their allreduce bandwidth as the intra-node bandwidth of the device type's nodes,
  and (when measured) the allreduce's seconds per ring step as their intra-node latency (H19), the
  bandwidth then taken net of the latency of the measured allreduce's 2 (p-1) steps;
* with a measured optimizer step (``optimizer``: bytes/s), that as the device type's ``memory_bandwidth``
  (H15) unless the document states one.

Tensor-parallel degrees and micro-batch sizes not profiled stay in the search: the model derives
their times from the profiled ones (``formulations/hetero.md``, "Estimates anchored on measurements").

Each change is listed under ``measurements.notes`` and returned.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Sequence



def runtime_training(dtype_bytes: int) -> dict:
    """What the runtime stores per parameter: weights, gradients and Adam's two moments in the run's
    dtype, and with data-parallel replicas the flat copy of the gradients it reduces (:mod:`amp_opt.runtime.zero`)."""
    return {"model_state_bytes_per_param": {"weights": dtype_bytes, "gradients": dtype_bytes,
                                            "optimizer": 2 * dtype_bytes},
            "gradient_allreduce_bytes_per_param": dtype_bytes, "gradient_buffer_bytes_per_param": dtype_bytes}


def profiled_instance(merged: dict, instance, results: Sequence, *, device_type: str, device: str, dtype_bytes: int,
                      runnable: dict | None = None, links: dict | None = None, link_processes: int = 0,
                      notes: Sequence[str] = (), optimizer: dict | None = None) -> tuple[dict[str, Any], list[str]]:
    """The instance document ``merged`` (the profiles of ``results`` merged into the instance's
    document; ``instance`` is that document as loaded before) made solvable, and the notes on
    what changed (module doc).  ``results`` are the runtime's profile results (``tp``,
    ``micro_batch``, ``device_type``, ``oom``, ``error``); ``notes`` are the caller's, kept
    after the notes on the training and the search.

    Examples
    --------
    >>> runtime_training(2)["model_state_bytes_per_param"]
    {'weights': 2, 'gradients': 2, 'optimizer': 4}
    """
    out = copy.deepcopy(merged)
    changed = _make_solvable(out, device, dtype_bytes)
    if runnable:
        out.setdefault("search", {}).update(runnable)
        changed.append("search restricted to what python -m amp_opt run executes: " + json.dumps(runnable))
    measurements = copy.deepcopy(out.get("measurements", {}))
    _out_of_memory(measurements, results)
    changed += list(notes)
    if links is not None:
        changed += _with_links(out, measurements, device_type, links, link_processes)
    if optimizer is not None:
        changed += _with_optimizer(out, measurements, device_type, optimizer)
    if changed:
        measurements["notes"] = list(dict.fromkeys(measurements.get("notes", []) + changed))
    if measurements:
        out["measurements"] = measurements
    return out, changed


def _out_of_memory(measurements: dict, results: Sequence) -> None:
    """The sizes that ran out of memory, replacing what the document said of the sizes measured now."""
    ooms = [{"device_type": r.device_type, "tp": r.tp, "micro_batch": r.micro_batch, "error": r.error}
            for r in results if r.oom]
    keys = {(o["device_type"], o["tp"], o["micro_batch"]) for o in ooms}
    measured = {(r.device_type, r.tp, r.micro_batch) for r in results if not r.oom}
    kept = [o for o in measurements.get("out_of_memory", [])
            if (o["device_type"], o["tp"], o["micro_batch"]) not in keys | measured]
    if kept or ooms:
        measurements["out_of_memory"] = kept + ooms


def _make_solvable(out: dict, device: str, dtype_bytes: int) -> list[str]:
    """Fill in what the runtime does where the instance is silent (module doc)."""
    notes = []
    training = out.setdefault("training", {})
    if "model_state_bytes_per_param" not in training and "gradient_allreduce_bytes_per_param" not in training:
        training.update(runtime_training(dtype_bytes))
        notes.append(f"training.model_state_bytes_per_param, gradient_allreduce_bytes_per_param and "
                     f"gradient_buffer_bytes_per_param set to the runtime's: weights, gradients and two Adam "
                     f"moments of {dtype_bytes} bytes each, and with replicas a flat copy of the gradients to reduce")
    if device == "cpu" and "memory_reserve" not in training:
        training["memory_reserve"] = 0
        notes.append("training.memory_reserve set to 0: a CPU process has no CUDA context to reserve for")
    return notes


def _with_links(out: dict, measurements: dict, name: str, links: dict, processes: int) -> list[str]:
    """The measured links into ``measurements``, their allreduce bandwidth and latency into the nodes of
    ``name`` (eq. H4, H19): t = 2 (p-1) alpha + 2 (p-1)/p n / B at the largest size n, B net of alpha."""
    measurements["links"] = {name: links}
    largest = links["allreduce"][-1]
    latency = links.get("latency", {}).get("seconds")
    steps = 2 * (processes - 1)
    net = largest["seconds"] - steps * latency if latency is not None else 0.0
    bandwidth = largest["bandwidth"] * largest["seconds"] / net if net > 0 else largest["bandwidth"]
    for node in out["nodes"]:
        if node["device_type"] == name:
            node["intra_bandwidth"] = bandwidth
            if latency is not None:
                node["intra_latency"] = latency
    notes = [f"intra_bandwidth of the {name} nodes set to the measured allreduce bus bandwidth "
             f"({bandwidth / 1e9:.3g} GB/s at {largest['bytes']} bytes over {processes} processes"
             + (", net of its steps' latency" if latency is not None and net > 0 else "") + "); "
             "inter-node links cannot be measured on one machine and were left as given"]
    if latency is not None:
        lat = links["latency"]
        notes.append(f"intra_latency of the {name} nodes set to the measured seconds per message "
                     f"({latency * 1e6:.1f} us: a {lat['bytes']}-byte allreduce over {processes} processes took "
                     f"{lat['allreduce_seconds'] * 1e6:.1f} us for its {steps} ring steps, median of {lat['repeats']}; "
                     f"one-way p2p {lat['p2p_seconds'] * 1e6:.1f} us)")
    return notes


def _with_optimizer(out: dict, measurements: dict, name: str, step: dict) -> list[str]:
    """The measured optimizer step into ``measurements`` and, unless the document states one, its bytes/s
    as the ``memory_bandwidth`` of device type ``name`` (eq. H15, which divides by it)."""
    measurements["optimizer"] = {name: step}
    types = out.setdefault("device_types", [])
    entry = next((t for t in types if t.get("name") == name), None)
    if entry is None:
        entry = {"name": name}
        types.append(entry)
    if "memory_bandwidth" in entry:
        return [f"optimizer step measured ({step['bandwidth'] / 1e9:.3g} GB/s); device type {name}'s "
                "memory_bandwidth is stated and was kept"]
    entry["memory_bandwidth"] = step["bandwidth"]
    return [f"memory_bandwidth of device type {name} set to the measured optimizer step's "
            f"({step['bandwidth'] / 1e9:.3g} GB/s: an Adam step over {step['parameters']} parameters took "
            f"{step['seconds'] * 1e3:.2f} ms, median of {step['repeats']}, at {step['bytes_per_param']:g} bytes per "
            "parameter, H15)"]
