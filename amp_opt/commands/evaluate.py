"""``evaluate``: score one plan or a list of plans with the one evaluator.

Exit 0 when every plan fits, 3 (infeasible) when one does not fit in memory: its report says
which stage needs how much.
"""

from __future__ import annotations

import json

from ..model.evaluate import evaluate
from ..model.load import load_instance, load_json
from ..model.plan import load_plans
from ..model.tables import Tables
from ..errors import InfeasibleError
from .common import add_cost_model
from .report import make_console, print_evaluation


def add_arguments(p) -> None:
    """The options of the command."""
    p.add_argument("instance", help="instance JSON file")
    p.add_argument("plan", help="JSON file with a plan object or a list of plans")
    add_cost_model(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of the report")


def run(args) -> int:
    instance = load_instance(args.instance)
    plans, is_list = load_plans(load_json(args.plan, "plan"))
    tables = Tables(instance)
    results = [evaluate(instance, plan, args.cost_model, tables=tables) for plan in plans]
    if args.json:
        out = [r.to_json(instance) for r in results]
        print(json.dumps(out if is_list else out[0], indent=2))
    else:
        console = make_console()
        for r in results:
            print_evaluation(instance, r, console)
    return 0 if all(r.feasible for r in results) else InfeasibleError.exit_code
