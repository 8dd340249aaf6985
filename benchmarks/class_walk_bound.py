"""How far the class-stage walk's bound rises in a fixed time, with and without S16.

Usage (from the project root):

    python benchmarks/class_walk_bound.py --seconds 20 FILE=SECONDS [FILE=SECONDS ...]

For each instance (its ``search.engine`` set to "amp_opt") the walk over the class-stage space R
(``amp_opt/search/class_walk.py``, ``formulations/uneven-search.md`` S6-S16) runs alone for
``--seconds`` below the given incumbent SECONDS (a plan's iteration seconds, such as the best
plan ``solve`` found), without pricing the configurations it lists: the least key reached then
bounds every configuration not yet listed, and is what the search reports over R when its share of
the time ends there (the search also prices what it lists, so it gets less far).  Each instance
runs twice in this process, with S16 (the stages' positions in the pipeline, the default) and
without it (``Bounds.positions`` off); a walk that ends before the time is up has proven every
configuration of R at or above the incumbent (bound: the incumbent).  Without S16 the walk's key
also takes the least pipeline weight at the deepest pipeline allowed, as before S16 (with it, at
the deepest one each heap entry leads to).  Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from amp_opt import parse_instance  # noqa: E402
from amp_opt.bench.writers import commit, machine_info  # noqa: E402
from amp_opt.search.class_bounds import Bounds  # noqa: E402
from amp_opt.search.class_walk import ranked  # noqa: E402
from amp_opt.search.options import solve_options  # noqa: E402
from amp_opt.model.tables import Tables  # noqa: E402


def walk(instance, below: float, seconds: float, positions: bool) -> tuple[float, int, bool]:
    """(the least key reached, configurations listed, whether the walk ended) after ``seconds``."""
    bounds = Bounds(instance, Tables(instance), solve_options().model)
    bounds.positions = positions
    start, key, listed = time.perf_counter(), 0.0, 0
    for key, _, order in ranked(instance, bounds, limit=lambda: below):
        listed += order is not None
        if key >= below:
            return below, listed, True
        if time.perf_counter() - start > seconds:
            return key, listed, False
    return below, listed, True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+", metavar="FILE=SECONDS", help="an instance and the incumbent below which to walk")
    parser.add_argument("--seconds", type=float, default=20.0, help="walking time per instance and variant (default 20)")
    args = parser.parse_args()
    print("# The class-stage walk's bound after a fixed time, with and without S16\n")
    print(f"Command: `python benchmarks/class_walk_bound.py --seconds {args.seconds:g} {' '.join(args.cases)}` "
          f"(commit {commit(ROOT)})\n")
    info = machine_info()
    print("Machine: " + ", ".join(f"{k} {v}" for k, v in info.items()) + "\n")
    print("| instance | incumbent s | without S16: bound s (gap), listed | with S16: bound s (gap), listed |")
    print("|---|---|---|---|")
    for case in args.cases:
        path, _, value = case.rpartition("=")
        below = float(value)
        doc = json.loads(Path(path).read_text())
        doc.setdefault("search", {})["engine"] = "amp_opt"
        instance = parse_instance(doc, base_dir=Path(path).resolve().parent)
        cells = []
        for positions in (False, True):
            key, listed, ended = walk(instance, below, args.seconds, positions)
            gap = (below - key) / below
            cells.append(f"{key:.6g} ({100 * gap:.2f}%{', walk ended' if ended else ''}), {listed}")
        print(f"| {Path(path).stem} | {below:g} | {cells[0]} | {cells[1]} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
