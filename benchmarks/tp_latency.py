"""The tensor-parallel allreduces' latency (H2 with H19), measured against predicted on this machine.

Usage (needs PyTorch; about 5 minutes on 2 quiet cores)::

    python benchmarks/tp_latency.py [--report benchmarks/results/tp_latency.md] [--repeats 3]

The README's workflow, every step through the command line a user would type, in a temporary
folder:

1. ``python -m amp_opt profile`` ``instances/cpu_gpt_small.json`` at tp 1 only (micro-batches
   1, 2, 4, ``--links``: the link's bandwidth and its latency per message are measured);
2. ``python -m amp_opt run`` the tp-2 plans (one stage, micro-batches 1, 2, 4) on two processes,
   whose layer times the model derives from the tp-1 profile (A3) plus the tp allreduces;
3. the same plans predicted without the allreduces' latency (the profiled instance with
   ``intra_latency`` 0: what the model priced before H19 reached the tp group; these plans send
   nothing else that pays a latency);
4. ``python -m amp_opt profile --tp 2`` for the measured tp-2 times themselves, beside.

Nothing is fitted: the latency is the one ``profile --links`` measured.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from amp_opt.bench.writers import commit as git_commit
from amp_opt.model.evaluate import evaluate
from amp_opt.model.load import parse_instance
from amp_opt.model.plan import parse_plan

ROOT = Path(__file__).resolve().parent.parent
SIZES = (1, 2, 4)


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    print("$ python -m amp_opt", " ".join(args), flush=True)
    out = subprocess.run([sys.executable, "-m", "amp_opt", *args], capture_output=True, text=True, cwd=cwd)
    if out.returncode != 0:
        raise SystemExit(f"failed ({out.returncode}): {out.stderr.strip()}")
    return out


def per_micro_batch(doc: dict, tp: int, b: int) -> float:
    """Seconds of one micro-batch through every layer in a profile of the document."""
    return next(sum(p["layer_times"]) for p in doc["profiles"] if p["tp"] == tp and p["micro_batch"] == b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", default=str(ROOT / "benchmarks" / "results" / "tp_latency.md"))
    parser.add_argument("--repeats", type=int, default=3, help="launches per plan (run --repeats)")
    args = parser.parse_args()
    sizes = ",".join(map(str, SIZES))
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        (out / "instance.json").write_text((ROOT / "instances" / "cpu_gpt_small.json").read_text())
        cli("profile", "instance.json", "-o", "profiled.json", "--micro-batches", sizes, "--repeats", "10",
            "--links", "--runnable", cwd=out)
        cli("profile", "instance.json", "-o", "tp2.json", "--tp", "2", "--micro-batches", sizes, "--repeats", "10",
            cwd=out)
        doc = json.loads((out / "profiled.json").read_text())
        measured_tp2 = json.loads((out / "tp2.json").read_text())
        with_latency = parse_instance(doc)
        without = json.loads(json.dumps(doc))
        for node in without["nodes"]:
            node["intra_latency"] = 0.0
        without = parse_instance(without)
        alpha = with_latency.nodes[0].intra_latency
        links = doc["measurements"]["links"]["cpu"]
        rows = []
        for b in SIZES:
            plan = {"tp": 2, "dp": 1, "pp": 1, "micro_batch": b, "partition": [0, with_latency.num_layers]}
            (out / "plan.json").write_text(json.dumps(plan))
            cli("run", "profiled.json", "plan.json", "-o", f"run{b}.json", "--repeats", str(args.repeats), cwd=out)
            record = json.loads((out / f"run{b}.json").read_text())[0]
            new, old = (evaluate(inst, parse_plan(plan)) for inst in (with_latency, without))
            rows.append((b, record, new, old, per_micro_batch(measured_tp2, 2, b), per_micro_batch(doc, 1, b)))
    load_after = " ".join(f"{x:.2f}" for x in os.getloadavg())
    commit = git_commit(ROOT) or "unknown"
    import torch

    lines = [
        "# The tensor-parallel allreduces' latency, measured against predicted",
        "",
        f"Command: `python benchmarks/tp_latency.py` (commit {commit})  ",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"torch {torch.__version__}  ",
        f"Run: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; load average (1, 5, 15 min) "
        f"before {load_before}, after {load_after}",
        "",
        f"`instances/cpu_gpt_small.json` profiled at tp 1 only (the README's workflow), "
        f"`profile --links` measured {alpha * 1e6:.1f} us per message on the node's link. "
        "The plans run one stage at tp 2 on the two processes; the model derives their layer times "
        "from the tp-1 profile (A3) and adds the tp allreduces (H2): their bytes, and with H19 "
        "each allreduce's 2 (tp-1) ring steps at the measured latency. `without latency` is the same "
        "instance with `intra_latency` 0. Times in ms; `profile --tp 2` is the tp-2 time measured "
        "layer by layer, for reference (the model does not read it).",
        "",
        "| plan | compute per micro-batch: run | predicted, without latency | predicted, with latency | "
        "profile --tp 2 | tp collectives per micro-batch: run | predicted bytes | predicted latency | "
        "iteration: run | predicted, without | predicted, with | run / with |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    bw = with_latency.nodes[0].intra_bandwidth
    messages = float(with_latency.layer_tp_messages.sum())
    for b, record, new, old, tp2, _ in rows:
        stage = record["measured"]["stages"][0]
        n = record["measured"]["micro_batches_per_iteration"]
        size = 2 * (2 - 1) / 2 * b * float(with_latency.layer_tp_comm.sum()) / bw  # H2's bytes term at tp 2
        steps = 2 * (2 - 1) * alpha * messages  # H19's steps at tp 2
        lines.append(
            f"| tp=2 micro_batch={b} | {1e3 * stage['compute_per_micro_batch']:.2f} | {1e3 * old.stages[0].compute:.2f} | "
            f"{1e3 * new.stages[0].compute:.2f} | {1e3 * tp2:.2f} | {1e3 * stage['tp_comm'] / n:.2f} | "
            f"{1e3 * size:.2f} | {1e3 * steps:.2f} | {record['iteration_time']:.4f} s | "
            f"{old.predicted_time:.4f} s | {new.predicted_time:.4f} s | {record['iteration_time'] / new.predicted_time:.2f} |")
    lines += ["", "tp-1 profile, per micro-batch (ms): "
              + ", ".join(f"b={b} {1e3 * tp1:.2f}" for b, *_, tp1 in rows)
              + f". The model's tp collectives per micro-batch: {messages:.0f} allreduces of the layers' "
              f"tp_comm_bytes over {bw / 1e9:.2f} GB/s (the link `profile --links` measured).", ""]
    # The isolated allreduces profile --links timed, against the alpha-beta line the model prices
    # (2 (p-1) steps of alpha plus 2 (p-1)/p of the bytes over the measured bus bandwidth; p = 2).
    link = links["allreduce"]
    lines += ["The allreduces `profile --links` timed alone (2 processes, median), against the model's "
              "2 (p-1) alpha + 2 (p-1)/p n / B with its alpha and B from the same measurements (us):", "",
              "| bytes | measured | model | measured / model |", "|---|---|---|---|",
              f"| 4 | {2e6 * alpha:.1f} | {2e6 * alpha:.1f} | 1.00 |"]
    for entry in link:
        model = 2 * alpha + entry["bytes"] / bw
        lines.append(f"| {entry['bytes']} | {1e6 * entry['seconds']:.1f} | {1e6 * model:.1f} | "
                     f"{entry['seconds'] / model:.2f} |")
    block = next(layer for layer in with_latency.layers if layer.kind == "transformer")
    lines.append(f"\nA block's tp messages at micro-batch 1: {block.tp_comm_bytes / block.tp_comm_messages:.0f} bytes "
                 "(s h elements).")
    lines.append("")
    Path(args.report).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
