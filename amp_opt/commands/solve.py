"""``solve``: find the fastest plan of an instance and print it (a report, or JSON)."""

from __future__ import annotations

import json

from ..errors import InfeasibleError, NoPlanFound
from ..model.load import load_instance
from ..model.placement import PLACEMENTS
from ..search.solve import solve
from .common import add_cost_model, add_plugins, load_plugins, positive_float, positive_int, progress_printer


def add_arguments(p) -> None:
    """The options of the command."""
    p.add_argument("instance", help="instance JSON file")
    p.add_argument("--solver", default="auto", metavar="NAME",
                   help="auto: the exact enumerator, or CP-SAT when free grouping is too large to enumerate "
                        "(decided from the instance's size before either starts); enumerate; cpsat: OR-Tools "
                        "CP-SAT; cbc: CBC through PuLP; highs: HiGHS (needs amp_opt[highs]); their variants, or "
                        "a plug-in's name (bench --list-solvers lists them) (default: auto)")
    add_plugins(p)
    add_cost_model(p)
    p.add_argument("--placement", choices=PLACEMENTS, default=None,
                   help="free: the solver groups devices into stages (default under hetero); "
                        "rank-order: Megatron/DeepSpeed rank order (default under amp)")
    p.add_argument("--top-k", type=positive_int, default=1, metavar="K",
                   help="also report the K best plans (default: 1)")
    p.add_argument("--per-candidate", action="store_true",
                   help="with --top-k: each (tp, dp, pp, micro-batch, settings) candidate's best plan only, the K "
                        "best of those (AMP's ranking of candidates) rather than the K best plans")
    p.add_argument("--pipelines", choices=("skip", "bound"), default="skip",
                   help="on search.engine amp_opt: skip: plans of several pipelines are not searched (OPTIMAL says "
                        "so); bound: on a small cluster also solve every split of its devices and batch and, when "
                        "no split's slowest pipeline alone beats the plan found, OPTIMAL covers them too "
                        "(default: skip)")
    p.add_argument("--time-limit", type=positive_float, default=None, metavar="S",
                   help="seconds for the whole run, loading and writing included (a little more on very large "
                        "instances); when it cuts the search short, the best plan so far is printed with status "
                        "FEASIBLE and its proven gap; exit 4 if no plan was found by then (default: none, search "
                        "until proven optimal)")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="random seed of the MIP solvers (default: 0)")
    p.add_argument("--workers", type=positive_int, default=1, metavar="N",
                   help="threads of the MIP solvers (default: 1, which makes runs repeatable)")
    p.add_argument("--processes", type=positive_int, default=2, metavar="N",
                   help="with --time-limit and idle GPUs allowed: search the whole cluster in this process and the "
                        "other subsets of node classes in up to N-1 processes beside it, no more than the usable "
                        "cores (default: 2; 1 searches them one after another; Linux only)")
    p.add_argument("--objective", choices=("time", "cost"), default="time",
                   help="time: seconds per iteration (default); cost: USD per iteration at the used devices' prices")
    p.add_argument("--budget", type=positive_float, default=None, metavar="USD_PER_HOUR",
                   help="the devices a plan uses may cost at most this many USD per hour (GPU prices: the catalog's "
                        "or the instance's device_types[].price_per_hour; default: none)")
    p.add_argument("--json", action="store_true",
                   help="print JSON instead of the report; also when no plan is found: {\"status\", \"reason\"}")


def run(args) -> int:
    load_plugins(args.plugin)
    instance = load_instance(args.instance)
    try:
        result = solve(instance, solver=args.solver, cost_model=args.cost_model, placement=args.placement,
                       top_k=args.top_k, per_candidate=args.per_candidate, pipelines=args.pipelines, time_limit=args.time_limit,
                       seed=args.seed, workers=args.workers,
                       objective=args.objective, budget=args.budget, processes=args.processes,
                       progress=None if args.json else progress_printer(), started=getattr(args, "started", None))
    except (InfeasibleError, NoPlanFound) as exc:
        if args.json:  # a reader of --json always gets an object: the status and why
            status = "INFEASIBLE" if isinstance(exc, InfeasibleError) else "UNKNOWN"
            print(json.dumps({"status": status, "reason": str(exc)}, indent=2))
        raise
    if args.json:
        print(json.dumps(result.to_json(instance, with_top=args.top_k > 1), indent=2))
    else:
        from .report import print_solve  # rich is imported for the report only: --json does not pay for it

        print_solve(instance, result, show_top=args.top_k > 1)
    return 0
