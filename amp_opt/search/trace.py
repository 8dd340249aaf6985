"""The progress of one search over time: the best plan known and the proven bound.

A :class:`Trace` belongs to a :class:`~amp_opt.search.context.Search` and records a point
whenever the best plan's value (the primal side) or the proven lower bound on the optimum
(the dual side) moves, timed from the start of the solve.  The benchmark reads it to report
time to the first plan, time to a 1% gap, the primal integral (Berthold 2013) and
gap-over-time plots.

Values are the searches' own: a plan found by a program is recorded at the program's
objective, which may exceed the evaluator's score of that plan (a solution cut short may
keep slack), so the primal side is never optimistic.  The dual side is only recorded
where the search has a proven bound for every candidate at once (see the drivers).
"""

from __future__ import annotations

import math
import time


class Trace:
    """Points ``(seconds since start, best plan value or inf, proven bound or -inf)``."""

    def __init__(self, start: float | None = None):
        self.start = time.perf_counter() if start is None else start
        self.points: list[tuple[float, float, float]] = []
        self.primal = math.inf
        self.dual = -math.inf

    def update(self, primal: float | None = None, dual: float | None = None, at: float | None = None) -> None:
        """Record a new best value and/or bound (ignored unless it improves); ``at`` is a
        ``time.perf_counter()`` reading, default now."""
        moved = False
        if primal is not None and primal < self.primal:
            self.primal, moved = float(primal), True
        if dual is not None and dual > self.dual:
            self.dual, moved = float(dual), True
        if moved:
            t = (time.perf_counter() if at is None else at) - self.start
            t = max(t, self.points[-1][0]) if self.points else max(t, 0.0)
            self.points.append((t, self.primal, self.dual))

    def as_tuple(self) -> tuple[tuple[float, float, float], ...]:
        return tuple(self.points)


def first_plan_time(points) -> float | None:
    """Seconds to the first plan, or None if none was found."""
    return next((t for t, primal, _ in points if math.isfinite(primal)), None)


def time_to_gap(points, gap: float) -> float | None:
    """Seconds until (best - bound) / best <= gap, or None if it never was."""
    for t, primal, dual in points:
        if math.isfinite(primal) and primal > 0 and math.isfinite(dual) and (primal - dual) / primal <= gap + 1e-12:
            return t
    return None


def primal_gap(value: float, reference: float) -> float:
    """Berthold's primal gap of a plan value against the best known value: 0 when equal, 1 without a plan."""
    if not math.isfinite(value):
        return 1.0
    if value == reference:
        return 0.0
    if value * reference < 0:
        return 1.0
    return abs(value - reference) / max(abs(value), abs(reference))


def primal_integral(points, reference: float, horizon: float) -> float:
    """The integral of the primal gap over [0, horizon] seconds (Berthold 2013): the gap is 1
    until the first plan and holds its last value to the horizon."""
    total, t0, gap = 0.0, 0.0, 1.0
    for t, primal, _ in points:
        t = min(t, horizon)
        total += gap * (t - t0)
        t0, gap = t, primal_gap(primal, reference)
    return total + gap * max(0.0, horizon - t0)


def gap_at(points, t: float, reference: float) -> float:
    """The primal gap at time t (step function)."""
    gap = 1.0
    for at, primal, _ in points:
        if at > t:
            break
        gap = primal_gap(primal, reference)
    return gap
