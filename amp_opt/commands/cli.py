"""Command-line interface: ``python -m amp_opt`` / ``amp-opt``.

Each command is a module of this package with ``add_parser(subparsers)``, which
registers its parser with ``set_defaults(run=function)``; the list below is the
whole CLI.  Exit codes: 0 success, 2 bad input (the message names the field),
3 infeasible (the message says why).  User mistakes never print a traceback.
"""

from __future__ import annotations

import argparse
import sys

from ..errors import AmpOptError
from . import bench, evaluate, explain, export, generate, plot, solve

COMMANDS = (solve, evaluate, generate, export, plot, explain, bench)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="amp-opt",
        description="Plan tensor/data/pipeline-parallel training on heterogeneous GPU clusters.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # usage errors exit with status 2
    try:
        return args.run(args)
    except AmpOptError as exc:
        kind = "infeasible" if exc.exit_code == 3 else "error"
        print(f"amp-opt: {kind}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("amp-opt: interrupted", file=sys.stderr)
        return 130
