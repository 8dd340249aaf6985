"""Measured study of calibration on this machine: profile, run many plans, calibrate on half, score the other half.

Usage (needs PyTorch; about 20 minutes on 2 quiet cores, 40-60 on loaded ones)::

    python benchmarks/calibration_study.py [--out benchmarks/results/calibration] \
        [--report benchmarks/results/calibration.md] [--passes 5] [--iterations 8] [--analyse-only]

Steps, every one through the command line a user would type:

1. ``python -m amp_opt profile`` ``instances/cpu_gpt_small.json`` (a GPT of 4 blocks,
   hidden 128) on this machine's CPU as device type ``cpu`` (tp 1 and 2, micro-batches 1-8, ``--links``);
2. ``python -m amp_opt run`` each of the plans below (2 processes each: pipelines with
   every partition, data parallel, tensor parallel; micro-batches 1-8) once per pass,
   ``--passes`` passes over all plans (the order reversed every other pass, so that a
   drifting load reaches every plan alike); each plan keeps its median launch (RUNS.json);
3. split the finished runs in two halves (a fixed permutation, seed 0);
   ``python -m amp_opt calibrate`` on the first half;
4. score both the uncalibrated and the calibrated model on the held-out half: Spearman
   rank correlation, median absolute error, top-1 regret (measured time of the plan
   predicted fastest over the fastest measured), predicted against measured peak memory;
5. split the uncalibrated model's error on every run into terms (pipeline compute,
   gradient allreduce, optimizer step, the rest: p2p, bubbles and per-step overheads).

``--analyse-only`` redoes 3-5 from the saved runs.  Nothing is tuned to the result: the
plans, the split and the fit are fixed before any run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from amp_opt.bench.writers import commit as git_commit
from amp_opt.calibrate.predict import peak_of_stage
from amp_opt.calibrate.metrics import errors, spearman
from amp_opt.model.costs import cost_model
from amp_opt.model.costs.iteration import pipeline_weights
from amp_opt.model.evaluate import evaluate
from amp_opt.model.load import load_instance
from amp_opt.model.plan import parse_plan
from amp_opt.model.schedule import path_bound, schedule_of

ROOT = Path(__file__).resolve().parent.parent
INSTANCE = json.loads((ROOT / "instances" / "cpu_gpt_small.json").read_text())
MODEL = INSTANCE["model"]
SIZES = (1, 2, 4, 8)
SEED = 0


def study_plans() -> list[dict]:
    """Every plan on two processes: pp=2 at each partition of the 6 layers, dp=2, tp=2; micro-batches 1-8."""
    plans = []
    for b in SIZES:
        for k in range(1, 6):
            plans.append({"tp": 1, "dp": 1, "pp": 2, "micro_batch": b, "partition": [0, k, 6]})
        plans.append({"tp": 1, "dp": 2, "pp": 1, "micro_batch": b, "partition": [0, 6]})
        plans.append({"tp": 2, "dp": 1, "pp": 1, "micro_batch": b, "partition": [0, 6]})
    return plans


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "amp_opt", *args]
    print("$", "python -m amp_opt", " ".join(args), flush=True)
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if out.returncode not in (0, 6):
        raise SystemExit(f"failed ({out.returncode}): {out.stderr}")
    return out


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def measure(out: Path, passes: int, iterations: int, log: list, *, plans: int | None = None,
            profile_repeats: int = 30) -> None:
    """Profile, then run every plan once per pass (plans in turn, the order reversed every other
    pass, so that a drifting load reaches every plan alike); each plan keeps its median launch."""
    out.mkdir(parents=True, exist_ok=True)
    launches = out / "launches"
    launches.mkdir(exist_ok=True)
    (out / "instance.json").write_text(json.dumps(INSTANCE, indent=2) + "\n")
    log.append({"step": "profile", "load": load_average()})
    profile = cli("profile", "instance.json", "-o", "profiled.json", "--device", "cpu", "--micro-batches",
                  ",".join(map(str, SIZES)), "--tp", "1,2", "--repeats", str(profile_repeats), "--statistic", "q1", "--links", "--runnable",
                  cwd=out)
    (out / "profile.txt").write_text(profile.stdout)
    plans = study_plans()[:plans]
    for k in range(passes):
        order = list(range(len(plans)))[:: (1 if k % 2 == 0 else -1)]
        for i in order:
            (out / "plan.json").write_text(json.dumps(plans[i]))
            before, t0 = load_average(), time.monotonic()
            cli("run", "profiled.json", "plan.json", "-o", f"launches/{k}_{i}.json", "--iterations", str(iterations),
                cwd=out)
            log.append({"step": f"pass {k} plan {i}", "load": before, "seconds": round(time.monotonic() - t0, 1)})
    (out / "plan.json").unlink()
    combined = []
    for i in range(len(plans)):
        # Each launch wrote its record next to launches/; the combined list sits beside the instance.
        records = [dict(json.loads((launches / f"{k}_{i}.json").read_text())[0], instance="profiled.json")
                   for k in range(passes)]
        loads = [next(e["load"] for e in log if e["step"] == f"pass {k} plan {i}") for k in range(passes)]
        failed = [r for r in records if "failed" in r]
        if failed:
            combined.append(failed[0])
            continue
        times = [r["iteration_time"] for r in records]
        chosen = sorted(records, key=lambda r: r["iteration_time"])[(passes - 1) // 2]
        chosen["measured"]["repeats"] = times  # in pass order
        chosen["measured"]["loads"] = loads
        combined.append(chosen)
    (out / "runs.json").write_text(json.dumps(combined, indent=1) + "\n")


def split(n: int) -> tuple[list[int], list[int]]:
    """A fixed half / half split of n runs (seeded permutation)."""
    order = np.random.default_rng(SEED).permutation(n)
    half = (n + 1) // 2
    return sorted(int(i) for i in order[:half]), sorted(int(i) for i in order[half:])


def predictions(instance, records) -> tuple[list[float], list[float]]:
    times, peaks = [], []
    for r in records:
        ev = evaluate(instance, parse_plan(r["plan"]))
        times.append(ev.predicted_time)
        peaks.append(max(peak_of_stage(instance, s) for s in ev.stages))
    return times, peaks


def describe(plan: dict) -> str:
    p = plan
    kind = f"pp=2 [{p['partition'][1]}+{6 - p['partition'][1]}]" if p["pp"] == 2 else (
        "dp=2" if p["dp"] == 2 else "tp=2")
    return f"{kind} b={p['micro_batch']}"


def term_split(instance, records) -> list[dict]:
    """The uncalibrated model's error on each run, term by term (seconds, measured - predicted)."""
    rows = []
    for r in records:
        ev = evaluate(instance, parse_plan(r["plan"]))
        m = r["measured"]
        n = ev.n_micro
        e_m = [s["compute_per_micro_batch"] for s in m["stages"]]
        e_p = [s.compute for s in ev.stages]
        weights = pipeline_weights(n, len(e_p), ev.plan.virtual_stages, cost_model(ev.cost_model).schedule)
        compute = weights.time(e_m, [0.0], [0.0]) - weights.time(e_p, [0.0], [0.0])
        allreduce = max(s["allreduce"] + s.get("tie_allreduce", 0.0) for s in m["stages"]) - max(
            s.allreduce for s in ev.stages)
        optimizer = max(s.get("optimizer", 0.0) for s in m["stages"])
        total = r["iteration_time"] - ev.predicted_time
        rest = total - compute - allreduce - optimizer
        rows.append({"plan": describe(r["plan"]), "measured": r["iteration_time"], "predicted": ev.predicted_time,
                     "compute": compute, "allreduce": allreduce, "optimizer": optimizer, "rest": rest,
                     "per_micro_batch_rest": rest / (n + len(ev.stages) - 1), "pp": r["plan"]["pp"]})
    return rows


def profile_variants(out: Path) -> dict[str, str]:
    """The profiled instance as measured, and the same measurements with the other statistic
    as layer times (the spread keeps every quartile): {statistic: file name}, the measured first."""
    doc = json.loads((out / "profiled.json").read_text())
    primary = doc["profiles"][0]["provenance"].get("statistic", "median")
    names = {primary: "profiled.json"}
    for other in ("q1", "median"):
        if other != primary and all(other in p.get("spread", {}) for p in doc["profiles"]):
            variant = json.loads(json.dumps(doc))
            for p in variant["profiles"]:
                p["layer_times"] = p["spread"][other]
                p["provenance"] = dict(p["provenance"], statistic=other)
            (out / f"profiled_{other}.json").write_text(json.dumps(variant, indent=1) + "\n")
            names[other] = f"profiled_{other}.json"
    return names


def analyse(out: Path, report: Path, log: list, command: str) -> None:
    everything = json.loads((out / "runs.json").read_text())
    records = [r for r in everything if "iteration_time" in r]
    failed = [r for r in everything if "failed" in r]
    train, test = split(len(records))
    held = [records[i] for i in test]
    (out / "test.json").write_text(json.dumps([_short(r) for r in held], indent=1) + "\n")
    fits, models = {}, {}
    for statistic, name in profile_variants(out).items():
        suffix = "" if name == "profiled.json" else f"_{statistic}"
        (out / f"train{suffix}.json").write_text(
            json.dumps([dict(_short(records[i]), instance=name) for i in train], indent=1) + "\n")
        fits[statistic] = cli("calibrate", name, f"train{suffix}.json", "-o", f"calibrated{suffix}.json", cwd=out)
        models[statistic] = (load_instance(out / name), load_instance(out / f"calibrated{suffix}.json"))
    primary = next(iter(models))
    before, after = models[primary]
    lines = ["# Calibration study on this machine", "",
             f"Command: `{command}` (commit {_commit()})  ",
             f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores "
             f"({len(os.sched_getaffinity(0))} usable), Python {platform.python_version()}, "
             f"{_torch_version()}  ",
             f"Profiled: {_profile_date(out)}; analysed: "
             f"{datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} "
             "(`--analyse-only` re-scores the saved runs)  ",
             f"Load average (1, 5, 15 min) at the analysis: {load_average()}  "]
    if log:
        ones = [float(e["load"].split()[0]) for e in log if e["step"].startswith("pass")]
        lines.append(f"Load average before the profile: {log[0]['load']}; 1-minute load average before the "
                     f"{len(ones)} launches: min {min(ones):.2f}, median {np.median(ones):.2f}, max {max(ones):.2f} "
                     f"(2 cores; other sessions were running)" if ones else "")
    lines += ["", f"Model: `instances/cpu_gpt_small.json`, GPT preset, {MODEL['layers']} blocks, hidden "
              f"{MODEL['hidden']}, {MODEL['heads']} heads, sequence {MODEL['seq_len']}, vocabulary {MODEL['vocab']}, "
              f"float32, eager attention; global batch {INSTANCE['training']['global_batch']}; one node of 2 `cpu` "
              f"devices (one process and {_threads(records)} thread(s) each).", "",
              f"{len(records)} plans finished ({len(failed)} failed); calibrated on {len(train)} "
              f"(runs {train} of runs.json), scored on the other {len(test)}. Profile statistic: layer times are "
              f"the {_statistic_words(primary)} of the profile's rounds" + (
                  "; the other rows use the same measurements with the " + ", ".join(
                      _statistic_words(k) for k in models if k != primary) + " instead" if len(models) > 1 else "")
              + ".", ""]
    lines += _score_table(models, primary, held)
    lines += [""] + _reading(before, records, held)
    for statistic, fit in fits.items():
        name = "profiled.json" if statistic == primary else f"profiled_{statistic}.json"
        suffix = "" if statistic == primary else f"_{statistic}"
        lines += ["", f"## The fit, profile {statistic} (`python -m amp_opt calibrate {name} train{suffix}.json "
                  f"-o calibrated{suffix}.json`)", "", "```", fit.stdout.rstrip(), "```"]
    lines += [""] + _held_out_table(before, after, held)
    lines += [""] + _noise_section(records, held)
    lines += [""] + _sharing_section(before, records)
    lines += [""] + _term_section(before, records)
    lines += [""] + _schedule_section(before, after, records, held)
    lines += ["", "## Profile (`python -m amp_opt profile`)", "", "```", (out / "profile.txt").read_text().rstrip()
              if (out / "profile.txt").exists() else "(not kept)", "```"]
    report.write_text("\n".join(lines) + "\n")
    print(f"wrote {report}")


def _short(record: dict) -> dict:
    """A run record without the measurement details (RUNS.json needs plan, time, peak memory)."""
    return {k: record[k] for k in ("plan", "iteration_time", "peak_memory", "instance") if k in record}


def _statistic_words(statistic: str) -> str:
    return {"median": "median", "q1": "first quartile", "min": "minimum"}[statistic]


def _torch_version() -> str:
    try:
        import torch

        return f"torch {torch.__version__}"
    except ImportError:  # pragma: no cover
        return "torch not installed"


def _threads(records) -> str:
    return str(records[0]["measured"].get("threads", "?")) if records else "?"


def _regret(predicted, measured) -> float:
    pick = int(np.argmin(predicted))
    return measured[pick] / min(measured) - 1


def _score_table(models, primary, held) -> list[str]:
    measured = [r["iteration_time"] for r in held]
    peaks = [r["peak_memory"] for r in held]
    rows = []
    for statistic, (before, after) in models.items():
        for label, inst in (("uncalibrated", before), ("calibrated on the other half", after)):
            t, p = predictions(inst, held)
            rows.append((f"{label}, profile {statistic}", errors(t, measured), _regret(t, measured),
                         errors(p, peaks), statistic == primary and inst is after))
    cal = next(r for r in rows if r[4])
    met = {"spearman": (cal[1].spearman or 0) >= 0.9, "median": cal[1].median_abs_error <= 0.10,
           "regret": cal[2] <= 0.05, "memory": cal[3].max_abs_error <= 0.10}
    out = ["## Held-out plans", "",
           "| model | Spearman | median abs error | max abs error | top-1 regret | peak memory: median / max abs error |",
           "|---|---|---|---|---|---|"]
    for label, e, regret, pe, _ in rows:
        out.append(f"| {label} | {_fmt(e.spearman, 3)} | {100 * e.median_abs_error:.1f}% | {100 * e.max_abs_error:.1f}% | "
                   f"{100 * regret:.1f}% | {100 * pe.median_abs_error:.1f}% / {100 * pe.max_abs_error:.1f}% |")
    out += ["", f"Targets (calibrated, held out, profile {primary}): Spearman >= 0.9 "
            + ("met" if met["spearman"] else "NOT met")
            + "; median absolute error <= 10% " + ("met" if met["median"] else "NOT met")
            + "; top-1 within 5% of the fastest " + ("met" if met["regret"] else "NOT met")
            + "; peak memory within 10% (every held-out plan) " + ("met" if met["memory"] else "NOT met") + "."]
    return out


def _held_out_table(before, after, held) -> list[str]:
    t0, p0 = predictions(before, held)
    t1, p1 = predictions(after, held)
    out = ["## Every held-out plan (seconds per iteration, peak MiB of the fullest process)", "",
           "| plan | measured s | uncalibrated | calibrated | measured MiB | uncalibrated | calibrated |",
           "|---|---|---|---|---|---|---|"]
    order = np.argsort([r["iteration_time"] for r in held])
    for i in order:
        r = held[i]
        out.append(f"| {describe(r['plan'])} | {r['iteration_time']:.4f} | {t0[i]:.4f} | {t1[i]:.4f} | "
                   f"{r['peak_memory'] / 2**20:.2f} | {p0[i] / 2**20:.2f} | {p1[i] / 2**20:.2f} |")
    return out


def _noise_section(records, held) -> list[str]:
    """How repeatable the measurements are: the spread of each plan's launches, and the same
    scores as above between two halves of the passes (a ceiling for any model)."""
    if not records or "repeats" not in records[0]["measured"]:
        return ["## Repeatability", "", "(one launch per plan: not measured)"]
    spread = [(max(r["measured"]["repeats"]) - min(r["measured"]["repeats"])) / r["iteration_time"] for r in records]

    def halves(rs):
        even = [float(np.median(r["measured"]["repeats"][0::2])) for r in rs]
        odd = [float(np.median(r["measured"]["repeats"][1::2])) for r in rs]
        return even, odd

    out = ["## Repeatability (the noise floor)", "",
           f"Each plan ran {len(records[0]['measured']['repeats'])} times, once per pass. Median over plans of "
           f"(slowest - fastest launch) / median launch: {100 * np.median(spread):.0f}% (largest "
           f"{100 * max(spread):.0f}%).", "",
           "The same plans measured twice (median of the even passes against median of the odd passes), "
           "scored as the model is scored: what a perfect model could reach at most on these measurements.", "",
           "| plans | Spearman | median abs difference | top-1 regret |", "|---|---|---|---|"]
    for label, rs in (("all", records), ("held out", held)):
        even, odd = halves(rs)
        e = errors(even, odd)
        out.append(f"| {label} ({len(rs)}) | {_fmt(e.spearman)} | {100 * e.median_abs_error:.1f}% | "
                   f"{100 * _regret(even, odd):.1f}% |")
    loads = [float(x.split()[0]) for r in records for x in r["measured"].get("loads", [])]
    ratios = [t / r["iteration_time"] for r in records for t in r["measured"]["repeats"]]
    if len(loads) == len(ratios) and loads:
        out += ["", f"Spearman between the 1-minute load average before a launch and that launch's time over its "
                f"plan's median: {_fmt(spearman(loads, ratios))} ({len(loads)} launches)."]
    return out


def _retest(rs) -> tuple[float | None, float]:
    """Spearman and median absolute difference between the even and the odd passes' medians."""
    even = [float(np.median(r["measured"]["repeats"][0::2])) for r in rs]
    odd = [float(np.median(r["measured"]["repeats"][1::2])) for r in rs]
    e = errors(even, odd)
    return e.spearman, e.median_abs_error


def _serial_and_model(before, records) -> tuple[float | None, float | None]:
    measured = [r["iteration_time"] for r in records]
    model, serial = [], []
    for r in records:
        ev = evaluate(before, parse_plan(r["plan"]))
        model.append(ev.predicted_time)
        serial.append(ev.n_micro * sum(s.compute for s in ev.stages) * r["plan"]["dp"] * r["plan"]["tp"])
    return spearman(model, measured), spearman(serial, measured)


def _reading(before, records, held) -> list[str]:
    """What the numbers say, in words (computed, not written by hand)."""
    out = ["How to read this:"]
    if records and "repeats" in records[0]["measured"]:
        rho, diff = _retest(held)
        out.append(f"- Measuring the held-out plans twice (even against odd passes) agrees to Spearman "
                   f"{_fmt(rho)} and {100 * diff:.1f}% median difference: "
                   + ("the Spearman target is above what the measurements themselves repeat to, so the ranking "
                      "here is noise-dominated." if rho is not None and rho < 0.9 else
                      "the measurements repeat well enough for the targets to be meaningful."))
    model, serial = _serial_and_model(before, records)
    if model is not None and serial is not None and serial > model:
        out.append(f"- The measured times follow the plans' total work (Spearman {_fmt(serial)}) more than the "
                   f"model's two-device prediction ({_fmt(model)}): with other jobs on the 2 cores, the two "
                   "processes share the machine instead of running as two devices, which no correction of a "
                   "two-device model (per device type, per link kind) can express.")
    return out


def _sharing_section(before, records) -> list[str]:
    """Do the two processes run as two devices?  The cost model assumes they do: a balanced
    pipeline takes half the time of one stage doing everything.  If the machine only has one
    core to spare, every plan takes its total work instead.  A diagnostic, not a model."""
    # every process's compute one after another on one core: each stage's work, on each of its
    # dp replicas and tp ranks
    model, serial = _serial_and_model(before, records)
    pipes = [r for r in records if r["plan"]["pp"] == 2]
    by_size: dict[int, list[float]] = {}
    for r in pipes:
        by_size.setdefault(r["plan"]["micro_batch"], []).append(r["iteration_time"])
    spread = [max(v) / min(v) for v in by_size.values() if len(v) > 1]
    return ["## Two processes, two devices?", "",
            "The cost model takes the two processes for two devices running side by side. If the machine "
            "gives the job only one core's worth of time, a plan takes its whole work one step after the "
            "other instead, whatever the partition. Spearman rank correlation with the measured times (all "
            f"{len(records)} plans): the hetero model (uncalibrated) {_fmt(model)}; the "
            f"total work of every process added up (one core) {_fmt(serial)}. The model "
            "predicts that a pipeline's partition matters (the slowest stage sets the pace: up to "
            f"{max(max(v) / min(v) for v in _predicted_by_size(before, pipes).values()):.1f}x between "
            "partitions of one micro-batch size); measured, the partitions of one size differ by at most "
            f"{max(spread):.2f}x (median {np.median(spread):.2f}x)." if spread else ""]


def _fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _predicted_by_size(instance, pipes) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for r in pipes:
        out.setdefault(r["plan"]["micro_batch"], []).append(evaluate(instance, parse_plan(r["plan"])).predicted_time)
    return {k: v for k, v in out.items() if len(v) > 1} or {0: [1.0]}


def _term_section(before, records) -> list[str]:
    rows = term_split(before, records)
    out = ["## Where the uncalibrated model's error comes from (all runs)", "",
           "Measured minus predicted seconds per iteration, split by term: pipeline compute is "
           "max_s c_s E_s + sum E (H13's weights) with the measured against the predicted per-micro-batch "
           "stage compute (H1, H13); allreduce the largest stage's gradient (and tied-embedding) allreduce (H4); the "
           "optimizer step, which the model leaves out; the rest is what happens between the layers' "
           "compute (p2p, predicted as 2 sum P, and waiting beyond the 1F1B bubble, per-micro-batch overheads), also "
           "shown per pipeline step (n + pp - 1 steps).", "",
           "| plan | measured s | predicted s | compute | allreduce | optimizer | rest | rest per step ms |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['plan']} | {r['measured']:.4f} | {r['predicted']:.4f} | {r['compute']:+.4f} | "
                   f"{r['allreduce']:+.4f} | {r['optimizer']:+.4f} | {r['rest']:+.4f} | "
                   f"{1e3 * r['per_micro_batch_rest']:+.2f} |")
    total = sum(abs(r["measured"] - r["predicted"]) for r in rows)
    shares = {k: sum(abs(r[k]) for r in rows) for k in ("compute", "allreduce", "optimizer", "rest")}
    whole = sum(shares.values())
    out += ["", "Share of the absolute error, summed over runs: " + ", ".join(
        f"{k} {100 * v / whole:.0f}%" for k, v in shares.items()) + f" (total |error| {total:.3f} s over "
        f"{len(rows)} runs; median relative error {100 * np.median([abs(r['measured'] / r['predicted'] - 1) for r in rows]):.0f}%)."]
    return out


def _profile_date(out: Path) -> str:
    """The date the profile's provenance records (the runs followed it), or "unknown"."""
    try:
        profiles = json.loads((out / "profiled.json").read_text()).get("profiles", [])
        return str(profiles[0]["provenance"]["date"])[:16].replace("T", " ") + " UTC"
    except (OSError, ValueError, LookupError, TypeError):
        return "unknown"


def _paths(ev) -> float:
    """The 1F1B path bound of an evaluation's stage terms, plus the allreduce term."""
    st = ev.stages
    return path_bound([r.compute for r in st], [r.p2p for r in st], ev.n_micro) + max(r.allreduce for r in st)


def _schedule_section(before, after, records, held) -> list[str]:
    """The searched iteration time (H13) and AMP's closed form (H6) against the 1F1B schedule they
    stand for: the same stage terms run through Megatron's 1F1B order by the event simulation
    ``plot`` draws, and the linear path bound of that schedule."""
    rows = []
    for r in records:
        ev = evaluate(before, parse_plan(r["plan"]))
        closed = evaluate(before, parse_plan(r["plan"]), "hetero-closed")
        rows.append((r, ev, closed, schedule_of(before, ev).makespan))
    gaps = [row for row in rows if abs(row[2].predicted_time / row[3] - 1) > 0.01
            or abs(row[1].predicted_time / row[3] - 1) > 0.01]
    exact = sum(abs(_paths(ev) - sim) <= 1e-6 * sim for _, ev, _, sim in rows)
    same = sum(abs(ev.predicted_time - _paths(ev)) <= 1e-9 * _paths(ev) for _, ev, _, _ in rows)
    out = ["## The 1F1B formula (H13), AMP's closed form (H6) and the 1F1B schedule", "",
           "H6 (the `hetero-closed` model) charges the slowest stage n - 1 times plus one micro-batch "
           "through every stage, and each boundary once. Under Megatron's 1F1B order a stage first runs "
           "one forward per later stage (its warm-up), so a slow stage followed by faster ones does those "
           "forwards while the first micro-batch travels through the later stages and back, and the first "
           "micro-batch crosses every boundary twice. H13 (the `hetero` model, what every search "
           "optimises) weighs each stage's time by its position in that order and counts both crossings "
           "(`formulations/hetero.md`, H13). Against the event simulation of the same stage terms "
           "(`amp_opt.model.schedule.schedule_of`, what `python -m amp_opt plot` draws) and its linear "
           "path bound (`amp_opt.model.schedule.path_bound`; plus the allreduce term), uncalibrated, on "
           "every run where H6 or H13 differs from the schedule by more than 1%:", "",
           "| plan | micro-batches | measured s | H6 s | H13 s | schedule s | path bound s | H6 error | "
           "H13 error | schedule error |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r, ev, closed, sim in gaps:
        m, pb = r["iteration_time"], _paths(ev)
        out.append(f"| {describe(r['plan'])} | {ev.n_micro} | {m:.4f} | {closed.predicted_time:.4f} | "
                   f"{ev.predicted_time:.4f} | {sim:.4f} | {pb:.4f} | {100 * (closed.predicted_time / m - 1):+.1f}% | "
                   f"{100 * (ev.predicted_time / m - 1):+.1f}% | {100 * (sim / m - 1):+.1f}% |")
    measured = [r["iteration_time"] for r in held]
    out += ["", f"{len(gaps)} of {len(rows)} runs differ by more than 1%. The path bound plus the allreduce term "
            f"equals the simulated schedule on {exact} of the {len(rows)} runs, and H13 equals the path bound "
            f"on {same} (the family H13 leaves out binds on the others). Held-out scores of each formula "
            "on the same instances (the calibration is fitted to H13, the model's own formula):", "",
            "| model | Spearman, H6 | Spearman, H13 | Spearman, schedule | median abs error, H6 | "
            "median abs error, H13 | median abs error, schedule |",
            "|---|---|---|---|---|---|---|"]
    for label, inst in (("uncalibrated", before), ("calibrated on the other half", after)):
        evs = [evaluate(inst, parse_plan(r["plan"])) for r in held]
        closed = errors([evaluate(inst, parse_plan(r["plan"]), "hetero-closed").predicted_time for r in held], measured)
        h13 = errors([ev.predicted_time for ev in evs], measured)
        sched = errors([schedule_of(inst, ev).makespan for ev in evs], measured)
        out.append(f"| {label} | {_fmt(closed.spearman, 3)} | {_fmt(h13.spearman, 3)} | "
                   f"{_fmt(sched.spearman, 3)} | {100 * closed.median_abs_error:.1f}% | "
                   f"{100 * h13.median_abs_error:.1f}% | {100 * sched.median_abs_error:.1f}% |")
    out += ["", "H13 keeps H6's shape, a weighted maximum plus sums, so the stage DP, the MIPs and the kind "
            "search optimise it exactly with the stage index they already know; "
            "`benchmarks/results/schedule_bounds.md` measures it against the schedule beyond this study."]
    return out


def _commit() -> str:
    """The checkout's short commit (the code that measured and scored)."""
    return git_commit(ROOT) or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "calibration"))
    parser.add_argument("--report", default=str(ROOT / "benchmarks" / "results" / "calibration.md"))
    parser.add_argument("--passes", type=int, default=5, help="launches per plan, one per pass (the median kept)")
    parser.add_argument("--iterations", type=int, default=8, help="measured iterations per launch")
    parser.add_argument("--plans", type=int, default=None, help="only the first N plans (to try the script)")
    parser.add_argument("--profile-repeats", type=int, default=30, help="profile rounds kept (default 30)")
    parser.add_argument("--analyse-only", action="store_true", help="score the runs already in --out")
    args = parser.parse_args()
    out = Path(args.out)
    log: list = []
    if not args.analyse_only:
        measure(out, args.passes, args.iterations, log, plans=args.plans, profile_repeats=args.profile_repeats)
        (out / "load.json").write_text(json.dumps(log, indent=1) + "\n")
    elif (out / "load.json").exists():
        log = json.loads((out / "load.json").read_text())
    command = ("python benchmarks/calibration_study.py " + " ".join(sys.argv[1:])).strip()
    if not args.analyse_only:
        (out / "command.txt").write_text(command + "\n")
    elif (out / "command.txt").exists():
        command = f"{(out / 'command.txt').read_text().strip()}` (measured), then `{command}"
    analyse(out, Path(args.report), log, command)


if __name__ == "__main__":
    main()
