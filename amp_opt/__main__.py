"""``python -m amp_opt``: the command-line interface."""

import time

STARTED = time.perf_counter()  # --time-limit counts from here: loading the instance is part of it

from .commands.cli import main  # noqa: E402  (after the clock starts)

raise SystemExit(main(started=STARTED))
