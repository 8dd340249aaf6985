"""``profile``: measure every layer of the instance's model on this machine and write the profiles.

Builds the model's layers as PyTorch modules (:mod:`amp_opt.runtime`), times
forward+backward per layer at each micro-batch size (warm-up, repeats, the median
kept and the spread written beside it), takes the bytes each layer keeps for
backward, and writes a copy of the instance whose ``profiles`` hold them for one
device type, with provenance.  Sizes that run out of memory are listed under
``measurements.out_of_memory``.  ``--links`` also measures allreduce and p2p
between local processes and writes the allreduce bandwidth and the seconds per
message of a tiny allreduce as the intra-node bandwidth and latency of that device
type's nodes (``formulations/hetero.md`` H4, H19).  A device type without a memory
bandwidth gets the one its measured Adam step runs at, which prices the optimizer step (H15).  ``--runnable`` restricts the search to the plans
``python -m amp_opt run`` executes.

The copy is made solvable as it stands (:func:`amp_opt.model.profile_instance.profiled_instance`,
where the measurements become an instance): each change is listed under ``measurements.notes``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import InputError
from ..model.load import load_instance, load_json, parse_instance
from ..runtime.layout import RUNNABLE
from ..model.profile_instance import profiled_instance
from .common import add_torch_options, positive_int, write_json_document



def _sizes(text: str) -> tuple[int, ...]:
    import argparse

    try:
        sizes = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return sizes


def add_arguments(p) -> None:
    """The options of the command."""
    p.add_argument("instance", help="instance JSON file (model given as a preset or a Hugging Face config)")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="where to write the profiled instance")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    p.add_argument("--device-type", default=None, metavar="NAME",
                   help="the instance's device type the profiles are for (default: its only one)")
    p.add_argument("--micro-batches", type=_sizes, default=(1, 2, 4, 8), metavar="1,2,4,8",
                   help="micro-batch sizes to measure (default 1,2,4,8)")
    p.add_argument("--tp", type=_sizes, default=(1,), metavar="1,2",
                   help="tensor-parallel degrees; tp > 1 runs tp local processes (default 1)")
    p.add_argument("--warmup", type=int, default=2,
                   help="rounds discarded, the untimed first round that measures memory counting as one "
                        "(0 or 1: every timed round is kept; default 2)")
    p.add_argument("--repeats", type=positive_int, default=5, help="rounds kept; the median is written (default 5)")
    p.add_argument("--statistic", choices=("median", "q1", "min"), default="median",
                   help="what of the repeats becomes a layer's time (default median; q1 or min on a shared "
                        "machine whose load comes and goes: interference only adds time)")
    add_torch_options(p)
    p.add_argument("--memory-limit", type=positive_int, default=None, metavar="BYTES",
                   help="bytes one layer may keep for backward before the size counts as out of memory "
                        "(a CPU stand-in for a device's capacity)")
    p.add_argument("--links", action="store_true",
                   help="also measure allreduce and p2p between local processes; the allreduce bandwidth "
                        "and a 4-byte allreduce's seconds per ring step become the intra-node bandwidth "
                        "and latency of the device type's nodes")
    p.add_argument("--runnable", action="store_true",
                   help="restrict the written instance's search to plans run executes (ZeRO stage 0 or 1, no "
                        "context parallelism, no interleaving), for the profile -> solve -> run loop")
    p.add_argument("--timeout", type=positive_int, default=1800, metavar="S",
                   help="seconds for the tensor-parallel or link processes (default 1800)")


def _device_type(instance, name: str | None) -> str:
    used = sorted({n.device_type for n in instance.nodes})
    if name is None:
        if len(used) != 1:
            raise InputError("--device-type", f"the instance has device types {', '.join(used)}: name the one "
                                              "this machine's device stands for")
        return used[0]
    if name not in used:
        raise InputError("--device-type", f"{name!r} is not a device type of the instance's nodes "
                                          f"({', '.join(used)})")
    return name


def _check_tp(tp_degrees, shape, name: str, per_node: int, available: int, device: str) -> None:
    """Every tensor-parallel degree fits a node, this machine's processes and the model's sizes."""
    for tp in tp_degrees:
        if tp > per_node:
            raise InputError("--tp", f"tp {tp} is more than the {per_node} devices of a {name} node")
        if tp > 1 and tp > available:
            what = "usable cores" if device == "cpu" else "GPUs"
            raise InputError("--tp", f"tp {tp} needs {tp} processes, this machine has {available} {what}")
        for what, count in (("heads", shape.heads), ("kv_heads", shape.kv_heads), ("ffn", shape.ffn)):
            if count % tp:
                raise InputError("--tp", f"tensor-parallel degree {tp} must divide model.{what} ({count})")


def run(args) -> int:
    from ..runtime import require_torch

    torch = require_torch()
    from ..runtime.modules import model_shape, torch_dtype
    from ..runtime.merge import merge_profiles
    from ..runtime.profile import profile_model
    from ..runtime.provenance import catalog_fields, check_local, resolve_device, usable_cores

    if args.warmup < 0:
        raise InputError("--warmup", f"must be 0 or more, got {args.warmup}")
    document = load_json(args.instance, "instance")
    instance = load_instance(args.instance)
    base_dir = Path(args.instance).parent
    shape = model_shape(document, base_dir=base_dir)
    device = resolve_device(args.device)
    name = _device_type(instance, args.device_type)
    check_local([name], device, catalog_fields(document))
    per_node = max(n.devices for n in instance.nodes if n.device_type == name)
    available = usable_cores() if device == "cpu" else torch.cuda.device_count()
    _check_tp(args.tp, shape, name, per_node, available, device)
    unusable = [b for b in args.micro_batches if b > instance.training.global_batch]
    if unusable:
        print(f"amp-opt: warning: --micro-batches {','.join(map(str, unusable))}: more than the global batch of "
              f"{instance.training.global_batch}, so no plan can use {'them' if len(unusable) > 1 else 'it'} "
              "(profiled anyway)", file=sys.stderr)
    dtype = torch_dtype(args.dtype, shape)
    threads = args.threads
    if threads is None and device == "cpu":
        threads = max(1, usable_cores() // per_node)
    results = []
    for tp in sorted(set(args.tp)):
        results += profile_model(shape, micro_batches=args.micro_batches, device=device, device_type=name,
                                 dtype=dtype, attention=args.attention or shape.attention, warmup=args.warmup,
                                 repeats=args.repeats, threads=threads, tp=tp, memory_limit=args.memory_limit,
                                 timeout=float(args.timeout), statistic=args.statistic)
    links, processes, notes = None, min(per_node, available), []
    if args.links and processes < 2:
        notes.append(f"links not measured: a {name} node has {per_node} device(s) and this machine runs {available} "
                     "process(es) at once; a link needs two")
    elif args.links:
        from ..runtime.links import measure_links

        links = measure_links(processes=processes, device=device, timeout=float(args.timeout))
    optimizer = None
    if instance.device_types[name].memory_bandwidth is None:  # H15 unpriced: measure the step it prices
        from ..runtime.optimizer import measure_optimizer_step

        optimizer = measure_optimizer_step(shape, bytes_per_param=_step_bytes(document, instance, dtype.itemsize),
                                           device=device, dtype=dtype, attention=args.attention or shape.attention,
                                           threads=threads)
    out, notes = profiled_instance(merge_profiles(document, results, extras=True), instance, results,
                                   device_type=name, device=device, dtype_bytes=dtype.itemsize,
                                   runnable=RUNNABLE if args.runnable else None, links=links, link_processes=processes,
                                   notes=notes, optimizer=optimizer)
    parse_instance(out, base_dir=base_dir)  # the written instance loads as it stands
    write_json_document(out, args.output, source=args.instance)
    _print_summary(results, shape, name, threads)
    for note in notes:
        print(f"note: {note}")
    print(f"wrote {args.output}")
    return 0


def _step_bytes(document: dict, instance, dtype_bytes: int) -> float:
    """Bytes per parameter H15 counts for the step (2o + g + w): the instance's, or, where it does not
    state them, the runtime's (weights, gradients and two Adam moments of ``dtype_bytes``, as written)."""
    if "model_state_bytes_per_param" in document.get("training", {}):
        tr = instance.training
        return 2 * tr.optimizer_bytes + tr.gradient_bytes + tr.weight_bytes
    return 2 * (2 * dtype_bytes) + 2 * dtype_bytes


def _print_summary(results, shape, name: str, threads) -> None:
    print(f"profiled {shape.name or shape.preset} ({shape.layers} blocks, hidden {shape.hidden}, seq {shape.seq_len}) "
          f"as device type {name!r}" + (f", {threads} thread(s) per process" if threads else ""))
    for r in results:
        if r.oom:
            print(f"  tp={r.tp} micro_batch={r.micro_batch}: out of memory ({r.error})")
            continue
        total = sum(r.layer_times)
        blocks = [t for n, t in zip(r.layer_names, r.layer_times) if n.startswith("layer_")]
        spread = [(hi - lo) for n, lo, hi in zip(r.layer_names, r.spread["min"], r.spread["max"])
                  if n.startswith("layer_")]
        line = (f"  tp={r.tp} micro_batch={r.micro_batch}: {total * 1e3:.2f} ms per micro-batch "
                f"(embedding {r.layer_times[0] * 1e3:.2f}, blocks ")
        if blocks:
            line += f"{min(blocks) * 1e3:.2f}..{max(blocks) * 1e3:.2f} (spread up to {max(spread) * 1e3:.2f})"
        line += f", head {r.layer_times[-1] * 1e3:.2f} ms); saved for backward {sum(r.activation_memory_bytes)} B"
        print(line)
