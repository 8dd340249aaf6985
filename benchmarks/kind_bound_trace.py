"""How fast the Lagrangian kind bound (eq. B4) of candidates rises: DP paths, seconds and bound.

Usage (from the project root, after `pip install .`):

    python -m amp_opt generate --seed 8 --nodes 128 --devices-per-node 8 --device-types 4 --layers 96 -o g8.json
    python benchmarks/kind_bound_trace.py g8.json --target 0.383386 --lowest 12 --paths 600
    python benchmarks/kind_bound_trace.py g8.json --target 0.3833858 --step 400 \\
        --candidate "tp=8 cp=8 dp=1 pp=16 micro_batch=1 sequence_parallel zero_stage=1"

The first form takes the candidates of the lowest cheap bounds (B3) of the whole cluster and
raises each one's kind bound towards ``--target`` seconds for at most ``--paths`` DP paths,
printing the bound reached, the paths spent and the seconds (building its kind tables
included); run at two commits, equal lines say the search took the same steps.  The second
form raises one candidate's bound in steps of ``--step`` paths until it reaches the target (or
its cells are as fine as they get), a line per step.  One process, no time limit.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from amp_opt import load_instance  # noqa: E402
from amp_opt.model.candidates import candidates  # noqa: E402
from amp_opt.model.plan import describe_candidate  # noqa: E402
from amp_opt.search.context import Search  # noqa: E402
from amp_opt.search.kinds.bound import KindSearch  # noqa: E402
from amp_opt.search.kinds.lagrangian import kind_model  # noqa: E402
from amp_opt.search.options import solve_options  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("instance")
    ap.add_argument("--target", type=float, required=True, help="seconds the bounds are raised towards")
    ap.add_argument("--lowest", type=int, default=12, help="candidates of the lowest B3 bounds (default 12)")
    ap.add_argument("--paths", type=int, default=600, help="DP paths per candidate in the first form (default 600)")
    ap.add_argument("--candidate", help="one candidate, as the solver describes it: traced in steps")
    ap.add_argument("--step", type=int, default=400, help="DP paths per line when tracing one candidate (default 400)")
    args = ap.parse_args()
    inst = load_instance(args.instance)
    search = Search(inst, solve_options(solver="cpsat"))
    cands = candidates(inst, search.model)
    if args.candidate is not None:
        chosen = [c for c in cands if describe_candidate(c) == args.candidate]
        if not chosen:
            print(f"error: no candidate {args.candidate!r}", file=sys.stderr)
            return 2
        trace(search, chosen[0], args.target, args.step)
        return 0
    low = {c: search.lower_bound(c, labelled=False) for c in cands}
    total = 0.0
    for c in sorted(cands, key=lambda c: (low[c], c))[:args.lowest]:
        began = time.perf_counter()
        model = kind_model(search.tables, c, search.chunks(c), search.model)
        if model is None:
            print(f"B3 {low[c]:.6f}: no kind model (too many node classes)  {describe_candidate(c)}")
            continue
        target = min(args.target, model.ceiling)
        found = KindSearch(model, target)
        bound = found.raise_to(target, args.paths)
        took = time.perf_counter() - began
        total += took
        print(f"B3 {low[c]:.6f} -> {bound:.9f}  paths {found.sweeps}  {took:.2f} s  {describe_candidate(c)}", flush=True)
    print(f"total {total:.2f} s")
    return 0


def trace(search, cand, target: float, step: int) -> None:
    """The candidate's kind bound raised in steps of ``step`` paths, a line each."""
    began = time.perf_counter()
    model = kind_model(search.tables, cand, search.chunks(cand), search.model)
    found = KindSearch(model, target)
    print(f"{time.perf_counter() - began:7.2f} s  paths {found.sweeps:6d}  bound {found.bound:.9f}", flush=True)
    while True:
        before = found.sweeps
        bound = found.raise_to(target, step)
        print(f"{time.perf_counter() - began:7.2f} s  paths {found.sweeps:6d}  bound {bound:.9f}  "
              f"cells {len(found.heap)}", flush=True)
        if bound >= target or not found.heap or found.sweeps == before:
            break  # reached, or no cell left to refine (as fine as they get)


if __name__ == "__main__":
    raise SystemExit(main())
