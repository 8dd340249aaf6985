"""``calibrate``: fit the cost model's corrections to measured runs and write them into a copy of the instance.

The fit is :func:`amp_opt.calibrate.fit.fit_calibration` (``formulations/calibration.md``).
The copy's ``calibration`` section is replaced by the fitted one, with its ``fit``
report; entries of device types that none of the runs used are carried over from
the old section (the runs say nothing about them).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from ..calibrate.fit import fit_calibration
from ..calibrate.report import format_report
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
    p.add_argument("--no-cv", "--no-loo", dest="no_cv", action="store_true",
                   help="skip the cross-validation across groups of runs (keep every parameter the fit selects)")
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


def run(args) -> int:
    document, base = load_uncalibrated(args.instance)
    records = load_runs(args.runs)
    if not records:
        raise InputError(args.runs, "holds no runs")
    runs = bind_runs(records, base, where=Path(args.runs).name, instance_path=args.instance)
    calibration = fit_calibration(runs, cv=not args.no_cv, max_parameters=args.max_parameters)
    used = {t for r in runs.records for t in runs.device_types(r)}
    out = calibrated_document(document, calibration, used)
    parse_instance(out, base_dir=Path(args.instance).parent)  # the copy loads (schema and all)
    write_json_document(out, args.output, source=args.instance)
    if args.json:
        print(json.dumps(out["calibration"], indent=2))
    else:
        print(format_report(calibration, args.output), end="")
    return 0

