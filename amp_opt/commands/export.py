"""``export``: turn a plan into what a training run needs (DeepSpeed config, Megatron-LM flags,
FlagScale's heterogeneous-training config for plans whose stages differ, or Hetu's strategy for
plans of several pipelines).

The exports carry the batch arithmetic, the pipeline layer split and the
rank-to-device mapping that realises the plan's ``stages`` (:mod:`amp_opt.export`).
"""

from __future__ import annotations

import json
import sys

from ..export.deepspeed import export_deepspeed
from ..export.flagscale import export_flagscale
from ..export.hetu import export_hetu
from ..export.megatron import export_megatron
from ..model.evaluate import evaluate
from ..model.load import load_instance
from ..model.plan import check_plan
from .common import add_cost_model, load_single_plan, write_text

EXPORTERS = {"deepspeed": export_deepspeed, "megatron": export_megatron, "flagscale": export_flagscale,
             "hetu": export_hetu}


def add_arguments(p) -> None:
    """The options of the command."""
    p.add_argument("instance", help="instance JSON file")
    p.add_argument("plan", help="JSON file with one plan object (several pipelines: --format hetu only)")
    p.add_argument("--format", choices=list(EXPORTERS), required=True,
                   help="deepspeed: a DeepSpeed config file plus the stage boundaries and launch mapping; "
                        "megatron: Megatron-LM arguments; flagscale: FlagScale's heterogeneous-training config "
                        "(process meshes with their own tp, dp and device type); hetu: Hetu's heterogeneous strategy "
                        "(several pipelines, each with its own stages, tp per stage and micro-batch count; "
                        "required)")
    p.add_argument("-o", "--output", default=None, metavar="FILE",
                   help="file to write (default: stdout)")
    add_cost_model(p, "cost model whose verdict is attached (predicted time, feasibility)")


def run(args) -> int:
    instance = load_instance(args.instance)
    plan = check_plan(instance, load_single_plan(args.plan))
    out = EXPORTERS[args.format](instance, plan)
    ev = evaluate(instance, plan, args.cost_model)
    # The DeepSpeed file is DeepSpeed's config: amp_opt's additions stay under its amp_opt key.
    (out["amp_opt"] if args.format == "deepspeed" else out)["evaluation"] = {
        "cost_model": ev.cost_model, "predicted_time": ev.predicted_time, "feasible": ev.feasible,
        "violations": list(ev.violations)}
    if not ev.feasible:
        print("amp-opt: warning: the plan does not fit in memory: " + "; ".join(ev.violations), file=sys.stderr)
    write_text(json.dumps(out, indent=2) + "\n", args.output)
    return 0
