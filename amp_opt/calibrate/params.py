"""The parameters a calibration fit moves (``formulations/calibration.md``, C1-C7, F2-F3, F5):
their unitless coordinates, the section they write, and the candidates of each fit.

Every parameter x is unitless with prior N(0, 1) around the uncalibrated model (x = 0):
value = initial * exp(scale * x) for factors, initial + scale * x for additive ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from .runs import RunRecord, RunSet


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


def time_candidates(runs: RunSet, records: Sequence[RunRecord], predictor) -> list[Parameter]:
    """C1, C3 per device type the records use, C4 intra and inter, C2 per device type (priority order).

    Examples
    --------
    >>> from amp_opt.calibrate.runs import bind_runs, load_uncalibrated, parse_runs
    >>> from amp_opt.calibrate.predict import Predictor
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
    stated = max(inst.training.gradient_buffer_bytes_per_param for inst in runs.instances.values())
    out.append(Parameter("gradient_buffer_bytes_per_param", ("gradient_buffer_bytes_per_param",), stated, grad,
                         False, 0.0))
    return out
