"""Where a solve's memory goes: its resident size next to the kind searches it holds.

Usage (from the project root):

    python benchmarks/kind_memory.py instances/suite/scale/s1024-gpt3-175b-4types.json --time-limit 60 --processes 1
    python benchmarks/kind_memory.py instances/suite/scale/s1024-gpt3-175b-4types.json --processes 1

Runs ``amp_opt solve INSTANCE OPTIONS --json`` in this process (the options are solve's) and,
every second, reads the process's resident size and counts the kind searches alive (phase 1b,
:mod:`amp_opt.search.kinds`: one per candidate not yet ruled out) and the bytes of their
models' arrays.  Prints the moment the kind searches held the most, the peak resident size
(``VmHWM``) and the plan.  With ``--processes`` 2 (solve's default) the forked helper is not
sampled: use 1.  Linux only (``/proc/self/status``).
"""

from __future__ import annotations

import json
import sys
import threading
import time
import weakref
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

STARTED = time.perf_counter()  # solve's --time-limit counts from here, as in `python -m amp_opt`
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from amp_opt.commands.cli import main  # noqa: E402
from amp_opt.search.kinds import bound  # noqa: E402


def status(key: str) -> float:
    """A size of /proc/self/status in MiB (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith(key))


def held(searches: list) -> tuple[int, float]:
    """The kind searches still alive and the MiB of their models' arrays."""
    alive = [s for s in (ref() for ref in searches) if s is not None]
    seen: dict = {}
    for s in alive:
        seen.update({id(v): v.nbytes for v in vars(s.model).values() if isinstance(v, np.ndarray)})
    return len(alive), sum(seen.values()) / 2**20


def run(argv: list[str]) -> int:
    searches: list = []
    made = bound.KindSearch.__init__

    def tracked(self, *args, **kwargs):
        searches.append(weakref.ref(self))
        made(self, *args, **kwargs)

    bound.KindSearch.__init__ = tracked
    most = [0.0, "no kind search"]
    done = threading.Event()

    def sample():
        while not done.wait(1.0):
            count, mib = held(searches)
            if mib > most[0]:
                most[:] = [mib, f"{count} kind searches alive ({len(searches)} made), {mib:.0f} MiB of tables, "
                                f"resident {status('VmRSS'):.0f} MiB at {time.perf_counter() - STARTED:.1f} s"]

    threading.Thread(target=sample, daemon=True).start()
    out = StringIO()
    with redirect_stdout(out):
        code = main(["solve", *argv, "--json"], started=STARTED)
    done.set()
    result = json.loads(out.getvalue() or "{}")
    print(f"most held: {most[1]}")
    print(f"peak resident: {status('VmHWM'):.0f} MiB; wall {time.perf_counter() - STARTED:.1f} s; exit {code}; "
          f"{result.get('solver', {}).get('status')} {result.get('predicted_time')}")
    return code


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
