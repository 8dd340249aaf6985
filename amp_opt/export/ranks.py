"""Ranks and devices: which process runs on which device, and how to launch them.

Megatron-LM and DeepSpeed number the processes of a run as rank = tp_rank +
tp*(cp_rank + cp*(dp_rank + dp*stage)) (Megatron's default order tp-cp-dp-pp; without
context parallelism, tp_rank + tp*dp_rank + tp*dp*stage).  A plan's
``stages[stage][group][tp_rank]``, group = cp_rank + cp*dp_rank, names the device each
rank must own; devices a plan leaves idle get no process; :func:`launch_layout` turns that into per-node torchrun
commands (or explicit per-process environments when torchrun's node ranks cannot
realise the grouping).  Shared by both exports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from ..model.plan import Plan, check_plan, one_pipeline
from ..model.plan_stages import uneven_field


@dataclass(frozen=True)
class Process:
    """One training process: its global rank, coordinates, and the device it must own."""

    rank: int
    stage: int
    dp_rank: int
    tp_rank: int
    cp_rank: int
    device: int  # global device id (node-major)
    node: int  # node index in instance.nodes
    local_device: int  # device index inside its node (the physical CUDA ordinal)


def rank_of(plan: Plan, stage: int, group: int, tp_rank: int) -> int:
    """Megatron/DeepSpeed rank order: tp fastest, then cp, then dp, then pipeline stage
    (``group`` = cp_rank + cp*dp_rank, the index of the tp group in its stage)."""
    return tp_rank + plan.tp * (group + plan.cp * plan.dp * stage)


def processes(instance, plan: Plan) -> tuple[Process, ...]:
    """Every process of a checked plan, by global rank; each used device appears exactly once."""
    plan = check_plan(instance, plan)
    out = []
    for s, stage in enumerate(plan.stages):
        for r, group in enumerate(stage):
            dp_rank, cp_rank = divmod(r, plan.cp)
            for t, device in enumerate(group):
                node = int(instance.device_node[device])
                out.append(Process(rank_of(plan, s, r, t), s, dp_rank, t, cp_rank, device, node,
                                   device - instance.node_first_device[node]))
    out.sort(key=lambda p: p.rank)
    world = plan.tp * plan.cp * plan.dp * plan.pp
    if [p.rank for p in out] != list(range(world)) or len({p.device for p in out}) != world:
        raise InputError("plan.stages", "does not map every rank to its own device")  # check_plan prevents this
    return tuple(out)


def node_rank_blocks(instance, procs) -> list[tuple[int, int]] | None:
    """(node, first rank) per node in torchrun node-rank order, if every node's ranks are one contiguous block."""
    blocks = []
    for j, node in enumerate(instance.nodes):
        ranks = sorted(p.rank for p in procs if p.node == j)
        if not ranks:  # an idle node runs nothing
            continue
        if ranks != list(range(ranks[0], ranks[0] + len(ranks))):
            return None
        blocks.append((j, ranks[0]))
    return sorted(blocks, key=lambda b: b[1])


def launch_layout(instance, plan: Plan, master_port: int = 29500) -> dict[str, Any]:
    """Per-node device/rank table, hostfile, and how to launch the processes (torchrun or explicit env)."""
    procs = processes(instance, plan)
    world = len(procs)
    blocks = node_rank_blocks(instance, procs)
    used = sorted({p.node for p in procs})
    order = [j for j, _ in blocks] if blocks else used
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
                 "device": p.device, "stage": p.stage, "dp_rank": p.dp_rank, "cp_rank": p.cp_rank, "tp_rank": p.tp_rank}
                for i, p in enumerate(mine)
            ]
            entry["launch"] = _explicit_launch(mine, world, visible, master, master_port)
        nodes.append(entry)
    return {
        "world_size": world,
        "rank_formula": ("rank = tp_rank + tp*(cp_rank + cp*(dp_rank + dp*stage)); rank runs on device "
                         "stages[stage][cp_rank + cp*dp_rank][tp_rank]"),
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
        "hostfile": "".join(f"{instance.nodes[j].name} slots={sum(1 for p in procs if p.node == j)}\n" for j in order),
        "nodes": nodes,
        "ranks": [{"rank": p.rank, "stage": p.stage, "dp_rank": p.dp_rank, "cp_rank": p.cp_rank, "tp_rank": p.tp_rank,
                   "device": p.device,
                   "hostname": instance.nodes[p.node].name, "local_device": p.local_device} for p in procs],
        "notes": ["hostnames are the instance's node names: replace them with the real host names"]
                 + ([f"{instance.num_devices - world} of the {instance.num_devices} devices stay idle: no rank runs on "
                      "them (the hostfile and the launch lines list the devices used)"] if world < instance.num_devices
                    else []),
    }


def _explicit_launch(mine, world: int, visible: str, master: str, port: int) -> str:
    """A bash snippet that starts one node's processes with their rank environment."""
    lines = [f"export MASTER_ADDR={master} MASTER_PORT={port} WORLD_SIZE={world} "
             f"LOCAL_WORLD_SIZE={len(mine)} CUDA_VISIBLE_DEVICES={visible}"]
    for i, p in enumerate(mine):
        lines.append(f"RANK={p.rank} LOCAL_RANK={i} python TRAIN_SCRIPT ARGS &")
    lines.append("wait")
    return "\n".join(lines)


def require_uniform(plan: Plan, system: str) -> None:
    """Refuse a plan whose stages or replicas differ for a launcher that runs one tp and dp on every
    stage (InputError naming the field that differs)."""
    one_pipeline(plan, system)
    if not plan.uniform:
        raise InputError(f"plan.{uneven_field(plan)}", f"{system} runs one tp and dp on every stage and equal "
                                                       "shares; export --format flagscale takes plans whose stages "
                                                       "differ")


def batch_sizes(instance, plan: Plan) -> tuple[int, int, int]:
    """(global batch, micro-batch, gradient accumulation steps = global / (dp * micro))."""
    batch = instance.training.global_batch
    return batch, plan.micro_batch, batch // (plan.dp * plan.micro_batch)


def stage_layers(instance, plan: Plan) -> list[dict[str, Any]]:
    """Each stage's layer range; with interleaving, each chunk's (chunk c runs on stage c mod pp)."""
    out = []
    for c, (a, b) in enumerate(zip(plan.partition, plan.partition[1:])):
        entry: dict[str, Any] = {"stage": c % plan.pp}
        if plan.virtual_stages > 1:
            entry["chunk"] = c
        entry.update(layers=[a, b], layer_names=[instance.layers[a].name, instance.layers[b - 1].name])
        out.append(entry)
    return out
