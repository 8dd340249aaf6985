"""Predictions of measured runs under a calibration section, by the one evaluator
(:func:`amp_opt.model.evaluate.evaluate`): iteration times (eq. H13) and allocator peaks
(``formulations/calibration.md`` eq. C5') and the memory room a plan has under the memory a run
had (eq. F6).  The fits of :mod:`.fit` score their candidate corrections with these, and ``run``
compares a measured peak with :func:`peak_of_stage`."""

from __future__ import annotations

import json
from typing import Sequence

import numpy as np

from ..model.calibration import apply_calibration
from ..model.evaluate import evaluate
from ..model.tables import Tables
from .runs import COST_MODEL, RunRecord, RunSet


class Predictor:
    """Predicts runs under a calibration section with the one evaluator: every instance
    calibrated once per section.

    Examples
    --------
    >>> from amp_opt.calibrate.runs import bind_runs, load_uncalibrated, parse_runs
    >>> inst = load_uncalibrated("instances/amp_het_cluster.json")[1]
    >>> plan = {"tp": 1, "dp": 4, "pp": 4, "micro_batch": 1, "partition": [0, 7, 14, 20, 30]}
    >>> runs = bind_runs(parse_runs([{"plan": plan, "iteration_time": 1.0}]), inst)
    >>> slow = {"device_types": {"T4": {"compute_scale": 2.0}, "V100-16GB": {"compute_scale": 2.0}}}
    >>> t = Predictor(runs).times(runs.records, {})
    >>> bool(Predictor(runs).times(runs.records, slow)[0] > 1.5 * t[0])
    True
    """

    CACHED_SECTIONS = 64  # sections whose calibrated instances and evaluations are kept

    def __init__(self, runs: RunSet):
        self.runs = runs
        self._tables = {key: Tables(inst) for key, inst in runs.instances.items()}
        self._cache: dict[str, tuple[dict, dict]] = {}  # section -> (calibrated (instance, tables), evaluations)

    def _entry(self, section) -> tuple[dict, dict]:
        """The calibrated instances of a section and its evaluations so far, remembered for the last
        few sections (a fit asks for times, peaks and rooms of one section in turn)."""
        key = json.dumps(section, sort_keys=True)
        if key not in self._cache:
            if len(self._cache) >= self.CACHED_SECTIONS:
                del self._cache[next(iter(self._cache))]
            cal = {}
            for k, base in self.runs.instances.items():
                inst = apply_calibration(base, section)
                cal[k] = (inst, self._tables[k].recalibrated(inst))
            self._cache[key] = (cal, {})
        return self._cache[key]

    def evaluation(self, record: RunRecord, section):
        """The one evaluator's :class:`~amp_opt.model.evaluate.Evaluation` of a record's plan under a section."""
        cal, done = self._entry(section)
        if record.index not in done:
            inst, tables = cal[record.instance]
            done[record.index] = evaluate(inst, record.plan, COST_MODEL, tables=tables)
        return done[record.index]

    def instance(self, record: RunRecord, section):
        return self._entry(section)[0][record.instance][0]

    def evaluations(self, records: Sequence[RunRecord], section) -> list:
        return [self.evaluation(r, section) for r in records]

    def times(self, records: Sequence[RunRecord], section) -> np.ndarray:
        """Predicted seconds per iteration (eq. H13) of each record's plan."""
        return np.array([e.predicted_time for e in self.evaluations(records, section)])

    def rooms(self, records: Sequence[RunRecord], section) -> list[dict[str, float]]:
        """Each record's least memory room per device type under the memory it ran with (eq. F6,
        :func:`memory_rooms`)."""
        return [memory_rooms(self.instance(r, section), self.evaluation(r, section), r.memory_limit) for r in records]

    def peaks(self, records: Sequence[RunRecord], section) -> np.ndarray:
        """Predicted peak bytes of each record's fullest device (eq. C5'): max over stages of
        M_s - reserve + the largest memory overhead among the stage's device types."""
        return np.array([max(peak_of_stage(self.instance(r, section), s) for s in self.evaluation(r, section).stages)
                         for r in records])


def memory_rooms(instance, evaluation, limit: float | None = None) -> dict[str, float]:
    """The least room (bytes) a run's plan is predicted to have on each of its device types
    (eq. F6): min over the stages s holding type g of L - M_s - o_g - h_g, L the memory each
    device had (the record's ``memory_limit``; None: the instance's memory of g).  The plan is
    predicted to fit under L when no room is negative; with L = memory(g) that is eq. H5's
    M_s <= capacity (C5, C8).

    Examples
    --------
    >>> from amp_opt import load_instance, parse_plan
    >>> inst = load_instance("instances/amp_het_cluster.json")
    >>> ev = evaluate(inst, parse_plan({"tp": 1, "dp": 4, "pp": 4, "micro_batch": 1, "partition": [0, 7, 14, 20, 30]}))
    >>> rooms = memory_rooms(inst, ev)
    >>> sorted(rooms), min(rooms.values()) == min(s.capacity - s.memory for s in ev.stages)
    (['T4', 'V100-16GB'], True)
    >>> min(memory_rooms(inst, ev, limit=2**30).values()) < 0  # on devices of 1 GiB it would not fit
    True
    """
    rooms: dict[str, float] = {}
    for s in evaluation.stages:
        for t in s.device_types:
            dev = instance.device_types[t]
            room = (dev.memory if limit is None else limit) - s.memory - dev.memory_overhead - dev.memory_headroom
            rooms[t] = min(rooms.get(t, room), room)
    return rooms


def peak_of_stage(instance, stage) -> float:
    """Eq. C5': the allocator peak a stage's devices are predicted to reach (bytes): the stage's
    memory (eq. H5) less the reserve, plus the largest memory overhead among its device types.

    Examples
    --------
    >>> from amp_opt import load_instance, parse_plan
    >>> inst = load_instance("instances/amp_het_cluster.json")
    >>> ev = evaluate(inst, parse_plan({"tp": 1, "dp": 4, "pp": 4, "micro_batch": 1, "partition": [0, 7, 14, 20, 30]}))
    >>> peak_of_stage(inst, ev.stages[0]) == ev.stages[0].memory - inst.training.memory_reserve
    True
    """
    overhead = max(instance.device_types[t].memory_overhead for t in stage.device_types)
    return stage.memory - instance.training.memory_reserve + overhead
