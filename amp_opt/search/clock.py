"""One clock for a search: its deadline, the shares of it, and the reserve, in one place.

The time limit of :func:`amp_opt.solve` (``--time-limit``, counted from ``started``: the CLI
passes the moment the process started) becomes a :class:`Clock` once, :meth:`Clock.of`: the
search works until ``deadline = start + limit - reserve(limit)``, the reserve (:func:`reserve`)
being what re-scoring the plans and writing them need after it.  Every level below gets a
child clock, never a later deadline than its parent's but for the small floors a share keeps:
the sets of devices (:mod:`.subsets`), the blocks of layers (:mod:`.blocks`), a
:class:`~amp_opt.search.context.Search`, the MIP driver's phases and programs, the kind search.
Only a backend (:mod:`.mip.backends`) turns its clock into seconds for its solver.  A stop
request (SIGINT, SIGTERM: :mod:`.stop`) ends every clock at once (``formulations/mip.md``, "Time").
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from . import stop
from .tuning import RESERVE


def reserve(limit: float) -> float:
    """Seconds of a time limit kept back for re-scoring the plans and writing them."""
    return min(RESERVE[0] * limit, RESERVE[1])


def rounded(seconds: float | None) -> str:
    """Seconds for people: 3 significant digits, no trailing zeros (2.2, 16, 0.05)."""
    return "none" if seconds is None else f"{seconds:.3g}"


@dataclass(frozen=True)
class Clock:
    """A deadline (``time.perf_counter()`` seconds, None without a time limit) and when it started
    counting; ``limit`` and ``end`` are the caller's time limit and where it ends (the deadline
    plus the reserve), the same for every child clock."""

    start: float
    deadline: float | None
    limit: float | None = None
    end: float | None = None

    @classmethod
    def of(cls, limit: float | None, started: float | None = None) -> Clock:
        """The clock of a whole search: ``limit`` seconds from ``started`` (default: now), less the reserve."""
        start = time.perf_counter() if started is None else started
        if limit is None:
            return cls(start, None)
        return cls(start, start + limit - reserve(limit), limit, start + limit)

    @property
    def budget(self) -> float | None:
        """The seconds this clock was given (from its start to its deadline)."""
        return None if self.deadline is None else self.deadline - self.start

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def remaining(self) -> float | None:
        """Seconds left before the deadline (never negative; 0 once a stop was requested), or None
        without a time limit."""
        if stop.requested():
            return 0.0
        return None if self.deadline is None else max(0.0, self.deadline - time.perf_counter())

    def out_of_time(self) -> bool:
        """Whether the work must stop now: the deadline passed, or a stop was requested."""
        return stop.past(self.deadline)

    def _child(self, start: float, deadline: float | None) -> Clock:
        return Clock(start, deadline, self.limit, self.end)

    def share(self, fraction: float = 1.0, *, among: int = 1, floor: float = 0.0) -> Clock:
        """A child clock starting now with ``fraction`` of the time left shared ``among`` that many,
        never more than is left, at least ``floor`` seconds (a phase that must not start empty)."""
        now = time.perf_counter()
        left = self.remaining()
        if left is None:
            return self._child(now, None)
        return self._child(now, now + max(floor, min(left, fraction * left / max(1, among))))

    def part(self, fraction: float) -> Clock:
        """A child clock with the first ``fraction`` of this clock's time, counted from its start."""
        if self.deadline is None:
            return self
        return self._child(self.start, self.start + fraction * (self.deadline - self.start))

    def less(self, seconds: float, *, floor: float = 0.0) -> Clock:
        """This clock with ``seconds`` kept back before its deadline (work after the child's),
        leaving it at least ``floor`` seconds from its start."""
        if self.deadline is None:
            return self
        return self._child(self.start, self.start + max(floor, self.deadline - seconds - self.start))

    def within(self, seconds: float) -> Clock:
        """This clock, ending no later than ``seconds`` from now."""
        now = time.perf_counter()
        if self.deadline is None:
            return self._child(now, now + seconds)
        return self._child(now, min(self.deadline, now + seconds))

    def at_least(self, seconds: float) -> Clock:
        """This clock, ending no earlier than ``seconds`` from now (a solver handed a program gets a
        moment even when its share was spent building it)."""
        if self.deadline is None:
            return self
        return self._child(self.start, max(self.deadline, time.perf_counter() + seconds))

    def overrun(self) -> float | None:
        """Halfway into the reserve: when the search stops waiting for work that overruns the
        deadline (a helper process), so that the result is still written in time."""
        return None if self.deadline is None else (self.deadline + self.end) / 2

    def stopped_why(self) -> str:
        """Why a search stopped early, for messages: the signal, or the caller's time limit."""
        reason = stop.requested()
        if reason:
            return f"interrupted by {reason}"
        return f"time limit of {rounded(self.limit)} s"


NO_LIMIT = Clock(0.0, None)  # what a function called without a clock works under: only a stop request ends it
