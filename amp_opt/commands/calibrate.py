"""``calibrate``: fit the cost model's corrections to measured runs and write them into a copy of the instance.

The fit is :func:`amp_opt.calibrate.fit.fit_calibration` (``formulations/calibration.md``).
The copy's ``calibration`` section is replaced by the fitted one, with its ``fit``
report; entries of device types that none of the runs used are carried over from
the old section (the runs say nothing about them).
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

from ..calibrate.fit import fit_calibration, max_parameters
from ..calibrate.runs import bind_runs, load_runs, load_uncalibrated
from ..errors import InputError
from ..model.load import parse_instance
from .common import positive_int, write_json_document


def add_arguments(p) -> None:
    """The options of the command."""
    p.add_argument("instance", help="instance JSON file to calibrate (its calibration section is refitted)")
    p.add_argument("runs", help="RUNS.json: a list of run records (python -m amp_opt run -o writes them)")
    p.add_argument("-o", "--output", required=True, metavar="CALIBRATED.json",
                   help="where to write the calibrated copy of the instance")
    p.add_argument("--max-parameters", type=positive_int, default=None, metavar="K",
                   help="at most K free parameters per fit (default: one per two runs, rounded up)")
    p.add_argument("--no-loo", action="store_true", help="skip the leave-one-out refits (one per run)")
    p.add_argument("--json", action="store_true", help="print the fit report as JSON instead of text")


def calibrated_document(document: dict, calibration, used_types, *, date: str | None = None) -> dict:
    """A copy of the instance document with the fitted calibration section (and its fit report)."""
    out = copy.deepcopy(document)
    section = copy.deepcopy(calibration.section)
    old = document.get("calibration", {}).get("device_types", {})
    kept = {name: dict(entry) for name, entry in old.items() if name not in used_types}
    if kept:
        section.setdefault("device_types", {})
        for name, entry in kept.items():
            section["device_types"].setdefault(name, entry)
    section["fit"] = calibration.fit_report(date=date)
    if kept:
        section["fit"]["carried_over"] = sorted(kept)
    out["calibration"] = section
    return out


def _pct(value: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{100 * value:.1f}%"


def _num(value) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3f}"


def format_part(part, unit: str) -> list[str]:
    """Lines describing one fit (time or memory): parameters and errors before / after / LOO."""
    lines = [f"{part.what}: {len(part.solution.parameters)} parameter(s) fitted from {len(part.records)} runs "
             f"(at most {max_parameters(len(part.records))})"
             + (f", shrunk to {part.solution.shrink:.2f} of the fit (never worse than uncalibrated)"
                if part.solution.shrink < 1 else "")]
    if part.solution.parameters:
        lines.append(f"  {'parameter':<34} {'value':>14} {'uncalibrated':>14}")
        for p, x in zip(part.solution.parameters, part.solution.x):
            lines.append(f"  {p.name:<34} {p.value(x):>14.6g} {p.initial:>14.6g}")
    lines.append(f"  {unit:<16} {'median |err|':>12} {'max |err|':>10} {'RMS log':>8} {'Spearman':>9}")
    for label, e in part.errors().items():
        label = label.replace("_", "-")
        if e is not None:
            lines.append(f"  {label:<16} {_pct(e.median_abs_error):>12} {_pct(e.max_abs_error):>10} "
                         f"{_num(e.rms_log_error):>8} {_num(e.spearman):>9}")
    return lines


def format_headroom(calibration) -> list[str]:
    """Lines on the runs that ran out of memory (F6) and the outcomes the model gets wrong."""
    lines = []
    for a in calibration.headroom:
        line = (f"out of memory: memory_headroom[{a.device_type}] = {a.headroom:.6g} bytes off the capacity "
                "(predicted peaks unchanged)")
        if a.records:
            line += f"; runs {list(a.records)} are predicted not to fit under the memory they ran with"
        if a.unexplained:
            why = (f"finished run {a.limited_by} fits with less room" if a.limited_by is not None
                   else f"the step was shrunk to {a.shrink:.2f} to keep the fit no worse")
            line += (f"; runs {list(a.unexplained)} are still predicted to fit ({a.wanted:.6g} bytes would be "
                     f"needed, but {why})")
        lines.append(line)
    wrong = calibration.wrong.get("calibrated", ())
    finished = [i for i in wrong if i not in {j for a in calibration.headroom for j in a.unexplained}]
    if wrong:
        lines.append(f"outcomes predicted wrongly: runs {list(wrong)} (uncalibrated: "
                     f"{list(calibration.wrong.get('uncalibrated', ()))})"
                     + (f"; runs {finished} finished but are predicted not to fit" if finished else ""))
    return lines


def format_report(calibration, output: str) -> str:
    """The text report of a calibration."""
    runs = calibration.runs
    lines = [f"calibrated from {runs['finished'] + runs['out_of_memory'] + runs['error']} runs "
             f"({runs['finished']} finished, {runs['out_of_memory']} out of memory, {runs['error']} failed; "
             f"{runs['with_peak_memory']} with peak memory) on {1 + len(runs['instances'])} instance(s); "
             "cost model hetero"]
    if calibration.time:
        lines += format_part(calibration.time, "iteration time")
    if calibration.memory:
        lines += format_part(calibration.memory, "peak memory")
    lines += format_headroom(calibration)
    lines += [f"note: {n}" for n in calibration.notes]
    lines.append(f"wrote {output}")
    return "\n".join(lines) + "\n"


def run(args) -> int:
    document, base = load_uncalibrated(args.instance)
    records = load_runs(args.runs)
    if not records:
        raise InputError(args.runs, "holds no runs")
    runs = bind_runs(records, base, where=Path(args.runs).name, instance_path=args.instance)
    calibration = fit_calibration(runs, loo=not args.no_loo, max_parameters=args.max_parameters)
    used = {t for r in runs.records for t in runs.device_types(r)}
    out = calibrated_document(document, calibration, used)
    parse_instance(out, base_dir=Path(args.instance).parent)  # the copy loads (schema and all)
    write_json_document(out, args.output, source=args.instance)
    if args.json:
        print(json.dumps(out["calibration"], indent=2))
    else:
        print(format_report(calibration, args.output), end="")
    return 0

