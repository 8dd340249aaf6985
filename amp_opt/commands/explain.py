"""``explain``: why a plan (or an instance) does not fit in memory, and what would make it fit.

The analysis is the library's (:mod:`amp_opt.search.alternatives`: every number from the
evaluator or the exact search); this command loads the files and prints it as text or JSON.
"""

from __future__ import annotations

import json
from typing import Any

from ..model.load import load_instance
from ..model.plan import describe, parse_plan, partition_text
from ..search.alternatives import GIB, explain_instance, explain_plan
from .common import add_cost_model, load_single_plan, positive_float

__all__ = ["add_arguments", "explain_instance", "explain_plan", "instance_text", "plan_text", "run"]


# ---------------------------------------------------------------------------
# Text


def _gib(x: float) -> str:
    return f"{x / GIB:.2f} GiB"


def _degrees(plan_doc: dict, stage: dict) -> str:
    """A stage's own tp, dp and shares, when the plan's stages or replicas differ (and its pipeline)."""
    head = f"; pipeline {stage['pipeline']}" if "pipeline" in stage else ""
    if not head and "shares" not in plan_doc and isinstance(plan_doc["tp"], int) and isinstance(plan_doc["dp"], int):
        return head
    shares = "+".join(map(str, stage["shares"]))
    return f"{head}; tp {stage['tp']}, dp {stage['dp']}, samples per replica {shares}"


def plan_text(instance, doc: dict[str, Any]) -> str:
    p = doc["plan"]
    plan = parse_plan(p)
    lines = [f"{instance.name}: {describe(plan)} partition{'s' if 'pipelines' in p else ''} {partition_text(plan)} "
             f"(cost model {doc['cost_model']})"]
    if doc.get("note"):
        lines.append(f"note: {doc['note']}")
    if doc["fits"]:
        lines.append(f"the plan fits in memory; predicted {doc['predicted_time']:.4f} s per iteration. Headroom per device:")
        for s in doc["stages"]:
            lines.append(f"  stage {s['stage']} ({', '.join(s['device_types'])}{_degrees(p, s)}): "
                         f"{_gib(s['memory'])} of {_gib(s['capacity'])}, headroom {_gib(s['headroom'])}")
        return "\n".join(lines)
    lines.append("the plan does NOT fit in memory:")
    for o in doc["overflows"]:
        s = doc["stages"][o["position"]]
        lines.append(
            f"  stage {o['stage']} on {o['device_type']}{_degrees(p, s)}: needs {_gib(o['memory'])} per device, capacity "
            f"{_gib(o['capacity'])}, over by {_gib(o['over_bytes'])} ({o['over_bytes']:.0f} bytes); "
            f"model state {_gib(s['model_state'])}, activations {_gib(s['activations'])}, reserve "
            f"{_gib(s['reserve'])}: {o['dominant']} dominates")
    fit = [a for a in doc["alternatives"] if a["fits"]]
    lines.append("alternatives (each scored by the evaluator):")
    for a in doc["alternatives"]:
        verdict = f"FITS, {a['predicted_time']:.4f} s" if a["fits"] else "does not fit"
        lines.append(f"  {a['change']}: {verdict} ({a['detail']})")
    if fit:
        best = min(fit, key=lambda a: a["predicted_time"])
        lines.append(f"fastest that fits: {best['change']} -> {json.dumps(best['plan'])}")
    else:
        lines.append("none of the alternatives fits; try `amp-opt explain INSTANCE` without a plan")
    return "\n".join(lines)


def instance_text(instance, doc: dict[str, Any]) -> str:
    head = f"{instance.name}: {instance.num_devices} devices, {instance.num_layers} layers (cost model {doc['cost_model']})"
    if doc["solvable"]:
        p = doc["plan"]
        return (f"{head}\nsolvable: the best plan {describe(parse_plan(p))} "
                f"takes {doc['predicted_time']:.4f} s per iteration; "
                f"smallest headroom {_gib(min(s['headroom'] for s in doc['stages']))}")
    lines = [head, f"no plan fits: {doc['reason']}", "relaxations (each solved on a modified instance):"]
    for r in doc["relaxations"]:
        if r["fits"]:
            p = r["plan"]
            lines.append(f"  {r['change']}: FITS, best {describe(parse_plan(p))} at {r['predicted_time']:.4f} s")
        elif r["fits"] is None:
            lines.append(f"  {r['change']}: no verdict within the time limit")
        else:
            lines.append(f"  {r['change']}: still infeasible")
    if all(r["fits"] is False for r in doc["relaxations"]):
        lines.append("nothing tried fits: the model needs more (or larger) devices")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Command


def add_arguments(p) -> None:
    """The options of the command."""
    p.add_argument("instance", help="instance JSON file")
    p.add_argument("plan", nargs="?", default=None, help="JSON file with one plan object (optional)")
    add_cost_model(p)
    p.add_argument("--time-limit", type=positive_float, default=30.0, metavar="S",
                   help="seconds for each solve when explaining an instance (default: 30)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")


def run(args) -> int:
    instance = load_instance(args.instance)
    if args.plan is not None:
        doc = explain_plan(instance, load_single_plan(args.plan), args.cost_model)
        text = plan_text(instance, doc)
    else:
        doc = explain_instance(instance, args.cost_model, args.time_limit)
        text = instance_text(instance, doc)
    print(json.dumps(doc, indent=2) if args.json else text)
    return 0
