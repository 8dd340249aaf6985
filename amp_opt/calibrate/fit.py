"""Fit the calibration section (``formulations/calibration.md``, C1-C8, F1-F8) to measured runs.

The orchestration: the time fit (F1-F4: iteration times against C1, C3, C4, C2), the memory
fit (F5: peaks against C6, C5, C7), each with as many parameters as cross-validation across
groups of runs keeps (F8, :mod:`.crossval`), then the headroom of the runs that ran out of
memory (F6, :mod:`.memory`); each step applied on top of the ones before only as far as no
in-sample measure gets worse (F7, :mod:`.scoring`).  The parameters are :mod:`.params`, the
least squares :mod:`.lsq`, the one evaluator predicts every run (:mod:`.predict`).  The
errors reported are those of the section written.  Deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import numpy as np

from ..model.calibration import apply_calibration  # noqa: F401  (the doctest's truth)
from .crossval import CrossValidation, GroupErrors, cross_validate, group_names
from .lsq import Solution, fit_parameters, jacobian, max_parameters, refit  # noqa: F401  (max_parameters: the command's)
from .memory import Headroom, fit_headroom, held_out_misses
from .metrics import Errors, errors
from .params import Parameter, memory_candidates, section_of, time_candidates
from .predict import Predictor
from .report import fit_report
from .runs import RunRecord, RunSet
from .scoring import Scorer, guarded

TIME_NOISE = 0.05  # F2: relative noise of one run's iteration time (sigma)
MEMORY_NOISE = 0.02  # F2: relative noise of one run's peak memory


@dataclass(frozen=True)
class PartFit:
    """One fit (time or memory): what was fitted, and predicted against measured before and after.

    ``cv`` is F8's cross-validation (None with fewer than three runs, or when not asked for);
    its held-out predictions are each run's prediction by a fit that did not see it (nor, with
    several groups, any run of its group).  ``groups`` reports each group's errors.
    """

    what: str
    records: tuple[int, ...]  # indices in RUNS.json
    measured: tuple[float, ...]
    before: tuple[float, ...]
    after: tuple[float, ...]
    solution: Solution
    cv: CrossValidation | None = None
    groups: tuple[GroupErrors, ...] = ()

    @property
    def values(self) -> dict[str, float]:
        return {p.name: p.value(x) for p, x in zip(self.solution.parameters, self.solution.x)}

    @property
    def held_out(self) -> tuple[float, ...] | None:
        return self.cv.held_out if self.cv is not None else None

    def errors(self) -> dict[str, Errors | None]:
        return {"uncalibrated": errors(self.before, self.measured), "calibrated": errors(self.after, self.measured),
                "held_out": errors(self.held_out, self.measured) if self.cv is not None else None}

    def to_json(self) -> dict[str, Any]:
        errs = self.errors()
        return {
            "runs": list(self.records),
            "parameters": [{"name": p.name, "value": p.value(x), "initial": p.initial}
                           for p, x in zip(self.solution.parameters, self.solution.x)],
            "shrink": self.solution.shrink,
            "in_sample": {"uncalibrated": errs["uncalibrated"].to_json(), "calibrated": errs["calibrated"].to_json()},
            "held_out": errs["held_out"].to_json() if errs["held_out"] else None,
            "cross_validation": self.cv.to_json() if self.cv is not None else None,
            "groups": [g.to_json() for g in self.groups],
        }

    def with_after(self, after) -> "PartFit":
        """The part with the predictions of the section written (after every step)."""
        after = tuple(float(v) for v in after)
        groups = self.cv.per_group(self.records, self.measured, self.before, after) if self.cv else ()
        return replace(self, after=after, groups=groups)


def _fit_part(what: str, records: Sequence[RunRecord], measured: np.ndarray, predict,
              candidates: Sequence[Parameter], noise: float, limit: int | None, cv: bool,
              groups: Sequence[str]) -> PartFit:
    """F1-F4 on every run, then F8: the parameter count cross-validation keeps, refitted."""
    def residual_on(idx):
        recs, meas = [records[i] for i in idx], measured[idx]
        return lambda params, x: np.log(predict(recs, section_of(params, x)) / meas)

    every = np.arange(len(records))
    full = fit_parameters(residual_on(every), candidates, len(records), noise, limit=limit)
    before = predict(records, {})
    solution, cross = full, None
    if cv:
        named = {p.name: p for p in candidates}
        order = [named[n] for n in full.order]
        start = {p.name: x for p, x in zip(full.parameters, full.x)}
        at = np.array([start[p.name] for p in order])
        # The Jacobian at the full fit, once: each fold starts there, on its own rows and columns.
        J = jacobian(lambda v: residual_on(every)(order, v), at, residual_on(every)(order, at),
                     [p.x_bounds() for p in order]) if order else np.zeros((len(records), 0))

        def refit_predict(k, train, test):
            sol = refit(residual_on(train), order[:k], noise, start, J[np.ix_(train, range(k))])
            return predict([records[i] for i in test], section_of(sol.parameters, sol.x))

        cross = cross_validate(refit_predict, len(order), measured, before, groups)
        if cross is not None and cross.chosen < len(order):
            solution = refit(residual_on(every), order[:cross.chosen], noise, start)
    after = predict(records, section_of(solution.parameters, solution.x))
    return PartFit(what, tuple(r.index for r in records), tuple(float(m) for m in measured),
                   tuple(float(v) for v in before), tuple(float(v) for v in after), solution, cross)


@dataclass(frozen=True)
class Calibration:
    """The fitted section and how it was obtained (:func:`fit_calibration`).

    ``time`` and ``memory`` report their errors on ``section`` as written (after every step);
    ``wrong`` lists the runs whose outcome (finished, out of memory) the uncalibrated and the
    calibrated model predict wrongly (F6); ``misses`` the runs that failed (out of memory or
    otherwise) that each model calls feasible under the memory they ran with, and ``held_out_misses``
    per group those of the group the model calls feasible when its headroom (F6) was fitted
    without the group."""

    section: dict
    time: PartFit | None
    memory: PartFit | None
    headroom: tuple[Headroom, ...]
    runs: Mapping[str, Any] = field(default_factory=dict)  # counts by outcome, instances used
    notes: tuple[str, ...] = field(default=())
    wrong: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # "uncalibrated" / "calibrated"
    misses: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # "uncalibrated" / "calibrated"
    held_out_misses: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # group -> failed runs (F8)

    def fit_report(self, *, date: str | None = None) -> dict[str, Any]:
        """The ``fit`` entry written into the section (``date`` default: today, UTC)."""
        return fit_report(self, date=date)


def _scaled(part: PartFit, t: float) -> PartFit:
    """The part with its fitted step scaled by t (F7)."""
    sol = part.solution
    return replace(part, solution=Solution(sol.parameters, tuple(t * x for x in sol.x), sol.shrink * t,
                                           sol.iterations, sol.order))


def _step(score, current, section, part):
    """F7 on a part's fitted step: (section, scores, part scaled to what was kept)."""
    sol, base = part.solution, section
    section, t, current = guarded(score, current, base, lambda t: section_of(sol.parameters,
                                                                            [t * x for x in sol.x], base))
    return section, current, _scaled(part, t)


def _misses(predictor: Predictor, failed: Sequence[RunRecord], section) -> tuple[int, ...]:
    """The failed runs a section's model calls feasible under the memory each ran with (eq. F6)."""
    return tuple(r.index for r, rooms in zip(failed, predictor.rooms(failed, section)) if min(rooms.values()) >= 0)


def _failure_notes(runs: RunSet) -> list[str]:
    """What the report says of failed runs: out-of-memory runs compared with the device memory,
    runs that failed with an error (no parameter is fitted to them)."""
    notes = []
    unlimited = [r.index for r in runs.records if r.failed == "oom" and r.memory_limit is None]
    if unlimited:
        notes.append(f"out-of-memory runs {unlimited} carry no memory_limit: compared with the instance's device "
                     "memory")
    skipped = [r.index for r in runs.records if r.failed == "error"]
    if skipped:
        notes.append(f"runs that failed with an error fit no parameter (their cause is unknown); the model's "
                     f"verdict on them is reported: {skipped}")
    return notes


def fit_calibration(runs: RunSet, *, cv: bool = True, max_parameters: int | None = None) -> Calibration:
    """Fit the calibration section to measured runs (time F1-F4, memory F5, out of memory F6),
    with the parameter counts cross-validation across groups keeps (F8), each step kept only
    as far as it leaves the in-sample fit no worse (F7).

    Parameters
    ----------
    runs : RunSet
        Records bound to their uncalibrated instances (:func:`amp_opt.calibrate.runs.bind_runs`).
    cv : bool
        Cross-validate across groups of runs (F8); without it every parameter F3 selects is kept.
    max_parameters : int, optional
        Cap on the free parameters of each fit (default: ceil(runs / 2), F3).

    Returns
    -------
    Calibration
        Its parts' errors are those of the section written.

    Examples
    --------
    >>> from amp_opt.calibrate.runs import bind_runs, load_uncalibrated, parse_runs
    >>> from amp_opt import evaluate, parse_plan
    >>> doc, inst = load_uncalibrated("instances/amp_het_cluster.json")
    >>> plans = [{"tp": 1, "dp": 4, "pp": 4, "micro_batch": b, "partition": [0, 7, 14, 20, 30]} for b in (1, 2, 4)]
    >>> slow_t4 = apply_calibration(inst, {"device_types": {"T4": {"compute_scale": 1.3}}})  # the "truth"
    >>> times = [evaluate(slow_t4, parse_plan(p)).predicted_time for p in plans]
    >>> runs = bind_runs(parse_runs([{"plan": p, "iteration_time": t} for p, t in zip(plans, times)]), inst)
    >>> cal = fit_calibration(runs, cv=False, max_parameters=1)
    >>> {k: round(v, 2) for k, v in cal.time.values.items()}, cal.time.errors()["calibrated"].max_abs_error < 0.01
    ({'compute_scale[T4]': 1.3}, True)
    """
    finished = [r for r in runs.records if r.finished]
    peaks = [r for r in finished if r.peak_memory is not None]
    outcomes = [r for r in runs.records if r.failed != "error"]
    failed = [r for r in runs.records if not r.finished]
    predictor = Predictor(runs)
    score = Scorer(predictor, finished, peaks, outcomes)
    notes = []
    time = memory = None
    section: dict = {}
    uncalibrated = current = score(section)
    if finished:
        measured = np.array([r.iteration_time for r in finished])
        time = _fit_part("time", finished, measured, predictor.times, time_candidates(runs, finished, predictor),
                         TIME_NOISE, max_parameters, cv, group_names(runs, finished))
        section, current, time = _step(score, current, section, time)
    else:
        notes.append("no finished runs: iteration times not calibrated")
    if peaks:
        measured = np.array([r.peak_memory for r in peaks])
        memory = _fit_part("memory", peaks, measured, predictor.peaks, memory_candidates(runs, peaks),
                           MEMORY_NOISE, max_parameters, cv, group_names(runs, peaks))
        section, current, memory = _step(score, current, section, memory)
    held_misses = held_out_misses(runs, predictor, section, dict(zip((r.index for r in runs.records),
                                                                     group_names(runs, runs.records)))) if cv else {}
    section, headroom, current = fit_headroom(runs, predictor, section, score, current)
    # The reported errors are those of the section written, after every step.
    if time:
        time = time.with_after(predictor.times(finished, section))
    if memory:
        memory = memory.with_after(predictor.peaks(peaks, section))
    notes += _failure_notes(runs)
    summary = {"finished": len(finished), "out_of_memory": sum(r.failed == "oom" for r in runs.records),
               "error": sum(r.failed == "error" for r in runs.records), "with_peak_memory": len(peaks),
               "instances": sorted(k for k in runs.instances if k is not None),
               "groups": list(dict.fromkeys(group_names(runs, runs.records)))}
    return Calibration(section, time, memory, headroom, summary, tuple(notes),
                       {"uncalibrated": uncalibrated.wrong, "calibrated": current.wrong},
                       {"uncalibrated": _misses(predictor, failed, {}), "calibrated": _misses(predictor, failed, section)},
                       held_misses)
