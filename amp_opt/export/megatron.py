"""The Megatron-LM export: command-line arguments, the layer split and the launch mapping."""

from __future__ import annotations

from typing import Any

from ..model.plan import Plan, check_plan
from .ranks import batch_sizes, launch_layout, stage_layers

# Layer kinds that Megatron-LM's GPT model builds outside its transformer block.
PRE_KINDS = ("embedding",)
POST_KINDS = ("head",)
NOOP_KINDS = ("noop",)
TRANSFORMER_KIND = "transformer"
LAYOUT_NOTE = (
    "--pipeline-model-parallel-layout needs Megatron-LM core_v0.13.0 or later, from the Megatron-LM repository "
    "(github.com/NVIDIA/Megatron-LM: the flag is parsed by megatron/training/arguments.py, which the megatron-core "
    "pip package does not contain); Megatron marks it experimental. Older versions have no flag for this split: "
    "--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers (core_r0.9.0 and later) only express "
    "splits whose middle stages hold equally many layers, so pick such a plan (solve --top-k lists alternatives) "
    "or upgrade")
FIRST_LAST_NOTE = ("--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers need Megatron-LM "
                   "core_r0.9.0 or later (megatron/training/arguments.py of the Megatron-LM repository)")


def transformer_split(instance, plan: Plan) -> tuple[list[int], list[str], list[str]]:
    """Transformer layers per stage, problems that make the split inexpressible in Megatron, and notes."""
    counts = [0] * plan.pp
    problems, notes = [], []
    last = plan.pp - 1
    first_t = next((i for i, l in enumerate(instance.layers) if l.kind == TRANSFORMER_KIND), None)
    last_t = max((i for i, l in enumerate(instance.layers) if l.kind == TRANSFORMER_KIND), default=None)
    for s in range(plan.pp):
        for i in plan.stage_layers(s):
            layer = instance.layers[i]
            if layer.kind == TRANSFORMER_KIND:
                counts[s] += 1
            elif layer.kind in PRE_KINDS and s != 0:
                problems.append(f"{layer.kind} layer {i} ({layer.name}) is on stage {s}; Megatron builds it on the first stage")
            elif layer.kind in POST_KINDS and s != last:
                problems.append(f"{layer.kind} layer {i} ({layer.name}) is on stage {s}; Megatron builds it on the last stage")
            elif layer.kind not in PRE_KINDS + POST_KINDS + NOOP_KINDS:
                where = "before" if first_t is not None and i < first_t else "after" if last_t is not None and i > last_t else "among"
                notes.append(f"layer {i} ({layer.name}) of kind {layer.kind!r} is not a Megatron GPT layer "
                             f"({where} the transformer layers); it is not counted in the split")
    return counts, problems, notes


def megatron_split_args(counts: list[int]) -> tuple[list[str], str]:
    """The Megatron-LM flags for a per-stage transformer layer count, and which mechanism they use.

    Even split: no flag.  Equal middle stages: --decoder-first/last-pipeline-num-layers
    (Megatron spreads the rest evenly over the middle stages).  Otherwise
    --pipeline-model-parallel-layout (E: embedding, t: transformer layer, L: loss, '|' between stages).
    """
    if len(counts) == 1 or len(set(counts)) == 1:
        return [], "even"
    middle = counts[1:-1]
    if min(counts) > 0 and len(set(middle)) <= 1:
        return ["--decoder-first-pipeline-num-layers", str(counts[0]),
                "--decoder-last-pipeline-num-layers", str(counts[-1])], "first-last"
    return ["--pipeline-model-parallel-layout", megatron_layout(counts)], "layout"


def megatron_layout(counts: list[int]) -> str:
    """The --pipeline-model-parallel-layout string: embedding on the first stage, loss on the last."""
    stages = ["" if c == 0 else "t" if c == 1 else f"t*{c}" for c in counts]
    stages[0] = "E" + stages[0]
    stages[-1] = stages[-1] + "L"
    return "|".join(stages)


def export_megatron(instance, plan: Plan) -> dict[str, Any]:
    """Megatron-LM command-line arguments for the plan, the layer split and the launch mapping."""
    plan = check_plan(instance, plan)
    batch, micro, _ = batch_sizes(instance, plan)
    counts, problems, notes = transformer_split(instance, plan)
    args = ["--tensor-model-parallel-size", str(plan.tp), "--pipeline-model-parallel-size", str(plan.pp),
            "--micro-batch-size", str(micro), "--global-batch-size", str(batch),
            "--num-layers", str(sum(counts))]
    split: dict[str, Any] = {"transformer_layers_per_stage": counts}
    if problems:
        split.update(expressible=False, method=None, problems=problems,
                     note="no Megatron-LM flag places these layers; no split flag is emitted")
    else:
        flags, method = megatron_split_args(counts)
        if method == "layout" or any(c == 0 for c in counts):
            notes.append(LAYOUT_NOTE)
        elif method == "first-last":
            notes.append(FIRST_LAST_NOTE)
        args += flags
        split.update(expressible=True, method=method, args=flags)
        if plan.pp > 1 and method != "layout":
            split["equivalent_layout"] = megatron_layout(counts)
    if instance.training.zero_stage >= 1:
        args.append("--use-distributed-optimizer")
        notes.append("ZeRO-1: --use-distributed-optimizer shards optimizer states over the data-parallel ranks")
    if sum(counts) == 0:
        problems.append("the model has no layer of kind 'transformer'")
    return {
        "format": "amp_opt.export.megatron",
        "args": args,
        "command_line": " ".join(_quote(a) for a in args),
        "degrees": {"tp": plan.tp, "dp": plan.dp, "pp": plan.pp},
        "data_parallel_size": f"Megatron derives dp = world_size / (tp*pp) = {plan.dp}",
        "layer_split": split,
        "stages": stage_layers(instance, plan),
        "notes": notes,
        "launch": launch_layout(instance, plan),
    }


def _quote(arg: str) -> str:
    return f'"{arg}"' if any(c in arg for c in "|*() ") else arg
