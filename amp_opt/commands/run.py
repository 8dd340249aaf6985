"""``run``: execute a plan for real on local processes and put the measurements next to the prediction.

The plan runs on one local process per device it uses (:func:`amp_opt.runtime.run_plan`:
gloo on CPU, NCCL on GPUs; 1F1B pipeline, data-parallel gradient allreduce, Megatron tensor and
sequence parallelism, full or selective activation recomputation, ZeRO-1; each stage with its
own tp and dp and each replica with its share of every micro-batch when the plan says so).  A
plan over several device types runs on CPU with each type's processes at the thread count its
profiles were measured with (a stand-in for types of different speeds).  Everything is checked
before any process starts: the plan against the instance, what the runtime runs
(:data:`amp_opt.runtime.layout.RUNNABLE`: ZeRO stage 0 or 1, no context parallelism, no
interleaving), that the plan's device types are this machine's, the model's dimensions, and the
process count against the usable cores.  ``--repeats`` launches the run several times and keeps
the one with the median iteration time (a loaded machine is noisy).

The report pairs each term of the hetero cost model with what was measured for
it (:mod:`amp_opt.runtime.compare`).  ``-o`` writes the run record as a one-element
RUNS.json list (``--append`` adds it to an existing list), with ``instance`` set to
the instance's path relative to that file.  A run that runs out of memory is
recorded as ``failed: "oom"`` and the command exits with 6.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

from ..errors import InputError
from ..model.costs import cost_model
from ..model.costs.iteration import pipeline_weights
from ..model.evaluate import evaluate
from ..model.load import load_instance, load_json
from ..model.plan import check_plan, describe, devices_of, partition_text
from .common import add_torch_options, load_single_plan, positive_float, positive_int, write_text
from .report import micro_batches_text

EXIT_RUN_FAILED = 6


def add_arguments(p) -> None:
    """The options of the command."""
    p.add_argument("instance", help="instance JSON file (model given as a preset or a Hugging Face config)")
    p.add_argument("plan", help="JSON file with one plan object")
    p.add_argument("-o", "--output", default=None, metavar="RUN.json",
                   help="write the run record as a one-element RUNS.json list")
    p.add_argument("--append", action="store_true", help="with -o: add the record to the list already in the file")
    p.add_argument("--iterations", type=positive_int, default=10, help="measured iterations (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="iterations discarded first (default 2)")
    p.add_argument("--repeats", type=positive_int, default=1,
                   help="launch the run this many times and keep the median one (default 1)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    add_torch_options(p)
    p.add_argument("--memory-limit", type=positive_int, default=None, metavar="BYTES",
                   help="memory of each device, a CPU stand-in for a GPU's: a simulated out-of-memory once the "
                        "tracked total (model state, reduction buffer, the instance's memory_reserve, activations "
                        "and pipeline buffers) exceeds it; written into the record as memory_limit")
    p.add_argument("--timeout", type=positive_float, default=600.0, metavar="S",
                   help="seconds for one launch; then every process is stopped (default 600)")
    p.add_argument("--oversubscribe", action="store_true",
                   help="run even when tp*dp*pp is more than the usable cores (the processes share cores, "
                        "so the times measured say little about the plan)")
    p.add_argument("--seed", type=int, default=0, help="model initialisation and synthetic data")
    p.add_argument("--json", action="store_true", help="print the record and the comparison as JSON")


def run(args) -> int:
    from ..runtime import require_torch

    require_torch()
    from ..runtime.compare import compare_run
    from ..runtime.modules import model_shape
    from ..runtime.provenance import catalog_fields, check_local, resolve_device, usable_cores
    from ..runtime.run import prepare, run_plan

    if args.warmup < 0:
        raise InputError("--warmup", f"must be 0 or more, got {args.warmup}")
    instance = load_instance(args.instance)
    if args.memory_limit is not None and args.memory_limit <= instance.training.memory_reserve:
        raise InputError("--memory-limit", f"{args.memory_limit} bytes leave nothing beyond the instance's "
                                           f"training.memory_reserve ({instance.training.memory_reserve:.0f} bytes), "
                                           "which counts toward it as toward a device's memory")
    plan = check_plan(instance, load_single_plan(args.plan))
    types = sorted({instance.nodes[instance.device_node[d]].device_type for d in devices_of(plan)})
    device = resolve_device(args.device)
    if len(types) > 1 and device != "cpu":
        raise InputError("plan.stages", f"the plan uses device types {', '.join(types)}; one machine runs one kind "
                                        "of GPU (on CPU, each type's processes run with its own thread count)")
    check_local(types, device, catalog_fields(load_json(args.instance, "instance")))
    prepare(args.instance, plan, oversubscribe=args.oversubscribe)  # every other check (runtime support, model
    # dimensions, processes) before starting, and the prediction too (a missing profile is bad input, not a failed run)
    evaluation = evaluate(instance, plan, "hetero")
    shape = model_shape(load_json(args.instance, "instance"), base_dir=Path(args.instance).parent)
    threads = args.threads
    if threads is None and device == "cpu":
        threads = {kind: _type_threads(load_json(args.instance, "instance"), instance, kind, usable_cores())
                   for kind in types}
        threads = threads[types[0]] if len(types) == 1 else threads
    records = []
    for _ in range(args.repeats):
        record = run_plan(args.instance, plan, iterations=args.iterations, warmup=args.warmup, device=device,
                          dtype=args.dtype, attention=args.attention or shape.attention, threads=threads,
                          seed=args.seed, timeout=args.timeout, memory_limit=args.memory_limit,
                          oversubscribe=args.oversubscribe)
        records.append(record)
        if record.get("failed"):
            break
    record = _median_record(records)
    comparison = None if record.get("failed") else compare_run(record, evaluation, instance)
    if args.output:
        _write_record(record, args.output, args.instance, append=args.append)
    if args.json:
        print(json.dumps({"record": record, "predicted": evaluation.to_json(instance),
                          "comparison": comparison.to_json() if comparison else None}, indent=2))
    else:
        # A failed run's report (out of memory, an error) goes to stderr, as every failure does.
        print(format_comparison(instance, record, evaluation, comparison), end="",
              file=sys.stderr if record.get("failed") else sys.stdout)
        if args.output:
            print(f"wrote {args.output}")
    return EXIT_RUN_FAILED if record.get("failed") else 0


def _type_threads(document: dict, instance, kind: str, cores: int) -> int:
    """CPU threads of a device type's processes: with several types, the threads its profiles were
    measured with (a CPU stand-in for device types of different speeds); else usable cores / its
    devices per node."""
    types = {n.device_type for n in instance.nodes}
    measured = [p.get("provenance", {}).get("threads") for p in document.get("profiles", [])
                if isinstance(p, dict) and p.get("device_type") == kind]
    if len(types) > 1 and measured and measured[0]:
        return int(measured[0])
    per_node = max(n.devices for n in instance.nodes if n.device_type == kind)
    return max(1, cores // per_node)


def _median_record(records: list[dict]) -> dict:
    """The failed record if any launch failed, else the launch with the median iteration time
    (the lower median for an even count), with every launch's time under ``measured.repeats``."""
    failed = [r for r in records if r.get("failed")]
    if failed:
        return failed[0]
    times = [r["iteration_time"] for r in records]
    chosen = sorted(records, key=lambda r: r["iteration_time"])[(len(records) - 1) // 2]
    if len(records) > 1:
        chosen = dict(chosen, measured=dict(chosen["measured"], repeats=times,
                                            repeats_median=statistics.median(times)))
    return chosen


def _write_record(record: dict, output: str, instance_path: str, *, append: bool) -> None:
    out = dict(record, instance=os.path.relpath(Path(instance_path), Path(output).parent or "."))
    records = []
    if append and Path(output).exists():
        existing = load_json(output, "runs")
        if not isinstance(existing, list):
            raise InputError(output, "--append needs a JSON list of run records in the file")
        records = existing
    write_text(json.dumps(records + [out], indent=1) + "\n", output, "--output")


def format_comparison(instance, record: dict, evaluation, comparison) -> str:
    """Measured next to predicted, term by term (text)."""
    plan = evaluation.plan
    several = bool(evaluation.pipelines)
    head = (f"{instance.name}: {describe(plan)} ({micro_batches_text(evaluation.n_micro)} micro-batches/iteration, "
            f"partition {partition_text(plan)})")
    if record.get("failed"):
        return f"{head}\nrun FAILED ({record['failed']}): {record.get('error', '')}\n"
    m = record["measured"]
    prov = m.get("provenance", {})
    threads = m.get("threads", "?")
    threads = (f"{threads} thread(s) each" if not isinstance(threads, list) else
               "threads by rank " + ",".join(map(str, threads)))
    lines = [head, f"ran {len(m['ranks'])} processes on {prov.get('device', '?')}, "
             f"{threads}, torch {prov.get('torch', '?')}, {prov.get('dtype', '?')}"]
    it = comparison.iteration_time
    repeats = m.get("repeats")
    spread = f"{min(m['iteration_times']):.4f}..{max(m['iteration_times']):.4f}"
    lines.append(f"iteration time: measured {it.measured:.4f} s (median of {len(m['iteration_times'])} iterations, "
                 f"range {spread}" + (f"; launches {', '.join(f'{t:.4f}' for t in repeats)}" if repeats else "")
                 + f"), predicted {it.predicted:.4f} s, measured/predicted {it.ratio:.2f}")
    lines.append("")
    lines.append(f"  {'stage':>5} {'layers':>7}  {'compute/mb ms':>21}  {'allreduce ms':>19}  "
                 f"{'p2p ms':>19}  {'peak memory MiB':>19}")
    lines.append(f"  {'':>5} {'':>7}  {'measured':>10} {'predicted':>10}  {'measured':>9} {'predicted':>9}  "
                 f"{'blocked':>9} {'predicted':>9}  {'measured':>9} {'predicted':>9}")
    for s in comparison.stages:
        label = str(s.stage) if s.pipeline is None else f"{s.pipeline}.{s.stage}"
        lines.append(f"  {label:>5} {f'{s.layers[0]}-{s.layers[1] - 1}':>7}  "
                     f"{s.compute_per_micro_batch.measured * 1e3:>10.2f} {s.compute_per_micro_batch.predicted * 1e3:>10.2f}  "
                     f"{s.allreduce.measured * 1e3:>9.2f} {s.allreduce.predicted * 1e3:>9.2f}  "
                     f"{s.p2p.measured * 1e3:>9.2f} {s.p2p.predicted * 1e3:>9.3f}  "
                     f"{s.memory.measured / 2**20:>9.2f} {s.memory.predicted / 2**20:>9.2f}")
    # The cost model's pipeline weights (H13 for hetero), on the measured and the predicted stage times;
    # with several pipelines the slowest pipeline's (U6).
    pipe_m = pipe_p = 0.0
    for i, n in enumerate(evaluation.n_micro if several else (evaluation.n_micro,)):
        mine = [s for s in comparison.stages if s.pipeline == (i if several else None)]
        weights = pipeline_weights(n, len(mine), plan.virtual_stages, cost_model(evaluation.cost_model).schedule)
        pipe_m = max(pipe_m, weights.time([s.compute_per_micro_batch.measured for s in mine], [0.0], [0.0]))
        pipe_p = max(pipe_p, weights.time([s.compute_per_micro_batch.predicted for s in mine], [0.0], [0.0]))
    ar_m = max(s.allreduce.measured for s in comparison.stages)
    ar_p = max(s.allreduce.predicted for s in comparison.stages)
    if several:  # a faster pipeline's ranks wait in the reduction for the slowest: count the one that waits least
        ar_m = min(max(s.allreduce.measured for s in comparison.stages if s.pipeline == i)
                   for i in range(len(plan.pipelines)))
    opt = max(st.get("optimizer", 0.0) for st in m["stages"])
    # H15: the step follows the reduction; the prediction's end of iteration is max_s (AR_s + O_s).
    end_p = max(s.allreduce.predicted + s.optimizer.predicted for s in comparison.stages)
    opt_p = end_p - ar_p
    rest_m = it.measured - pipe_m - ar_m - opt
    rest_p = it.predicted - pipe_p - end_p
    lines += ["", "  iteration, term by term (s)        measured   predicted",
              f"  pipeline compute max c E + sum E    {pipe_m:>9.4f} {pipe_p:>11.4f}"
              + ("  (the slowest pipeline)" if several else ""),
              f"  gradient allreduce (max)            {ar_m:>9.4f} {ar_p:>11.4f}",
              f"  optimizer step{' (not modelled)' if not end_p > ar_p else ' (H15)':<21} {opt:>9.4f} {opt_p:>11.4f}",
              f"  the rest: p2p, bubbles, overheads   {rest_m:>9.4f} {rest_p:>11.4f}",
              f"  total                               {it.measured:>9.4f} {it.predicted:>11.4f}",
              f"  peak memory (fullest device, MiB)   {record['peak_memory'] / 2**20:>9.2f} "
              f"{max(s.memory.predicted for s in comparison.stages) / 2**20:>11.2f}"
              + (f"  ({m['memory_kind']})" if m.get("memory_kind") else "")]
    lines += [f"note: {note}" for note in comparison.notes]
    return "\n".join(lines) + "\n"
