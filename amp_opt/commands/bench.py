"""``bench``: run solvers (built-in variants and plug-ins) on instance suites, files, folders or globs,
repeated with different seeds, here or on a Dask cluster; report as MIPLIB and Mittelmann do."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from ..bench.run import DEFAULT_TIME_LIMIT, run_bench
from ..bench.runner import MARGIN_FRACTION, MARGIN_SECONDS
from ..bench.suites import SUITE_CHOICES
from .common import add_plugins, load_plugins, positive_float, positive_int


def add_arguments(p) -> None:
    """The options of the command."""
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help="instance files, folders (their *.json) or globs; without any, --suite paper")
    p.add_argument("--suite", choices=SUITE_CHOICES, default=None,
                   help="paper: the AMP paper's 3 instances; scale: instances/suite/scale; all: both "
                        "(default paper when no PATH is given)")
    p.add_argument("--solvers", default="enumerate", type=_solver_list, metavar="LIST",
                   help="comma-separated solver names (--list-solvers shows them); default enumerate")
    add_plugins(p)
    p.add_argument("--list-solvers", action="store_true", help="list every solver name with one line on what it is")
    p.add_argument("--time-limit", type=positive_float, default=DEFAULT_TIME_LIMIT, metavar="S",
                   help=f"seconds per solve (default {DEFAULT_TIME_LIMIT:g}); a job is killed after "
                        f"{1 + MARGIN_FRACTION:g} x S + {MARGIN_SECONDS:g} s")
    p.add_argument("--repeats", type=positive_int, default=1, metavar="N",
                   help="run each (instance, solver) N times with seeds SEED, SEED+1, ... (default 1)")
    p.add_argument("--seed", type=int, default=0, help="the first repeat's seed (default 0)")
    p.add_argument("--jobs", type=positive_int, default=1, metavar="N",
                   help="run N jobs at once on this machine, each on its own cores when they suffice "
                        "(default 1: the fairest timings)")
    p.add_argument("--threads", type=positive_int, default=1, metavar="T",
                   help="threads per solver (CP-SAT workers, CBC and HiGHS threads, BLAS pools; default 1)")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="run the jobs on an existing Dask distributed cluster (e.g. tcp://host:8786) "
                        "instead of here; needs amp_opt[dist]")
    p.add_argument("--no-baselines", dest="baselines", action="store_false",
                   help="skip the amp-model optimum, the expert default and the ideal bound (faster sweeps)")
    p.add_argument("--out", default="benchmarks/results", metavar="DIR",
                   help="output directory (default: benchmarks/results)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def _solver_list(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of solver names, got {text!r}")
    return names


def command_line(args) -> str:
    """The command that reproduces a run, spelled out from its parsed options."""
    parts = ["python -m amp_opt bench"] + [shlex.quote(p) for p in args.paths]
    if args.suite is not None:
        parts += ["--suite", args.suite]
    for module in args.plugin:
        parts += ["--plugin", shlex.quote(module)]
    parts += ["--solvers", ",".join(args.solvers), "--time-limit", f"{args.time_limit:g}"]
    if args.repeats != 1:
        parts += ["--repeats", str(args.repeats)]
    if args.seed != 0:
        parts += ["--seed", str(args.seed)]
    if args.jobs != 1:
        parts += ["--jobs", str(args.jobs)]
    if args.threads != 1:
        parts += ["--threads", str(args.threads)]
    if args.scheduler:
        parts += ["--scheduler", shlex.quote(args.scheduler)]
    if not args.baselines:
        parts.append("--no-baselines")
    return " ".join(parts + ["--out", shlex.quote(str(args.out))])


def list_solvers() -> int:
    from ..search.registry import solvers

    known = solvers()
    width = max(len(n) for n in known)
    for name, entry in known.items():
        origin = "" if entry.builtin else f"  [plug-in: {entry.module}]"
        print(f"{name:<{width}}  {entry.description}{origin}")
    return 0


def run(args) -> int:
    """``amp-opt bench``: run, write the files, print where they are."""
    if args.list_solvers:
        load_plugins(args.plugin)
        return list_solvers()
    rows = run_bench(args.suite, args.solvers, args.time_limit, Path(args.out), progress=not args.quiet,
                     command=command_line(args), paths=args.paths, repeats=args.repeats, seed=args.seed,
                     jobs=args.jobs, threads=args.threads, scheduler=args.scheduler, baselines=args.baselines,
                     plugins=args.plugin)
    failed = sum(row["status"] not in ("OPTIMAL", "FEASIBLE", "INFEASIBLE") for row in rows)
    wrong = sum(bool(row["wrong"]) for row in rows)
    print(f"{len(rows)} runs, {sum(bool(r['solved']) for r in rows)} solved, {failed} without a plan or a proof"
          + (f", {wrong} WRONG" if wrong else "") + f"; results in {args.out}/results.md")
    return 0
