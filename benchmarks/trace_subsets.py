"""Trace the idle-GPU search: one line per run of a subset of node classes, or the time of its bounds.

Usage (from the project root, after `pip install .`):

    python -m amp_opt generate --seed 0 --nodes 128 --devices-per-node 8 --device-types 4 --layers 96 -o g0.json
    python benchmarks/trace_subsets.py g0.json --time-limit 60
    python benchmarks/trace_subsets.py g0.json --bounds 108 --count 60
    python benchmarks/trace_subsets.py FILE --bounds NODES --count 0 --only B3 --cutoff 13.31464

The first form runs `python -m amp_opt solve FILE --solver cpsat --time-limit S --json` in
this process (the CLI's own entry point, its clock started at this script's start) and
prints, for every search of a subset, when it started (seconds since the start), its node
count, its cutoff and time limit, and how it ended: its status, plan and bound, or the
exception with the bound it proved, and how long it took (a run longer than its limit
overran its share).  The second form times the labelled bound (B2) and the cheap bound (B3)
of the first COUNT candidates (0: all of them) of the subsets with that many nodes, slowest
last, as a search below ``--cutoff`` seconds asks for them (a subset is searched below the
best plan so far; default: no cutoff, as the whole cluster's search).
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()  # the solve's time limit counts from here, as the CLI's does

import argparse  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import amp_opt.search.solve as solve_module  # noqa: E402


def traced(run):
    """``run`` (one subset's search) printing a line per call."""

    def wrapper(inst, options, clock=None):
        began = time.perf_counter()
        budget = None if clock is None else clock.budget
        head = (f"{began - STARTED:6.2f} s  {len(inst.nodes):4d} nodes  cutoff {options.cutoff:.6f}  "
                f"limit {budget if budget is None else round(budget, 3)}")
        try:
            result = run(inst, options, clock)
        except Exception as exc:
            print(f"{head}  -> {type(exc).__name__}, bound {getattr(exc, 'bound', None)}, "
                  f"{time.perf_counter() - began:.2f} s: {str(exc)[:80]}", file=sys.stderr, flush=True)
            raise
        print(f"{head}  -> {result.solver.status}, plan {result.best.predicted_time:.6f}, "
              f"bound {result.solver.bound:.6f}, {time.perf_counter() - began:.2f} s", file=sys.stderr, flush=True)
        return result

    return wrapper


def time_bounds(path: str, nodes: int, count: int, cutoff: float, only: str | None) -> None:
    import dataclasses
    import math

    from amp_opt import load_instance
    from amp_opt.model.candidates import candidates
    from amp_opt.search.context import Search
    from amp_opt.search.options import solve_options
    from amp_opt.search.device_sets import device_sets

    inst = load_instance(path)
    options = dataclasses.replace(solve_options(solver="cpsat"), cutoff=cutoff)
    parts = [p for p in device_sets(inst, options.model)[0] if len(p.instance.nodes) == nodes]
    if not parts:
        raise SystemExit(f"no set of devices on {nodes} nodes")
    for part in parts:
        search = Search(part.instance, options)
        cands = candidates(part.instance, search.model)
        cands = cands[:count] if count > 0 else cands
        for labelled in (False, True):
            name = "B2" if labelled else "B3"
            if only is not None and only != name:
                continue
            took, below = [], 0
            for cand in cands:
                began = time.perf_counter()
                below += search.lower_bound(cand, labelled=labelled) < cutoff
                took.append(time.perf_counter() - began)
            took.sort()
            where = "" if math.isinf(cutoff) else f", {below} below the cutoff"
            print(f"classes {part.classes}: {name}: {len(took)} candidates, {sum(took):.2f} s in all{where}, "
                  "slowest " + ", ".join(f"{t:.3f}" for t in took[-5:]) + " s", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("instance")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--bounds", type=int, metavar="NODES", help="time the bounds of the subset with NODES nodes")
    parser.add_argument("--count", type=int, default=60, help="candidates whose bounds are timed (default 60; 0: all)")
    parser.add_argument("--cutoff", type=float, default=float("inf"), help="seconds the search is below (default: none)")
    parser.add_argument("--only", choices=("B2", "B3"), help="time one bound only")
    args = parser.parse_args()
    if args.bounds is not None:
        time_bounds(args.instance, args.bounds, args.count, args.cutoff, args.only)
        return 0
    solve_module.run_builtin = traced(solve_module.run_builtin)  # what solve_subsets calls per subset
    from amp_opt.commands.cli import main as cli

    return cli(["solve", args.instance, "--solver", "cpsat", "--time-limit", f"{args.time_limit:g}", "--json"],
               started=STARTED)


if __name__ == "__main__":
    raise SystemExit(main())
