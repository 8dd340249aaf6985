"""A process beside the search: a forked child runs a function that sends records back.

The search over idle node classes runs the whole cluster in this process and the other
subsets of node classes in children (``search.subsets``, ``--processes``), so that on a
machine with two cores the subsets no longer wait for the whole cluster's share of the time.
A child is forked, so it starts with this process's state (the instance, the tables, the
closures of the search) and nothing is pickled on the way in; on the way out each record is
pickled and collected by a thread of this process, so the child never waits on a full pipe.
The child inherits the stop handlers (:mod:`amp_opt.search.stop`): Ctrl-C stops it too, and
it leaves with ``os._exit``, so it never flushes a copy of this process's output buffers.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import traceback


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system tells it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not on Linux
        return max(1, os.cpu_count() or 1)


def can_fork() -> bool:
    """Whether children can be forked here (not on Windows; macOS allows it but warns)."""
    return "fork" in multiprocessing.get_all_start_methods() and sys.platform.startswith("linux")


def shared_value(value: float):
    """A float that this process and the children forked after it read and lower together."""
    return multiprocessing.get_context("fork").Value("d", value)


def lower(shared, value: float) -> None:
    """Set ``shared`` to ``value`` if that is lower."""
    with shared.get_lock():
        if value < shared.value:
            shared.value = value


class Sidecar:
    """A forked child running ``work(send)``; :meth:`finish` returns the records it sent."""

    def __init__(self, work):
        context = multiprocessing.get_context("fork")
        sys.stdout.flush()
        sys.stderr.flush()
        self._receive, send = context.Pipe(duplex=False)
        self._records: list = []
        self._error: str | None = None
        self._ended = threading.Event()
        self._process = context.Process(target=_child, args=(work, send), daemon=True)
        self._process.start()
        send.close()  # this process's copy: the pipe ends when the child does
        self._reader = threading.Thread(target=self._collect, daemon=True)
        self._reader.start()

    def _collect(self) -> None:
        try:
            while True:
                kind, payload = self._receive.recv()
                if kind == "record":
                    self._records.append(payload)
                    continue
                if kind == "error":
                    self._error = payload
                return
        except (EOFError, OSError):  # the child ended (or was killed) without saying so
            return
        finally:
            self._ended.set()

    def stop(self) -> None:
        """Ask the child to stop at its next check (SIGTERM, which its stop handlers record)."""
        if self._process.is_alive():
            self._process.terminate()

    def finish(self, timeout: float) -> list:
        """The records the child sent, waiting at most ``timeout`` seconds for it to end; a child
        still running then is killed (what it had not sent is lost).  A child that failed raises
        RuntimeError with its traceback."""
        self._ended.wait(max(0.0, timeout))
        self.close()
        if self._error is not None:
            raise RuntimeError(f"a search process beside this one failed:\n{self._error}")
        return list(self._records)

    def close(self) -> None:
        """Kill the child if it still runs and release the pipe (idempotent)."""
        if self._process.is_alive():
            self._process.kill()
        self._process.join()
        self._reader.join()  # it reads what is left in the pipe, then its end
        self._receive.close()


def _child(work, send) -> None:  # pragma: no cover - runs in the forked child (covered through the parent's tests)
    code = 0
    try:
        work(lambda record: send.send(("record", record)))
        send.send(("done", None))
    except KeyboardInterrupt:  # a second Ctrl-C: the parent stops too and keeps what was sent
        code = 130
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
        code = 1
        try:
            send.send(("error", traceback.format_exc()))
        except Exception:  # noqa: BLE001 - the parent may be gone
            pass
    finally:
        os._exit(code)
