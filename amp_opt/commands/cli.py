"""Command-line interface: ``python -m amp_opt`` / ``amp-opt``.

:data:`COMMANDS` is the whole CLI: each command is a module of this package with
``add_arguments(parser)`` and ``run(args) -> exit code``.  Only the module of the
command being run is imported, so that ``solve`` does not pay for ``bench`` or
``plot``.  Exit codes: 0 success, 2 bad input (the message names the field),
3 infeasible (the message says why), 4 a measured run failed (out of memory or
an error; ``run`` records it).  User mistakes never print a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ..errors import AmpOptError

# name -> one line of help; the module amp_opt.commands.<name> holds the command.
COMMANDS = {
    "solve": "find the fastest plan of an instance",
    "evaluate": "score one plan or a list of plans",
    "generate": "write a random heterogeneous instance (deterministic for a seed)",
    "export": "write a DeepSpeed config or Megatron-LM arguments for a plan",
    "plot": "draw a plan's 1F1B timeline and per-stage memory (needs amp_opt[plot])",
    "explain": "say why a plan or an instance does not fit, and what would",
    "bench": "run solvers on an instance suite and compare with baselines",
    "profile": "measure every layer's time and memory on this machine (needs amp_opt[torch])",
    "run": "execute a plan on local processes and compare with the prediction (needs amp_opt[torch])",
    "calibrate": "fit the cost model's corrections to measured runs (RUNS.json)",
}


def command_module(name: str):
    """The module of a command (imported on first use)."""
    return importlib.import_module(f"{__package__}.{name}")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The CLI's parser; only ``command`` (all of them when None) gets its full options."""
    parser = argparse.ArgumentParser(
        prog="amp-opt",
        description="Plan tensor/data/pipeline-parallel training on heterogeneous GPU clusters.",
        epilog="exit codes: 0 success, 2 bad input, 3 infeasible, 4 a measured run failed (recorded by run -o)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, summary in COMMANDS.items():
        p = sub.add_parser(name, help=summary, description=summary[0].upper() + summary[1:] + ".")
        if command in (None, name):
            module = command_module(name)
            module.add_arguments(p)
            p.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    chosen = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(chosen if chosen in COMMANDS else None).parse_args(argv)  # usage errors exit with 2
    try:
        return args.run(args)
    except AmpOptError as exc:
        kind = "infeasible" if exc.exit_code == 3 else "error"
        print(f"amp-opt: {kind}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("amp-opt: interrupted", file=sys.stderr)
        return 130
