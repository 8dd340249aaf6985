"""Command-line interface: ``python -m amp_opt`` / ``amp-opt``.

:data:`COMMANDS` is the whole CLI: each command is a module of this package with
``add_arguments(parser)`` and ``run(args) -> exit code``.  Only the module of the
command being run is imported, so that ``solve`` does not pay for ``bench`` or
``plot``.  Exit codes: :data:`EXIT_CODES`.  User mistakes never print a traceback.
SIGINT and SIGTERM stop a search cleanly (:mod:`amp_opt.search.stop`): the best plan found
so far is printed, then the program exits with 130 or 143.  A closed output pipe
(``| head``) ends the program quietly with 0.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

from ..errors import AmpOptError, NoPlanFound
from ..search import stop

# name -> one line of help; the module amp_opt.commands.<name> holds the command.
COMMANDS = {
    "solve": "find the fastest plan of an instance",
    "evaluate": "score one plan or a list of plans",
    "generate": "write a random heterogeneous instance (deterministic for a seed)",
    "export": "write a DeepSpeed config or Megatron-LM arguments for a plan",
    "plot": "draw a plan's 1F1B timeline and per-stage memory (needs amp_opt[plot])",
    "explain": "say why a plan or an instance does not fit in memory, and what would fit",
    "bench": "run solvers on an instance suite and compare with baselines",
    "profile": "measure every layer's time and memory on this machine (needs amp_opt[torch])",
    "run": "execute a plan on local processes and compare with the prediction (needs amp_opt[torch])",
    "calibrate": "fit the cost model's corrections to measured runs (RUNS.json)",
}


EXIT_CODES = (
    "0 success; "
    "2 bad input (one line naming the field and the problem); "
    "3 infeasible: proven that no plan fits (one line saying why), or evaluate's plan does not fit; "
    "4 no plan found within the time limit, infeasibility not proven; "
    "5 a plug-in solver failed (its plan was rejected by the evaluator, or it raised); "
    "6 a measured run failed (out of memory or an error; run -o records it); "
    "130 / 143 interrupted by SIGINT / SIGTERM (the best plan found so far is printed first)"
)


def command_module(name: str):
    """The module of a command (imported on first use)."""
    return importlib.import_module(f"{__package__}.{name}")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The CLI's parser; only ``command`` (all of them when None) gets its full options."""
    parser = argparse.ArgumentParser(
        prog="amp-opt",
        description="Plan tensor/data/pipeline-parallel training on heterogeneous GPU clusters.",
        epilog="exit codes: " + EXIT_CODES, formatter_class=_Formatter,
    )
    parser.add_argument("--version", action="version", version=f"amp-opt {_version()}",
                        help="print the installed version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, summary in COMMANDS.items():
        p = sub.add_parser(name, help=summary, description=summary[0].upper() + summary[1:] + ".",
                           epilog="exit codes: " + EXIT_CODES, formatter_class=_Formatter)
        if command in (None, name):
            module = command_module(name)
            module.add_arguments(p)
            p.set_defaults(run=module.run)
    return parser


def _version() -> str:
    """The installed distribution's version (the package's own when run from a checkout)."""
    from importlib import metadata

    from .. import __version__

    try:
        return metadata.version("amp_opt")
    except metadata.PackageNotFoundError:
        return __version__


class _Formatter(argparse.HelpFormatter):
    """Help laid out for the terminal's width, or 100 columns when help goes to a pipe or file."""

    def __init__(self, prog, **kwargs):
        width = os.get_terminal_size().columns if sys.stdout.isatty() else 100
        super().__init__(prog, width=max(60, width) - 2, max_help_position=30, **kwargs)


def main(argv: list[str] | None = None, started: float | None = None) -> int:
    """Run one command; returns the exit code.  ``started`` (``time.perf_counter()``) is when
    the process started: ``--time-limit`` counts from it (default: now)."""
    started = time.perf_counter() if started is None else started
    stop.clear()
    try:
        with stop.signals():
            return _run(argv, started)
    except BrokenPipeError:
        return _pipe_closed()


def _run(argv: list[str] | None, started: float) -> int:
    argv = sys.argv[1:] if argv is None else argv
    chosen = next((a for a in argv if not a.startswith("-")), None)
    try:
        args = build_parser(chosen if chosen in COMMANDS else None).parse_args(argv)  # usage errors exit with 2
        args.started = started
        code = args.run(args)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
    except NoPlanFound as exc:
        code = exc.exit_code
        if not stop.requested():
            print(f"amp-opt: no plan: {exc}", file=sys.stderr)
    except AmpOptError as exc:  # the verdict stands even if a signal came meanwhile
        kind = "infeasible" if exc.exit_code == 3 else "error"
        print(f"amp-opt: {kind}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:  # a second signal, or SIGINT before the handlers were in place
        name = str(exc) if str(exc) in stop.EXIT_CODES else stop.requested() or "SIGINT"
        print(f"amp-opt: interrupted by {name}", file=sys.stderr)
        return stop.EXIT_CODES[name]
    reason = stop.requested()
    if reason:
        what = ("the best plan found so far was printed" if code == 0 else
                "no plan had been found yet; infeasibility not proven")
        print(f"amp-opt: interrupted by {reason}: {what}", file=sys.stderr)
        return stop.EXIT_CODES.get(reason, 130)
    return code


def _pipe_closed() -> int:
    """The reader of our output went away (``| head``): nothing more to say, exit 0.  Python
    would complain when it flushes stdout at exit, so stdout now points at /dev/null."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 0
