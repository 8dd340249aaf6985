"""What a calibration reports: the ``fit`` entry written into the section and the text ``calibrate``
prints (``formulations/calibration.md``): parameters, in-sample and held-out errors, per group
the held-out error and rank correlation (F8), the runs that ran out of memory (F6) and the
failed runs the model calls feasible (misses)."""

from __future__ import annotations

import datetime
import math
from typing import Any

from .lsq import max_parameters
from .runs import COST_MODEL


def fit_report(calibration, *, date: str | None = None) -> dict[str, Any]:
    """The ``fit`` entry of a :class:`~.fit.Calibration` (``date`` default: today, UTC)."""
    c = calibration
    return {
        "date": date or datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
        "cost_model": COST_MODEL,
        "runs": dict(c.runs),
        "time": c.time.to_json() if c.time else None,
        "memory": c.memory.to_json() if c.memory else None,
        "out_of_memory": [{"device_type": a.device_type, "memory_headroom": a.headroom, "wanted": a.wanted,
                           "runs": list(a.records), "still_predicted_to_fit": list(a.unexplained),
                           "limited_by_finished_run": a.limited_by, "shrink": a.shrink} for a in c.headroom],
        "outcomes_predicted_wrong": {k: list(v) for k, v in c.wrong.items()},
        "failed_predicted_feasible": {k: list(v) for k, v in c.misses.items()},
        "failed_predicted_feasible_held_out": {k: list(v) for k, v in c.held_out_misses.items()},
        "notes": list(c.notes),
    }


def _pct(value) -> str:
    return "-" if value is None or math.isnan(value) else f"{100 * value:.1f}%"


def _num(value) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3f}"


def _row(label: str, e) -> str:
    return (f"  {label:<22} {_pct(e.median_abs_error):>12} {_pct(e.max_abs_error):>10} "
            f"{_num(e.rms_log_error):>8} {_num(e.spearman):>9}")


def format_part(part, unit: str) -> list[str]:
    """Lines describing one fit (time or memory): parameters; errors uncalibrated, in sample and
    held out; per group, held out against uncalibrated (F8)."""
    cv = part.cv
    kept = ""
    if cv is not None:
        kept = (f"; cross-validation ({cv.scheme}) kept {cv.chosen} of {len(cv.rms) - 1} "
                "(held-out ranking no worse than uncalibrated in every group)")
    lines = [f"{part.what}: {len(part.solution.parameters)} parameter(s) fitted from {len(part.records)} runs "
             f"(at most {max_parameters(len(part.records))}){kept}"
             + (f", shrunk to {part.solution.shrink:.2f} of the fit (never worse than uncalibrated)"
                if part.solution.shrink < 1 else "")]
    if part.solution.parameters:
        lines.append(f"  {'parameter':<34} {'value':>14} {'uncalibrated':>14}")
        for p, x in zip(part.solution.parameters, part.solution.x):
            lines.append(f"  {p.name:<34} {p.value(x):>14.6g} {p.initial:>14.6g}")
    lines.append(f"  {unit:<22} {'median |err|':>12} {'max |err|':>10} {'RMS log':>8} {'Spearman':>9}")
    for label, e in part.errors().items():
        if e is not None:
            lines.append(_row(label.replace("_", "-"), e))
    for g in part.groups:
        lines.append(f"  group {g.group} ({len(g.runs)} runs)")
        lines.append(_row("  uncalibrated", g.uncalibrated))
        lines.append(_row("  held-out", g.held_out))
    return lines


def format_outcomes(calibration) -> list[str]:
    """Lines on the runs that ran out of memory (F6), the outcomes the model gets wrong and the
    failed runs it calls feasible."""
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
    misses = calibration.misses.get("calibrated", ())
    if misses:
        lines.append(f"missed: runs {list(misses)} failed but the calibrated model calls them feasible "
                     f"(uncalibrated: {list(calibration.misses.get('uncalibrated', ()))})")
    for group, held in calibration.held_out_misses.items():
        lines.append(f"group {group}, headroom fitted without it: "
                     + (f"runs {list(held)} failed but are called feasible" if held else "every failed run flagged"))
    return lines


def format_report(calibration, output: str) -> str:
    """The text report of a calibration."""
    runs = calibration.runs
    groups = runs.get("groups", [])
    lines = [f"calibrated from {runs['finished'] + runs['out_of_memory'] + runs['error']} runs "
             f"({runs['finished']} finished, {runs['out_of_memory']} out of memory, {runs['error']} failed; "
             f"{runs['with_peak_memory']} with peak memory) on {1 + len(runs['instances'])} instance(s), "
             f"{len(groups)} group(s); cost model {COST_MODEL}"]
    if calibration.time:
        lines += format_part(calibration.time, "iteration time")
    if calibration.memory:
        lines += format_part(calibration.memory, "peak memory")
    lines += format_outcomes(calibration)
    lines += [f"note: {n}" for n in calibration.notes]
    lines.append(f"wrote {output}")
    return "\n".join(lines) + "\n"
