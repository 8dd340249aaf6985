"""``bench``: run solvers on an instance suite and compare their plans with baselines."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from ..bench.run import DEFAULT_TIME_LIMIT, run_bench
from ..bench.runner import MARGIN_FRACTION, MARGIN_SECONDS
from ..bench.suites import SUITE_CHOICES
from ..search.options import SOLVERS
from .common import positive_float


def add_arguments(p) -> None:
    """The options of the command."""
    p.add_argument("--suite", choices=SUITE_CHOICES, default="paper",
                   help="paper: the AMP paper's 3 instances; scale: instances/suite/scale; all: both (default: paper)")
    p.add_argument("--solvers", default="enumerate", type=_solver_list, metavar="LIST",
                   help="comma-separated solvers (enumerate,cpsat,cbc); default enumerate")
    p.add_argument("--time-limit", type=positive_float, default=DEFAULT_TIME_LIMIT, metavar="S",
                   help=f"seconds per solve (default {DEFAULT_TIME_LIMIT:g}); a child is killed after "
                        f"{1 + MARGIN_FRACTION:g} x S + {MARGIN_SECONDS:g} s")
    p.add_argument("--out", default="benchmarks/results", metavar="DIR",
                   help="output directory (default: benchmarks/results)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def _solver_list(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in SOLVERS]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(SOLVERS)}, got {text!r}")
    return names


def command_line(args) -> str:
    """The command that reproduces a run, spelled out from its parsed options."""
    parts = ["python -m amp_opt bench", "--suite", args.suite, "--solvers", ",".join(args.solvers),
             "--time-limit", f"{args.time_limit:g}", "--out", shlex.quote(str(args.out))]
    return " ".join(parts)


def run(args) -> int:
    """``amp-opt bench``: run, write the files, print where they are."""
    rows = run_bench(args.suite, args.solvers, args.time_limit, Path(args.out), progress=not args.quiet,
                     command=command_line(args))
    failed = sum(row["status"] not in ("OPTIMAL", "FEASIBLE") for row in rows)
    print(f"{len(rows)} runs, {failed} without a plan; results in {args.out}/results.md")
    return 0
