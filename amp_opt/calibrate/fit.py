"""Fit the calibration section (``formulations/calibration.md``, C1-C8, F1-F7) to measured runs.

Two independent fits, each by regularised least squares on the relative (log)
error, with the one evaluator (:func:`amp_opt.model.evaluate.evaluate`) predicting
every run under the candidate corrections:

* time (F1): iteration times of finished runs against C1 ``compute_scale``, C3
  ``step_overhead`` (per device type the runs use), C4 link factors (intra, inter)
  and C2 ``batch_exponent`` (per device type);
* memory (F5): peak memory of finished runs against C6 ``activation_factor``, C5
  ``memory_overhead`` (per device type) and C7 ``gradient_buffer_bytes_per_param``;
  then (F6) the capacity of a device type is lowered (C8 ``memory_headroom``, which
  no predicted peak includes) until the runs that ran out of memory are predicted
  not to fit under the memory they ran with, as far as the finished runs allow.

Every parameter x is unitless with prior N(0, 1) around the uncalibrated model
(x = 0): value = initial * exp(scale * x) for factors, initial + scale * x for
additive ones.  The objective is sum_i r_i^2 + sigma^2 |x|^2, r_i = log(predicted_i
/ measured_i), sigma the relative noise of one run (F2).  Only parameters the runs
can tell apart enter, at most ceil(runs / 2) of them: all jointly when that many
are identifiable, else one at a time, each round the one whose joint fit lowers the
objective most (F3).  The fit is then shrunk toward the uncalibrated model until
neither the RMS log error nor the median absolute error on the runs is worse (F4).
Each step (time, memory, out of memory) is applied on top of the ones before only as
far as no in-sample measure gets worse (F7), and the errors reported are those of
the section written.  Leave-one-out repeats a part's fit without each run.
Deterministic.
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..model.calibration import apply_calibration
from .metrics import Errors, errors
from .predict import COST_MODEL, Predictor
from .runs import RunRecord, RunSet

TIME_NOISE = 0.05  # F2: relative noise of one run's iteration time (sigma)
MEMORY_NOISE = 0.02  # F2: relative noise of one run's peak memory
SHRINK_STEPS = (1.0, 0.75, 0.5, 0.25, 0.0)  # F4
FD_STEP = 1e-4  # finite-difference step in the unitless parameters
MAX_ITERATIONS = 100
TOLERANCE = 1e-4  # stop when a step lowers the objective by less than this many prior units (lam)


@dataclass(frozen=True)
class Parameter:
    """One correction the fit may move (see the module docstring for the coordinates).

    ``key`` is its place in the calibration section: ``("device_types", NAME, FIELD)``,
    ``("links", "intra")`` or ``(FIELD,)``.  ``lower``/``upper`` bound the value.
    """

    name: str
    key: tuple[str, ...]
    initial: float
    scale: float
    log: bool
    lower: float = -math.inf
    upper: float = math.inf

    def value(self, x: float) -> float:
        v = self.initial * math.exp(self.scale * x) if self.log else self.initial + self.scale * x
        return min(max(v, self.lower), self.upper)

    def x_bounds(self) -> tuple[float, float]:
        def coord(v):
            if self.log:
                return math.log(v / self.initial) / self.scale if v > 0 else -math.inf
            return (v - self.initial) / self.scale

        return (coord(self.lower) if math.isfinite(self.lower) else -math.inf,
                coord(self.upper) if math.isfinite(self.upper) else math.inf)


def section_of(parameters: Sequence[Parameter], x: Sequence[float], base: Mapping | None = None) -> dict:
    """The calibration section holding the parameters' values at ``x`` (on top of ``base``).

    Examples
    --------
    >>> kappa = Parameter("compute_scale[T4]", ("device_types", "T4", "compute_scale"), 1.0, 1.0, True)
    >>> link = Parameter("links.inter", ("links", "inter"), 1.0, 1.0, True)
    >>> section_of([kappa, link], [math.log(2.0), 0.0])
    {'device_types': {'T4': {'compute_scale': 2.0}}, 'links': {'inter': 1.0}}
    """
    out: dict[str, Any] = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in (base or {}).items()}
    for p, xi in zip(parameters, x):
        value = p.value(float(xi))
        if p.key[0] == "device_types":
            types = out.setdefault("device_types", {})
            types[p.key[1]] = {**types.get(p.key[1], {}), p.key[2]: value}
        elif p.key[0] == "links":
            out.setdefault("links", {})[p.key[1]] = value
        else:
            out[p.key[0]] = value
    return out


# ---------------------------------------------------------------- the least-squares core

@dataclass(frozen=True)
class Solution:
    """A fit of some parameters: their unitless coordinates and the objective's parts."""

    parameters: tuple[Parameter, ...]
    x: tuple[float, ...]
    shrink: float  # F4: the fraction of the fitted step kept
    iterations: int


def _objective(r: np.ndarray, x: np.ndarray, lam: float) -> float:
    return float(r @ r + lam * (x @ x))


def _jacobian(residuals, x: np.ndarray, r: np.ndarray, bounds) -> np.ndarray:
    J = np.empty((len(r), len(x)))
    for j in range(len(x)):
        h = FD_STEP if x[j] + FD_STEP <= bounds[j][1] else -FD_STEP
        e = x.copy()
        e[j] += h
        J[:, j] = (residuals(e) - r) / h
    return J


def _least_squares(residuals: Callable[[np.ndarray], np.ndarray], x0: np.ndarray, lam: float,
                   bounds: Sequence[tuple[float, float]]) -> tuple[np.ndarray, float, int]:
    """Levenberg-Marquardt with the iterate clipped to the bounds, from ``x0``: every accepted
    step lowers the objective, so the result is never worse than ``x0`` on it.
    Returns (x, objective, iterations)."""
    x = np.array(x0, dtype=float)
    r = residuals(x)
    F = _objective(r, x, lam)
    if len(x) == 0:
        return x, F, 0
    lo, hi = np.array([b[0] for b in bounds]), np.array([b[1] for b in bounds])
    mu = 1e-3
    for it in range(1, MAX_ITERATIONS + 1):
        J = _jacobian(residuals, x, r, bounds)
        g = J.T @ r + lam * x
        H = J.T @ J + lam * np.eye(len(x))
        improved = done = False
        while mu < 1e12:
            step = np.linalg.solve(H + mu * np.diag(np.diag(H)), -g)
            xn = np.clip(x + step, lo, hi)
            rn = residuals(xn)
            Fn = _objective(rn, xn, lam)
            if Fn < F:
                done = F - Fn <= TOLERANCE * lam or float(np.abs(xn - x).max()) < 1e-6
                x, r, F, improved = xn, rn, Fn, True
                mu = max(mu / 10, 1e-12)
                break
            mu *= 10
        if not improved or done:
            return x, F, it
    return x, F, MAX_ITERATIONS


def identifiable(J: np.ndarray, candidates: Sequence[Parameter]) -> list[int]:
    """F3: the candidates the runs can tell apart, in priority order: a candidate whose column
    of the Jacobian at the uncalibrated model is zero (no run depends on it) or lies in the
    span of earlier ones (no run separates it from them) is left out.

    Examples
    --------
    >>> J = np.array([[1.0, 0.0, 2.0], [1.0, 0.0, 2.0]])  # the third column is twice the first
    >>> identifiable(J, ["a", "b", "c"])
    [0]
    """
    chosen: list[int] = []
    for j in range(len(candidates)):
        if not np.any(J[:, j]):
            continue
        sv = np.linalg.svd(J[:, chosen + [j]], compute_uv=False)
        if sv[-1] > 1e-6 * sv[0]:
            chosen.append(j)
    return chosen


def max_parameters(runs: int) -> int:
    """F3: at most one free parameter per two runs (rounded up).

    Examples
    --------
    >>> [max_parameters(n) for n in (1, 2, 3, 8)]
    [1, 1, 2, 4]
    """
    return (runs + 1) // 2


def fit_parameters(residual_of: Callable[[Sequence[Parameter], np.ndarray], np.ndarray],
                   candidates: Sequence[Parameter], runs: int, noise: float, *, limit: int | None = None,
                   start: Mapping[str, float] | None = None) -> Solution:
    """Select and fit parameters (F1-F4) given ``residual_of(parameters, x) -> log errors``.

    F3: the identifiable candidates are fitted jointly when there are at most
    ``max_parameters(runs)`` (or ``limit``) of them; otherwise they enter one at a time,
    each round taking the candidate whose joint fit with the chosen ones lowers the
    objective most (ties to the earlier one).  ``start`` (name -> x) warm-starts the fit.

    Examples
    --------
    Two runs, each 2.5 times slower than predicted; a scale factor explains both:

    >>> scale = Parameter("compute_scale[g]", ("device_types", "g", "compute_scale"), 1.0, 1.0, True)
    >>> predicted, measured = np.array([1.0, 3.0]), np.array([2.5, 7.5])
    >>> def residual_of(params, x):
    ...     factor = params[0].value(x[0]) if params else 1.0
    ...     return np.log(factor * predicted / measured)
    >>> sol = fit_parameters(residual_of, [scale], runs=2, noise=0.05)
    >>> [p.name for p in sol.parameters], round(sol.parameters[0].value(sol.x[0]), 2)
    (['compute_scale[g]'], 2.5)
    """
    lam = noise ** 2
    k_max = min(max_parameters(runs) if limit is None else limit, len(candidates))
    bounds = [p.x_bounds() for p in candidates]
    x0 = np.zeros(len(candidates))
    r0 = residual_of(candidates, x0)
    pool = identifiable(_jacobian(lambda v: residual_of(candidates, v), x0, r0, bounds), candidates)
    start = start or {}

    def fit(cols):
        params = [candidates[c] for c in cols]
        init = np.array([start.get(p.name, 0.0) for p in params])
        init = np.clip(init, [bounds[c][0] for c in cols], [bounds[c][1] for c in cols]) if cols else init
        return _least_squares(lambda v: residual_of(params, v), init, lam, [bounds[c] for c in cols])

    iterations = 0
    if len(pool) <= k_max:
        chosen = pool
        x, _, iterations = fit(chosen)
    else:
        chosen, x = [], np.zeros(0)
        F = float(r0 @ r0)
        while len(chosen) < k_max:
            best = None
            for j in pool:
                if j not in chosen:
                    cols = sorted(chosen + [j])
                    xc, Fc, its = fit(cols)
                    iterations += its
                    if Fc < F - 1e-15 and (best is None or Fc < best[2] - 1e-15):
                        best = (cols, xc, Fc)
            if best is None:
                break
            chosen, x, F = best
    params = tuple(candidates[c] for c in chosen)
    # F4: never worse than the uncalibrated model on the runs given, by either measure.
    base = _scores(residual_of(params, np.zeros(len(params))))
    for t in SHRINK_STEPS:
        kept = t * np.asarray(x)
        if t == 0.0 or all(a <= b + 1e-12 for a, b in zip(_scores(residual_of(params, kept)), base)):
            return Solution(params, tuple(float(v) for v in kept), t, iterations)
    raise AssertionError("unreachable: the last shrink step is the uncalibrated model")  # pragma: no cover


def _scores(r: np.ndarray) -> tuple[float, float]:
    """(RMS log error, median absolute relative error) of log residuals."""
    if len(r) == 0:
        return (0.0, 0.0)
    return (float(np.sqrt(np.mean(r ** 2))), float(np.median(np.abs(np.expm1(r)))))


# ---------------------------------------------------------------- the two fits

def time_candidates(runs: RunSet, records: Sequence[RunRecord], predictor: Predictor) -> list[Parameter]:
    """C1, C3 per device type the records use, C4 intra and inter, C2 per device type (priority order).

    Examples
    --------
    >>> from amp_opt.calibrate.runs import bind_runs, load_uncalibrated, parse_runs
    >>> inst = load_uncalibrated("instances/amp_het_cluster.json")[1]
    >>> plan = {"tp": 1, "dp": 4, "pp": 4, "micro_batch": 1, "partition": [0, 7, 14, 20, 30]}
    >>> runs = bind_runs(parse_runs([{"plan": plan, "iteration_time": 1.0}]), inst)
    >>> [p.name for p in time_candidates(runs, runs.records, Predictor(runs))][:3]
    ['compute_scale[T4]', 'step_overhead[T4]', 'compute_scale[V100-16GB]']
    """
    types = sorted({t for r in records for t in runs.device_types(r)})
    stage_seconds: dict[str, list[float]] = {t: [] for t in types}
    for r, ev in zip(records, predictor.evaluations(records, {})):
        for s in ev.stages:
            for t in s.device_types:
                stage_seconds[t].append(s.compute)
    out = []
    for t in types:
        out.append(Parameter(f"compute_scale[{t}]", ("device_types", t, "compute_scale"), 1.0, 1.0, True))
        # The prior scale of a step overhead: the typical stage's seconds per micro-batch on this type.
        scale = float(np.median(stage_seconds[t])) if stage_seconds[t] else 1e-3
        out.append(Parameter(f"step_overhead[{t}]", ("device_types", t, "step_overhead"), 0.0, scale, False, 0.0))
    for kind in ("intra", "inter"):
        out.append(Parameter(f"links.{kind}", ("links", kind), 1.0, 1.0, True))
    for t in types:
        out.append(Parameter(f"batch_exponent[{t}]", ("device_types", t, "batch_exponent"), 1.0, 0.5, False, 0.0, 2.0))
    return out


def memory_candidates(runs: RunSet, records: Sequence[RunRecord]) -> list[Parameter]:
    """C6, C5 per device type the records use, C7 (priority order).

    Examples
    --------
    >>> from amp_opt.calibrate.runs import bind_runs, load_uncalibrated, parse_runs
    >>> inst = load_uncalibrated("instances/amp_het_cluster.json")[1]
    >>> plan = {"tp": 1, "dp": 4, "pp": 4, "micro_batch": 1, "partition": [0, 7, 14, 20, 30]}
    >>> runs = bind_runs(parse_runs([{"plan": plan, "iteration_time": 1.0, "peak_memory": 5e9}]), inst)
    >>> [p.name for p in memory_candidates(runs, runs.records)]
    ['activation_factor', 'memory_overhead[T4]', 'memory_overhead[V100-16GB]', 'gradient_buffer_bytes_per_param']
    """
    types = sorted({t for r in records for t in runs.device_types(r)})
    peaks = {t: [r.peak_memory for r in records if t in runs.device_types(r)] for t in types}
    grad = max(inst.training.gradient_bytes for inst in runs.instances.values()) or 1.0
    out = [Parameter("activation_factor", ("activation_factor",), 1.0, 0.5, True)]
    for t in types:
        out.append(Parameter(f"memory_overhead[{t}]", ("device_types", t, "memory_overhead"), 0.0,
                             0.25 * float(np.median(peaks[t])), False))
    out.append(Parameter("gradient_buffer_bytes_per_param", ("gradient_buffer_bytes_per_param",), 0.0, grad,
                         False, 0.0))
    return out


@dataclass(frozen=True)
class PartFit:
    """One fit (time or memory): what was fitted, and predicted against measured before and after.

    ``loo`` holds each run's prediction by the fit made without it (None with fewer
    than three runs).
    """

    what: str
    records: tuple[int, ...]  # indices in RUNS.json
    measured: tuple[float, ...]
    before: tuple[float, ...]
    after: tuple[float, ...]
    solution: Solution
    loo: tuple[float, ...] | None

    @property
    def values(self) -> dict[str, float]:
        return {p.name: p.value(x) for p, x in zip(self.solution.parameters, self.solution.x)}

    def errors(self) -> dict[str, Errors | None]:
        return {"uncalibrated": errors(self.before, self.measured), "calibrated": errors(self.after, self.measured),
                "leave_one_out": errors(self.loo, self.measured) if self.loo is not None else None}

    def to_json(self) -> dict[str, Any]:
        errs = self.errors()
        return {
            "runs": list(self.records),
            "parameters": [{"name": p.name, "value": p.value(x), "initial": p.initial}
                           for p, x in zip(self.solution.parameters, self.solution.x)],
            "shrink": self.solution.shrink,
            "in_sample": {"uncalibrated": errs["uncalibrated"].to_json(), "calibrated": errs["calibrated"].to_json()},
            "leave_one_out": errs["leave_one_out"].to_json() if errs["leave_one_out"] else None,
        }


def _fit_part(what: str, records: Sequence[RunRecord], measured: np.ndarray, predict, candidates_of, noise: float,
              limit: int | None, loo: bool) -> PartFit:
    def solve(recs, meas, start=None):
        def residual_of(params, x):
            return np.log(predict(recs, section_of(params, x)) / meas)

        return fit_parameters(residual_of, candidates_of(recs), len(recs), noise, limit=limit, start=start)

    solution = solve(records, measured)
    before = predict(records, {})
    after = predict(records, section_of(solution.parameters, solution.x))
    held = None
    if loo and len(records) >= 3:
        # Each fold repeats the whole fit without one run, warm-started at the full fit.
        start = {p.name: x for p, x in zip(solution.parameters, solution.x)}
        held = []
        for i in range(len(records)):
            keep = [j for j in range(len(records)) if j != i]
            sol = solve([records[j] for j in keep], measured[keep], start)
            held.append(float(predict([records[i]], section_of(sol.parameters, sol.x))[0]))
        held = tuple(held)
    return PartFit(what, tuple(r.index for r in records), tuple(float(m) for m in measured),
                   tuple(float(v) for v in before), tuple(float(v) for v in after), solution, held)


@dataclass(frozen=True)
class Scores:
    """The in-sample fit of a section on the runs given, every measure a step may not worsen (F7):
    (RMS log error, median absolute relative error) of the iteration times and of the peaks, and
    the runs whose outcome the model predicts wrongly (a finished run predicted not to fit, or one
    that ran out of memory predicted to fit, each under the memory it ran with, eq. F6)."""

    time: tuple[float, float]
    memory: tuple[float, float]
    wrong: tuple[int, ...]  # indices in RUNS.json

    def no_worse_than(self, other: "Scores") -> bool:
        return (all(a <= b + 1e-12 for a, b in zip(self.time + self.memory, other.time + other.memory))
                and len(self.wrong) <= len(other.wrong))


class _Scorer:
    """The :class:`Scores` of a section on the runs (the one evaluator, through the predictor)."""

    def __init__(self, predictor: Predictor, finished: Sequence[RunRecord], peaks: Sequence[RunRecord],
                 outcomes: Sequence[RunRecord]):
        self.predictor, self.finished, self.peaks, self.outcomes = predictor, finished, peaks, outcomes
        self.times = np.array([r.iteration_time for r in finished])
        self.bytes = np.array([r.peak_memory for r in peaks])

    def __call__(self, section) -> Scores:
        p = self.predictor
        time = _scores(np.log(p.times(self.finished, section) / self.times)) if self.finished else (0.0, 0.0)
        memory = _scores(np.log(p.peaks(self.peaks, section) / self.bytes)) if self.peaks else (0.0, 0.0)
        return Scores(time, memory, wrong_outcomes(self.outcomes, p.rooms(self.outcomes, section)))


def wrong_outcomes(records: Sequence[RunRecord], rooms: Sequence[Mapping[str, float]]) -> tuple[int, ...]:
    """The records whose outcome the rooms (eq. F6) contradict: finished with a negative room, or
    out of memory with none.

    Examples
    --------
    >>> from amp_opt.calibrate.runs import parse_runs
    >>> plan = {"tp": 1, "dp": 1, "pp": 2, "micro_batch": 1, "partition": [0, 3, 6]}
    >>> recs = parse_runs([{"plan": plan, "iteration_time": 1.0}, {"plan": plan, "failed": "oom"}])
    >>> wrong_outcomes(recs, [{"cpu": -5.0}, {"cpu": -5.0}]), wrong_outcomes(recs, [{"cpu": 5.0}, {"cpu": 5.0}])
    ((0,), (1,))
    """
    out = []
    for r, room in zip(records, rooms):
        fits = min(room.values()) >= 0
        if (r.finished and not fits) or (r.failed == "oom" and fits):
            out.append(r.index)
    return tuple(out)


def _guarded(score: _Scorer, before: Scores, base: dict, section_at: Callable[[float], dict]
             ) -> tuple[dict, float, Scores]:
    """F7: the step's section at the largest t of 1, 0.75, 0.5, 0.25 at which no measure of
    :class:`Scores` is worse than ``before`` (the scores of ``base``); t = 0 refuses the step."""
    for t in SHRINK_STEPS[:-1]:
        section = section_at(t)
        scores = score(section)
        if scores.no_worse_than(before):
            return section, t, scores
    return base, 0.0, before


@dataclass(frozen=True)
class Headroom:
    """F6: a device type's capacity lowered (C8 ``memory_headroom``) so that runs that ran out of
    memory are predicted not to fit under the memory they ran with, as far as the runs of the
    type that finished allow (they must still fit under theirs).

    ``wanted`` is the headroom that would explain every out-of-memory run of the type;
    ``headroom`` the one written (less when a finished run needed more room than it leaves, or
    when F7 shrank the step by ``shrink``).  ``records`` are the out-of-memory runs now predicted
    not to fit, ``unexplained`` those still predicted to fit, ``limited_by`` the finished run
    whose room bounded the headroom (None: not bounded)."""

    device_type: str
    headroom: float  # bytes, the value written
    wanted: float  # bytes
    records: tuple[int, ...]
    unexplained: tuple[int, ...] = ()
    limited_by: int | None = None
    shrink: float = 1.0


@dataclass(frozen=True)
class Calibration:
    """The fitted section and how it was obtained (:func:`fit_calibration`).

    ``time`` and ``memory`` report their errors on ``section`` as written (after every step);
    ``wrong`` lists the runs whose outcome (finished, out of memory) the uncalibrated and the
    calibrated model predict wrongly (F6)."""

    section: dict
    time: PartFit | None
    memory: PartFit | None
    headroom: tuple[Headroom, ...]
    runs: Mapping[str, Any] = field(default_factory=dict)  # counts by outcome, instances used
    notes: tuple[str, ...] = field(default=())
    wrong: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # "uncalibrated" / "calibrated"

    def fit_report(self, *, date: str | None = None) -> dict[str, Any]:
        """The ``fit`` entry written into the section (``date`` default: today, UTC)."""
        return {
            "date": date or datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
            "cost_model": COST_MODEL,
            "runs": dict(self.runs),
            "time": self.time.to_json() if self.time else None,
            "memory": self.memory.to_json() if self.memory else None,
            "out_of_memory": [{"device_type": a.device_type, "memory_headroom": a.headroom, "wanted": a.wanted,
                               "runs": list(a.records), "still_predicted_to_fit": list(a.unexplained),
                               "limited_by_finished_run": a.limited_by, "shrink": a.shrink} for a in self.headroom],
            "outcomes_predicted_wrong": {k: list(v) for k, v in self.wrong.items()},
            "notes": list(self.notes),
        }


def _scaled(part: PartFit, t: float) -> PartFit:
    """The part with its fitted step scaled by t (F7)."""
    sol = part.solution
    return replace(part, solution=Solution(sol.parameters, tuple(t * x for x in sol.x), sol.shrink * t,
                                           sol.iterations))


def fit_calibration(runs: RunSet, *, loo: bool = True, max_parameters: int | None = None) -> Calibration:
    """Fit the calibration section to measured runs (time F1-F4, memory F5, out of memory F6),
    each step kept only as far as it leaves the in-sample fit no worse (F7).

    Parameters
    ----------
    runs : RunSet
        Records bound to their uncalibrated instances (:func:`amp_opt.calibrate.runs.bind_runs`).
    loo : bool
        Also compute leave-one-out predictions (one more fit per run).
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
    >>> cal = fit_calibration(runs, loo=False, max_parameters=1)
    >>> {k: round(v, 2) for k, v in cal.time.values.items()}, cal.time.errors()["calibrated"].max_abs_error < 0.01
    ({'compute_scale[T4]': 1.3}, True)
    """
    finished = [r for r in runs.records if r.finished]
    peaks = [r for r in finished if r.peak_memory is not None]
    outcomes = [r for r in runs.records if r.failed != "error"]
    predictor = Predictor(runs)
    score = _Scorer(predictor, finished, peaks, outcomes)
    notes = []
    time = memory = None
    section: dict = {}
    uncalibrated = current = score(section)
    if finished:
        measured = np.array([r.iteration_time for r in finished])
        time = _fit_part("time", finished, measured, predictor.times,
                         lambda recs: time_candidates(runs, recs, predictor), TIME_NOISE, max_parameters, loo)
        sol, base = time.solution, section
        section, t, current = _guarded(score, current, base, lambda t: section_of(sol.parameters,
                                                                                 [t * x for x in sol.x], base))
        time = _scaled(time, t)
    else:
        notes.append("no finished runs: iteration times not calibrated")
    if peaks:
        measured = np.array([r.peak_memory for r in peaks])
        memory = _fit_part("memory", peaks, measured, predictor.peaks, lambda recs: memory_candidates(runs, recs),
                           MEMORY_NOISE, max_parameters, loo)
        sol, base = memory.solution, section
        section, t, current = _guarded(score, current, base, lambda t: section_of(sol.parameters,
                                                                                 [t * x for x in sol.x], base))
        memory = _scaled(memory, t)
    section, headroom, current = _headroom(runs, predictor, section, score, current)
    # The reported errors are those of the section written, after every step.
    if time:
        time = replace(time, after=tuple(float(v) for v in predictor.times(finished, section)))
    if memory:
        memory = replace(memory, after=tuple(float(v) for v in predictor.peaks(peaks, section)))
    unlimited = [r.index for r in runs.records if r.failed == "oom" and r.memory_limit is None]
    if unlimited:
        notes.append(f"out-of-memory runs {unlimited} carry no memory_limit: compared with the instance's device "
                     "memory")
    skipped = [r.index for r in runs.records if r.failed == "error"]
    if skipped:
        notes.append(f"runs that failed with an error say nothing about the model and were skipped: {skipped}")
    summary = {"finished": len(finished), "out_of_memory": sum(r.failed == "oom" for r in runs.records),
               "error": len(skipped), "with_peak_memory": len(peaks),
               "instances": sorted(k for k in runs.instances if k is not None)}
    return Calibration(section, time, memory, headroom, summary, tuple(notes),
                       {"uncalibrated": uncalibrated.wrong, "calibrated": current.wrong})


def _headroom(runs: RunSet, predictor: Predictor, section: dict, score: _Scorer, before: Scores
              ) -> tuple[dict, tuple[Headroom, ...], Scores]:
    """F6: lower the capacity of a device type (C8, never the predicted peaks) until every run of
    it that ran out of memory is predicted not to fit under the memory it ran with, but no
    further than the finished runs of the type still fit under theirs; then F7."""
    ooms = [r for r in runs.records if r.failed == "oom"]
    if not ooms:
        return section, (), before
    wanted: dict[str, float] = {}
    owners: dict[str, list[RunRecord]] = {}
    for r, rooms in zip(ooms, predictor.rooms(ooms, section)):
        room, t = min((v, k) for k, v in rooms.items())
        owners.setdefault(t, []).append(r)
        if room >= 0:  # predicted to fit, yet it ran out of memory: take more than its room off
            limit = r.memory_limit or runs.instance_of(r).device_types[t].memory
            wanted[t] = max(wanted.get(t, 0.0), room + max(1.0, 1e-6 * limit))
    if not wanted:
        return section, (), before
    finished = list(runs.finished)
    allowed: dict[str, tuple[float, int | None]] = {t: (math.inf, None) for t in wanted}
    for r, rooms in zip(finished, predictor.rooms(finished, section)):
        if min(rooms.values()) < 0:
            continue  # already predicted not to fit: no headroom changes that (reported)
        for t, room in rooms.items():
            if t in allowed and room - 1.0 < allowed[t][0]:  # a byte to spare against rounding
                allowed[t] = (max(0.0, room - 1.0), r.index)
    delta = {t: min(wanted[t], allowed[t][0]) for t in wanted}
    old = {t: float(section.get("device_types", {}).get(t, {}).get("memory_headroom", 0.0)) for t in wanted}

    def section_at(t_: float) -> dict:
        out = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in section.items()}
        types = out.setdefault("device_types", {})
        for t in sorted(delta):
            types[t] = {**types.get(t, {}), "memory_headroom": old[t] + t_ * delta[t]}
        return out

    new, shrink, scores = _guarded(score, before, section, section_at)
    rooms = dict(zip((r.index for r in ooms), predictor.rooms(ooms, new)))
    out = []
    for t in sorted(delta):
        fits = tuple(r.index for r in owners[t] if min(rooms[r.index].values()) >= 0)
        out.append(Headroom(t, old[t] + shrink * delta[t], old[t] + wanted[t],
                            tuple(r.index for r in owners[t] if r.index not in fits), fits,
                            allowed[t][1] if allowed[t][0] < wanted[t] else None, shrink))
    return new, tuple(out), scores
