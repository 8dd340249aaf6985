"""The in-sample measures no calibration step may worsen, and the guard that keeps each step
to them (``formulations/calibration.md``, F6-F7)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from .lsq import SHRINK_STEPS, scores as _scores
from .predict import Predictor
from .runs import RunRecord


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


class Scorer:
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


def guarded(score: Scorer, before: Scores, base: dict, section_at: Callable[[float], dict]
             ) -> tuple[dict, float, Scores]:
    """F7: the step's section at the largest t of 1, 0.75, 0.5, 0.25 at which no measure of
    :class:`Scores` is worse than ``before`` (the scores of ``base``); t = 0 refuses the step."""
    for t in SHRINK_STEPS[:-1]:
        section = section_at(t)
        scores = score(section)
        if scores.no_worse_than(before):
            return section, t, scores
    return base, 0.0, before
