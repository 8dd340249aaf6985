"""The Megatron-LM export: command-line arguments, the layer split and the launch mapping.

Every decision of a plan becomes Megatron-LM flags (``megatron/training/arguments.py``
and the config dataclasses it turns into flags): ``--context-parallel-size``,
``--sequence-parallel``, ``--recompute-granularity`` / ``--recompute-method`` /
``--recompute-num-layers``, ``--use-distributed-optimizer`` (ZeRO-1) or Megatron-FSDP
(ZeRO-2/3), and for interleaving ``--num-virtual-stages-per-pipeline-rank`` with
``--account-for-embedding/loss-in-pipeline-split`` or a ``--pipeline-model-parallel-layout``
of the plan's chunks.  The versions that first have each flag are in the notes.
"""

from __future__ import annotations

from typing import Any

from ..model.engines import ENGINES, megatron_split
from ..model.plan import Plan, check_plan
from .ranks import batch_sizes, launch_layout, require_uniform, stage_layers

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
VIRTUAL_NOTE = ("--num-virtual-stages-per-pipeline-rank and --account-for-embedding/loss-in-pipeline-split need "
                "Megatron-LM core_v0.11.0 or later; before, --num-layers-per-virtual-pipeline-stage "
                "(transformer layers per chunk) expresses an even split without the embedding or the loss counted")
FSDP_NOTE = ("ZeRO-{z}: Megatron-FSDP (--use-megatron-fsdp, core_v0.14.0 and later; --use-custom-fsdp in core_v0.12 "
             "and v0.13) with --data-parallel-sharding-strategy {strategy}; amp_opt plans it without pipeline "
             "parallelism")
FIRST_LAST_NOTE = ("--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers need Megatron-LM "
                   "core_r0.9.0 or later (megatron/training/arguments.py of the Megatron-LM repository)")


def transformer_split(instance, plan: Plan) -> tuple[list[int], list[str], list[str]]:
    """Transformer layers per chunk of the partition (per stage without interleaving; pp*v chunks
    in layer order with it), problems that make the split inexpressible in Megatron, and notes."""
    chunks = list(zip(plan.partition, plan.partition[1:]))
    counts = [0] * len(chunks)
    problems, notes = [], []
    last = len(chunks) - 1
    first_t = next((i for i, l in enumerate(instance.layers) if l.kind == TRANSFORMER_KIND), None)
    last_t = max((i for i, l in enumerate(instance.layers) if l.kind == TRANSFORMER_KIND), default=None)
    what = "chunk" if plan.virtual_stages > 1 else "stage"
    for c, (k, l) in enumerate(chunks):
        for i in range(k, l):
            layer = instance.layers[i]
            if layer.kind == TRANSFORMER_KIND:
                counts[c] += 1
            elif layer.kind in PRE_KINDS and c != 0:
                problems.append(f"{layer.kind} layer {i} ({layer.name}) is on {what} {c}; Megatron builds it on the first {what}")
            elif layer.kind in POST_KINDS and c != last:
                problems.append(f"{layer.kind} layer {i} ({layer.name}) is on {what} {c}; Megatron builds it on the last {what}")
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


def decision_args(instance, plan: Plan) -> tuple[list[str], list[str]]:
    """Flags and notes for a checked plan's context and sequence parallelism, recomputation,
    ZeRO stage and attention kernel."""
    args, notes = [], []
    if plan.cp > 1:
        args += ["--context-parallel-size", str(plan.cp)]
    if plan.sequence_parallel:
        args.append("--sequence-parallel")
    if plan.recompute == "selective":
        args += ["--recompute-granularity", "selective"]
    elif plan.recompute == "full" and plan.recompute_layers:
        args += ["--recompute-granularity", "full", "--recompute-method", "block",
                 "--recompute-num-layers", str(plan.recompute_layers)]
        notes.append(f"full recomputation of the first {plan.recompute_layers} transformer layers of every stage "
                     "(Megatron's block method)")
    elif plan.recompute == "full":  # every layer recomputed on its own, keeping only its input (H7)
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    if plan.zero_stage == 1:
        args.append("--use-distributed-optimizer")
        notes.append("ZeRO-1: --use-distributed-optimizer shards optimizer states over the data-parallel ranks")
    elif plan.zero_stage in (2, 3):
        strategy = "optim_grads" if plan.zero_stage == 2 else "optim_grads_params"
        args += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy]
        notes.append(FSDP_NOTE.format(z=plan.zero_stage, strategy=strategy))
    body = [layer for layer in instance.layers if layer.kind == TRANSFORMER_KIND]
    if body and all(l.kv_bytes.sharded + l.kv_bytes.replicated > 0 and not l.attention_memory_bytes.sharded
                    and not l.attention_memory_bytes.replicated for l in body):
        args += ["--attention-backend", "flash"]
        notes.append("the model was planned with FlashAttention's memory (no s x s scores kept): "
                     "--attention-backend flash (core_v0.11.0 and later; before, --use-flash-attn)")
    return args, notes


def split_args(instance, plan: Plan, counts: list[int]) -> tuple[list[str], dict[str, Any], list[str]]:
    """The layer-split flags of a plan without problems, the split record and notes."""
    notes: list[str] = []
    if plan.virtual_stages > 1:
        even = megatron_split(instance, len(counts))
        if even is not None and tuple(plan.partition) == even.boundaries:
            flags = ["--num-virtual-stages-per-pipeline-rank", str(plan.virtual_stages)]
            flags += ["--account-for-embedding-in-pipeline-split"] if even.embedding_counted else []
            flags += ["--account-for-loss-in-pipeline-split"] if even.loss_counted else []
            notes.append(VIRTUAL_NOTE)
            return flags, {"method": "interleaved-even", "args": flags}, notes
        flags = ["--pipeline-model-parallel-layout", megatron_layout(counts)]
        notes.append(LAYOUT_NOTE)
        return flags, {"method": "layout", "args": flags}, notes
    flags, method = megatron_split_args(counts)
    if method == "layout" or any(c == 0 for c in counts):
        notes.append(LAYOUT_NOTE)
    elif method == "first-last":
        notes.append(FIRST_LAST_NOTE)
    record: dict[str, Any] = {"method": method, "args": flags}
    if plan.pp > 1 and method != "layout":
        record["equivalent_layout"] = megatron_layout(counts)
    return flags, record, notes


def export_megatron(instance, plan: Plan) -> dict[str, Any]:
    """Megatron-LM command-line arguments for the plan, the layer split and the launch mapping.
    A plan Megatron-LM cannot run (e.g. a recomputation mode per stage) is an InputError."""
    plan = check_plan(instance, plan)
    require_uniform(plan, "Megatron-LM")
    ENGINES["megatron"].check(instance, plan)
    batch, micro, _ = batch_sizes(instance, plan)
    counts, problems, notes = transformer_split(instance, plan)
    args = ["--tensor-model-parallel-size", str(plan.tp), "--pipeline-model-parallel-size", str(plan.pp),
            "--micro-batch-size", str(micro), "--global-batch-size", str(batch),
            "--num-layers", str(sum(counts))]
    split: dict[str, Any] = {"transformer_layers_per_stage": [sum(counts[s::plan.pp]) for s in range(plan.pp)]}
    if plan.virtual_stages > 1:
        split["transformer_layers_per_chunk"] = counts
    if problems:
        split.update(expressible=False, method=None, problems=problems,
                     note="no Megatron-LM flag places these layers; no split flag is emitted")
    else:
        flags, record, more = split_args(instance, plan, counts)
        args += flags
        notes += more
        split.update(expressible=True, **record)
    more_args, more_notes = decision_args(instance, plan)
    args += more_args
    notes += more_notes
    if sum(counts) == 0:
        problems.append("the model has no layer of kind 'transformer'")
    return {
        "format": "amp_opt.export.megatron",
        "args": args,
        "command_line": " ".join(_quote(a) for a in args),
        "degrees": {"tp": plan.tp, "cp": plan.cp, "dp": plan.dp, "pp": plan.pp, "virtual_stages": plan.virtual_stages},
        "data_parallel_size": f"Megatron derives dp = world_size / (tp*cp*pp) = {plan.dp}",
        "layer_split": split,
        "stages": stage_layers(instance, plan),
        "notes": notes,
        "launch": launch_layout(instance, plan),
    }


def _quote(arg: str) -> str:
    return f'"{arg}"' if any(c in arg for c in "|*() ") else arg
