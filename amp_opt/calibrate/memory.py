"""Runs that ran out of memory: the capacity headroom they call for (``formulations/calibration.md``, F6)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping

from .predict import Predictor
from .runs import RunRecord, RunSet
from .scoring import Scorer, Scores, guarded


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


def fit_headroom(runs: RunSet, predictor: Predictor, section: dict, score: Scorer, before: Scores
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

    new, shrink, scores = guarded(score, before, section, section_at)
    rooms = dict(zip((r.index for r in ooms), predictor.rooms(ooms, new)))
    out = []
    for t in sorted(delta):
        fits = tuple(r.index for r in owners[t] if min(rooms[r.index].values()) >= 0)
        out.append(Headroom(t, old[t] + shrink * delta[t], old[t] + wanted[t],
                            tuple(r.index for r in owners[t] if r.index not in fits), fits,
                            allowed[t][1] if allowed[t][0] < wanted[t] else None, shrink))
    return new, tuple(out), scores


def held_out_misses(runs: RunSet, predictor: Predictor, section: dict, groups: dict[int, str]
                    ) -> dict[str, tuple[int, ...]]:
    """F8 for F6: per group with failed runs (when there are several groups), the failed runs of
    the group that the model calls feasible when its headroom was fitted on the other groups'
    runs only (``section``: the section before the headroom step; ``groups``: record index ->
    group)."""
    if len(set(groups.values())) < 2:
        return {}
    out = {}
    for name in dict.fromkeys(groups[r.index] for r in runs.records if not r.finished):
        others = replace(runs, records=tuple(r for r in runs.records if groups[r.index] != name))
        finished = [r for r in others.records if r.finished]
        score = Scorer(predictor, finished, [r for r in finished if r.peak_memory is not None],
                       [r for r in others.records if r.failed != "error"])
        fitted, _, _ = fit_headroom(others, predictor, section, score, score(section))
        failed = [r for r in runs.records if groups[r.index] == name and not r.finished]
        out[name] = tuple(r.index for r, rooms in zip(failed, predictor.rooms(failed, fitted))
                          if min(rooms.values()) >= 0)
    return out
