"""``export``: turn a plan into what a training run needs (DeepSpeed config or Megatron-LM flags).

Both exports carry the batch arithmetic, the pipeline layer split and the
rank-to-device mapping that realises the plan's ``stages``: global rank
r = tp_rank + tp*dp_rank + tp*dp*stage (the Megatron/DeepSpeed order) must run
on device ``stages[stage][dp_rank][tp_rank]``.  The functions are pure and
return JSON-ready dicts; ``python -m amp_opt export`` prints or writes them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .errors import InputError
from .plan import Plan, check_plan

FORMATS = ("deepspeed", "megatron")
# Layer kinds that Megatron-LM's GPT model builds outside its transformer block.
PRE_KINDS = ("embedding",)
POST_KINDS = ("head",)
NOOP_KINDS = ("noop",)
TRANSFORMER_KIND = "transformer"


# ---------------------------------------------------------------------------
# Rank-to-device mapping (shared by both formats)


@dataclass(frozen=True)
class Process:
    """One training process: its global rank, coordinates, and the device it must own."""

    rank: int
    stage: int
    dp_rank: int
    tp_rank: int
    device: int  # global device id (node-major)
    node: int  # node index in instance.nodes
    local_device: int  # device index inside its node (the physical CUDA ordinal)


def rank_of(plan: Plan, stage: int, dp_rank: int, tp_rank: int) -> int:
    """Megatron/DeepSpeed rank order: tp fastest, then dp, then pipeline stage."""
    return tp_rank + plan.tp * dp_rank + plan.tp * plan.dp * stage


def processes(instance, plan: Plan) -> tuple[Process, ...]:
    """Every process of a checked plan, by global rank; each device appears exactly once."""
    plan = check_plan(instance, plan)
    out = []
    for s, stage in enumerate(plan.stages):
        for r, group in enumerate(stage):
            for t, device in enumerate(group):
                node = int(instance.device_node[device])
                out.append(Process(rank_of(plan, s, r, t), s, r, t, device, node,
                                   device - instance.node_first_device[node]))
    out.sort(key=lambda p: p.rank)
    if [p.rank for p in out] != list(range(instance.num_devices)) or len({p.device for p in out}) != instance.num_devices:
        raise InputError("plan.stages", "does not map every device to exactly one rank")  # check_plan prevents this
    return tuple(out)


def node_rank_blocks(instance, procs) -> list[tuple[int, int]] | None:
    """(node, first rank) per node in torchrun node-rank order, if every node's ranks are one contiguous block."""
    blocks = []
    for j, node in enumerate(instance.nodes):
        ranks = sorted(p.rank for p in procs if p.node == j)
        if ranks != list(range(ranks[0], ranks[0] + len(ranks))):
            return None
        blocks.append((j, ranks[0]))
    return sorted(blocks, key=lambda b: b[1])


def launch_layout(instance, plan: Plan, master_port: int = 29500) -> dict[str, Any]:
    """Per-node device/rank table, hostfile, and how to launch the processes (torchrun or explicit env)."""
    procs = processes(instance, plan)
    world = len(procs)
    blocks = node_rank_blocks(instance, procs)
    order = [j for j, _ in blocks] if blocks else list(range(len(instance.nodes)))
    master = instance.nodes[order[0]].name
    nodes = []
    for j in order:
        node = instance.nodes[j]
        mine = sorted((p for p in procs if p.node == j), key=lambda p: p.rank)
        visible = ",".join(str(p.local_device) for p in mine)  # CUDA ordinals ordered by rank
        entry: dict[str, Any] = {
            "hostname": node.name,
            "device_type": node.device_type,
            "devices": [instance.node_first_device[j] + i for i in range(node.devices)],
            "local_device_rank": {str(p.local_device): p.rank for p in sorted(mine, key=lambda p: p.local_device)},
            "cuda_visible_devices": visible,
        }
        if blocks:
            entry["node_rank"] = order.index(j)
            entry["launch"] = (
                f"CUDA_VISIBLE_DEVICES={visible} torchrun --nnodes {len(order)} --node-rank {order.index(j)} "
                f"--nproc-per-node {len(mine)} --master-addr {master} --master-port {master_port} TRAIN_SCRIPT ARGS"
            )
        else:
            entry["processes"] = [
                {"RANK": p.rank, "LOCAL_RANK": i, "WORLD_SIZE": world, "CUDA_VISIBLE_DEVICES": visible,
                 "device": p.device, "stage": p.stage, "dp_rank": p.dp_rank, "tp_rank": p.tp_rank}
                for i, p in enumerate(mine)
            ]
            entry["launch"] = _explicit_launch(mine, world, visible, master, master_port)
        nodes.append(entry)
    return {
        "world_size": world,
        "rank_formula": "rank = tp_rank + tp*dp_rank + tp*dp*stage; rank runs on device stages[stage][dp_rank][tp_rank]",
        "torchrun_compatible": blocks is not None,
        "how": (
            "every node's ranks form one contiguous block: start torchrun on each node with the node_rank and "
            "CUDA_VISIBLE_DEVICES below (local rank i then drives the i-th listed GPU)"
            if blocks else
            "some node's ranks are not one contiguous block, so torchrun's node ranks cannot realise this grouping: "
            "start the processes explicitly with the RANK/LOCAL_RANK/WORLD_SIZE/CUDA_VISIBLE_DEVICES of each node's "
            "'processes' table (each process uses cuda:LOCAL_RANK)"
        ),
        "master_addr": master,
        "master_port": master_port,
        "hostfile": "".join(f"{instance.nodes[j].name} slots={instance.nodes[j].devices}\n" for j in order),
        "nodes": nodes,
        "ranks": [{"rank": p.rank, "stage": p.stage, "dp_rank": p.dp_rank, "tp_rank": p.tp_rank, "device": p.device,
                   "hostname": instance.nodes[p.node].name, "local_device": p.local_device} for p in procs],
        "notes": ["hostnames are the instance's node names: replace them with the real host names"],
    }


def _explicit_launch(mine, world: int, visible: str, master: str, port: int) -> str:
    """A bash snippet that starts one node's processes with their rank environment."""
    lines = [f"export MASTER_ADDR={master} MASTER_PORT={port} WORLD_SIZE={world} "
             f"LOCAL_WORLD_SIZE={len(mine)} CUDA_VISIBLE_DEVICES={visible}"]
    for i, p in enumerate(mine):
        lines.append(f"RANK={p.rank} LOCAL_RANK={i} python TRAIN_SCRIPT ARGS &")
    lines.append("wait")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Batch arithmetic and the layer split


def batch_sizes(instance, plan: Plan) -> tuple[int, int, int]:
    """(global batch, micro-batch, gradient accumulation steps = global / (dp * micro))."""
    batch = instance.training.global_batch
    return batch, plan.micro_batch, batch // (plan.dp * plan.micro_batch)


def stage_layers(instance, plan: Plan) -> list[dict[str, Any]]:
    return [
        {"stage": s, "layers": [a, b], "layer_names": [instance.layers[a].name, instance.layers[b - 1].name]}
        for s, (a, b) in enumerate(zip(plan.partition, plan.partition[1:]))
    ]


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


# ---------------------------------------------------------------------------
# DeepSpeed


def export_deepspeed(instance, plan: Plan) -> dict[str, Any]:
    """A DeepSpeed config plus, alongside it, the PipelineModule layout and the launch mapping."""
    plan = check_plan(instance, plan)
    batch, micro, gas = batch_sizes(instance, plan)
    config: dict[str, Any] = {
        "train_batch_size": batch,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": gas,
    }
    if instance.training.zero_stage:
        config["zero_optimization"] = {"stage": instance.training.zero_stage}
    parts = list(plan.partition)
    return {
        "format": "amp_opt.export.deepspeed",
        "deepspeed_config": config,
        "check": f"train_batch_size {batch} = micro {micro} x gradient_accumulation_steps {gas} x dp {plan.dp}",
        "degrees": {"tp": plan.tp, "dp": plan.dp, "pp": plan.pp},
        "pipeline": {
            "num_stages": plan.pp,
            "parts": parts,
            "stages": stage_layers(instance, plan),
            "topology": (f"PipeModelDataParallelTopology(num_pp={plan.pp}, num_mp={plan.tp}, num_dp={plan.dp})"
                         if plan.tp > 1 else f"PipeDataParallelTopology(num_pp={plan.pp}, num_dp={plan.dp})"),
            "how": (
                "PipelineModule's partition_method accepts 'parameters' (default), 'uniform' and 'type:REGEX', "
                "none of which takes explicit boundaries. To use these, subclass PipelineModule and override "
                "_partition_layers to set self.parts = parts and call "
                "self._set_bounds(start=self.parts[stage_id], stop=self.parts[stage_id + 1]) with "
                "stage_id = self._topo.get_coord(self.global_rank).pipe. parts index the PipelineModule's layer "
                "list, which must match the instance's layer list one to one (stage i runs parts[i]..parts[i+1]-1)."
            ),
        },
        "launch": launch_layout(instance, plan),
    }


# ---------------------------------------------------------------------------
# Megatron-LM


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
            notes.append("--pipeline-model-parallel-layout is marked experimental in Megatron-LM "
                         "(megatron/core/transformer/pipeline_parallel_layer_layout.py); it needs a recent Megatron-Core")
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


EXPORTERS = {"deepspeed": export_deepspeed, "megatron": export_megatron}


# ---------------------------------------------------------------------------
# Command


def load_single_plan(path: str) -> Plan:
    """Read a PLAN file holding exactly one plan object."""
    from .instance import load_json
    from .plan import parse_plan

    data = load_json(path, "plan")
    if isinstance(data, list):
        raise InputError("plan", "export takes one plan object, got a list")
    return parse_plan(data)


def add_parser(subparsers) -> None:
    from .cost import COST_MODELS

    p = subparsers.add_parser("export", help="write a DeepSpeed config or Megatron-LM arguments for a plan")
    p.add_argument("instance", help="instance JSON file")
    p.add_argument("plan", help="JSON file with one plan object")
    p.add_argument("--format", choices=FORMATS, required=True, help="deepspeed or megatron")
    p.add_argument("-o", "--output", default=None, help="write the JSON here instead of stdout")
    p.add_argument("--cost-model", choices=COST_MODELS, default="hetero",
                   help="cost model whose verdict is attached (predicted time, feasibility)")
    p.set_defaults(run=run_export)


def run_export(args) -> int:
    import sys

    from .cost import evaluate
    from .instance import load_instance

    instance = load_instance(args.instance)
    plan = check_plan(instance, load_single_plan(args.plan))
    out = EXPORTERS[args.format](instance, plan)
    ev = evaluate(instance, plan, args.cost_model)
    out["evaluation"] = {"cost_model": ev.cost_model, "predicted_time": ev.predicted_time, "feasible": ev.feasible,
                         "violations": list(ev.violations)}
    if not ev.feasible:
        print("amp-opt: warning: the plan does not fit in memory: " + "; ".join(ev.violations), file=sys.stderr)
    from .cli import write_text

    write_text(json.dumps(out, indent=2) + "\n", args.output)
    return 0
