"""``solve``: find the fastest plan of an instance and print it (a report, or JSON)."""

from __future__ import annotations

import json

from ..model.load import load_instance
from ..model.placement import PLACEMENTS
from ..search.solve import solve
from .common import add_cost_model, add_plugins, load_plugins, positive_float, positive_int, progress_printer


def add_arguments(p) -> None:
    """The options of the command."""
    p.add_argument("instance", help="instance JSON file")
    p.add_argument("--solver", default="auto", metavar="NAME",
                   help="auto (default): the exact enumerator, or CP-SAT when free grouping is too large to "
                        "enumerate; enumerate, cpsat, cbc, highs, their variants, or a plug-in's name "
                        "(bench --list-solvers lists them)")
    add_plugins(p)
    add_cost_model(p)
    p.add_argument("--placement", choices=PLACEMENTS, default=None,
                   help="free: the solver groups devices into stages (default under hetero); "
                        "rank-order: Megatron/DeepSpeed rank order (default under amp)")
    p.add_argument("--top-k", type=positive_int, default=1, metavar="K", help="also report the K best plans")
    p.add_argument("--time-limit", type=positive_float, default=None, metavar="S", help="seconds for the whole search")
    p.add_argument("--seed", type=int, default=0, help="solver random seed (MIP solvers)")
    p.add_argument("--workers", type=positive_int, default=1,
                   help="solver threads (MIP solvers; default 1 for repeatable runs)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the report")


def run(args) -> int:
    load_plugins(args.plugin)
    instance = load_instance(args.instance)
    result = solve(instance, solver=args.solver, cost_model=args.cost_model, placement=args.placement,
                   top_k=args.top_k, time_limit=args.time_limit, seed=args.seed, workers=args.workers,
                   progress=None if args.json else progress_printer())
    if args.json:
        print(json.dumps(result.to_json(instance, with_top=args.top_k > 1), indent=2))
    else:
        from .report import print_solve  # rich is imported for the report only: --json does not pay for it

        print_solve(instance, result, show_top=args.top_k > 1)
    return 0
