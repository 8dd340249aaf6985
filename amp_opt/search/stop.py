"""Stopping a search early, in one place: the deadline, and SIGINT/SIGTERM.

A search stops at its clock's deadline (:class:`amp_opt.search.clock.Clock`) or as
soon as a stop was requested (:func:`request`; the CLI's signal handlers call it, see
:func:`signals`).  Every phase polls :func:`past` (through ``Clock.out_of_time``), so a
stop is a normal early end: the best plan found so far is returned with status
FEASIBLE and the bound proven so far.  Solvers that do not run Python code while they
work are stopped from outside: CP-SAT runs in a helper thread whose waiting caller
calls its ``stop_search`` (:mod:`amp_opt.search.mip.cpsat`), CBC is a child process in its
own process group, killed with the group (:mod:`amp_opt.search.mip.cbc`), HiGHS is
interrupted from its callbacks and waited for in a helper thread (:mod:`amp_opt.search.mip.highs`).

The handlers do nothing but record the signal, so they are safe whatever runs; a second
signal raises KeyboardInterrupt at once (for a user who does not want to wait), and the
``finally`` blocks still kill child processes and remove temporary folders.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time

_requested: list[str] = []  # the name of the first signal received (or reason given), if any
POLL = 0.05  # seconds between two looks at the stop flag while a solver runs outside Python


def request(reason: str = "stop") -> None:
    """Ask every running search to stop at its next check (e.g. from a signal handler)."""
    if not _requested:
        _requested.append(reason)


def requested() -> str | None:
    """The reason of the stop request (a signal name such as "SIGINT"), or None."""
    return _requested[0] if _requested else None


def clear() -> None:
    _requested.clear()


def past(deadline: float | None) -> bool:
    """Whether a phase with this deadline (``time.perf_counter()`` seconds) must stop now."""
    return bool(_requested) or (deadline is not None and time.perf_counter() >= deadline)


EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143}  # 128 + the signal's number, as shells report it


@contextlib.contextmanager
def signals():
    """Turn SIGINT and SIGTERM into a stop request while the block runs (main thread only).

    The first signal requests a stop; a second one raises KeyboardInterrupt.  The previous
    handlers are restored on exit.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        name = signal.Signals(signum).name
        if _requested:
            raise KeyboardInterrupt(name)
        request(name)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
