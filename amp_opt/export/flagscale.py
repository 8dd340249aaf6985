"""The FlagScale export: a heterogeneous-training config (process meshes, layer split, device types).

FlagScale (github.com/FlagOpen/FlagScale) trains one model over process meshes of their own
degrees and device types.  Its ``train.system.hetero`` section (``flagscale/train/arguments.py``,
``FSTrainArguments.pre_validate_args``, which checks it) holds ``hetero_process_meshes``
(tp, cp, ep, dp, pp of each mesh, flattened), ``hetero_pipeline_layer_split`` (transformer layers
per pipeline stage) and ``hetero_device_types`` (one per mesh).  A mesh is a run of consecutive
stages with one tp, one dp and one device type; FlagScale's micro-batch is M = dp_0 *
``micro_batch_size``, and mesh i's replicas each take M / dp_i samples of it.  Ranks: FlagScale's
``RankMapper`` (``flagscale/train/hetero/parallel_context.py``) sorts the processes by the index
of their device type in ``hetero_device_types``, then by rank; mesh by mesh, the logical ranks
follow Megatron's order tp-cp-ep-dp-pp from the mesh's offset.

A plan FlagScale cannot express is refused with one line naming the field: uneven shares inside
a stage, replicas of one stage on different device types, a device type whose meshes are not
consecutive, interleaving, ZeRO-2/3, different tp at the two ends of a tied word embedding (and
with ZeRO-1, dp at the two ends of which neither divides the other).

A recomputation mode per stage becomes FlagScale's ``recompute_granularity_per_stage_micro_batch``
(``post_validate_args`` in flagscale/train/arguments.py parses it; the patched Megatron
``TransformerBlock.forward`` reads it): per stage ``[1, n, flag]``, n the micro-batches of an
iteration and flag 1 where the stage recomputes in full, 0 where it does not, beside full,
uniform recomputation of one layer at a time (amp_opt's "full", H7).  A stage's flag is the same
for every micro-batch: FlagScale's block clears the stage's recomputation on a 0 and does not
set it back, so flags that change within a stage would not run as written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from ..model.plan import Plan, check_plan, one_pipeline
from .megatron import decision_args, transformer_split

SOURCE = "flagscale/train/arguments.py (FSTrainArguments.pre_validate_args)"


@dataclass(frozen=True)
class Mesh:
    """One FlagScale process mesh: consecutive stages [first, last] with one tp, dp and device type."""

    first: int
    last: int
    tp: int
    cp: int
    dp: int
    device_type: str

    @property
    def pp(self) -> int:
        return self.last - self.first + 1

    @property
    def size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    def flat(self) -> list[int]:
        """The mesh's five entries of ``hetero_process_meshes``: tp, cp, ep (1), dp, pp."""
        return [self.tp, self.cp, 1, self.dp, self.pp]


def _stage_type(instance, plan: Plan, s: int) -> str:
    types = sorted({instance.nodes[int(instance.device_node[d])].device_type
                    for group in plan.stages[s] for d in group})
    if len(types) > 1:
        raise InputError(f"plan.stages[{s}]", f"replicas on device types {', '.join(types)}: FlagScale gives each "
                                              "process mesh one device type (hetero_device_types, one per mesh)")
    return types[0]


def meshes(instance, plan: Plan) -> list[Mesh]:
    """The process meshes of a checked plan: consecutive stages with one tp, dp and device type."""
    out: list[Mesh] = []
    for s in range(plan.pp):
        key = (plan.tp_at(s), plan.cp, plan.dp_at(s), _stage_type(instance, plan, s))
        if out and (out[-1].tp, out[-1].cp, out[-1].dp, out[-1].device_type) == key:
            out[-1] = Mesh(out[-1].first, s, *key)
        else:
            out.append(Mesh(s, s, *key))
    seen: list[str] = []
    for m in out:
        if m.device_type in seen and seen[-1] != m.device_type:
            raise InputError("plan.stages", f"stages on {m.device_type} come before and after stages on {seen[-1]}: "
                                            "FlagScale orders ranks by device type (RankMapper, flagscale/train/"
                                            "hetero/parallel_context.py), so each type's stages must be consecutive")
        seen.append(m.device_type)
    return out


def _refuse(instance, plan: Plan) -> None:
    """One-line errors for what FlagScale's heterogeneous training cannot express."""
    for s in range(plan.pp):
        shares = plan.shares_at(s)
        if len(set(shares)) > 1:
            raise InputError(f"plan.shares[{s}]", f"{list(shares)}: FlagScale splits every micro-batch evenly over "
                                                  "a mesh's data-parallel replicas (micro_batch_size = dp_0 * "
                                                  f"micro_batch_size // dp_i in {SOURCE})")
    if plan.virtual_stages > 1:
        raise InputError("plan.virtual_stages", f"FlagScale's heterogeneous training runs no interleaved schedule "
                                                f"('virtual pipeline not support now' in {SOURCE})")
    if plan.zero_stage and plan.zero_stage >= 2:
        raise InputError("plan.zero_stage", f"ZeRO-{plan.zero_stage} is not exported to FlagScale's heterogeneous "
                                            "meshes (Megatron-FSDP); use 0 or 1 (the distributed optimizer)")
    first, last = plan.dp_at(0), plan.dp_at(plan.pp - 1)
    if _tied(instance) and plan.tp_at(0) != plan.tp_at(plan.pp - 1):
        raise InputError("plan.tp", f"stage 0 at tp {plan.tp_at(0)}, the last at tp {plan.tp_at(plan.pp - 1)}: "
                                    "FlagScale needs one tp at both ends of a tied word embedding (" + SOURCE + ")")
    if _tied(instance) and plan.zero_stage == 1 and first % last and last % first:
        raise InputError("plan.dp", f"stage 0 at dp {first}, the last at dp {last}: with a tied word embedding and "
                                    "the distributed optimizer FlagScale needs one to divide the other (" + SOURCE + ")")


def _tied(instance) -> bool:
    ties = [layer.tie for layer in instance.layers if layer.tie]
    return len(ties) != len(set(ties))


def _system_flags(flags: list[str]) -> dict[str, Any]:
    """Megatron-style flags as the keys of FlagScale's ``train.system`` (``--a-b v`` -> ``a_b: v``)."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(flags):
        key = flags[i][2:].replace("-", "_")
        if i + 1 < len(flags) and not flags[i + 1].startswith("--"):
            value = flags[i + 1]
            out[key] = int(value) if value.isdigit() else value
            i += 2
        else:
            out[key] = True
            i += 1
    return out


def _per_stage_recompute(instance, plan: Plan) -> dict[str, Any]:
    """``train.system`` keys for a mode per stage: full, uniform recomputation of one layer at a
    time, switched on or off per stage for all of the iteration's micro-batches."""
    n_micro = instance.training.global_batch // plan.pipeline_micro_batch
    return {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1,
            "recompute_granularity_per_stage_micro_batch": [[1, n_micro, int(plan.recompute_of(s) == "full")]
                                                            for s in range(plan.pp)]}


def export_flagscale(instance, plan: Plan) -> dict[str, Any]:
    """FlagScale's heterogeneous-training config for a plan, with the meshes, ranks and hostfile.

    Examples
    --------
    >>> out = export_flagscale(instance, plan)  # doctest: +SKIP
    >>> out["config"]["system"]["hetero"]["hetero_process_meshes"]  # doctest: +SKIP
    [1, 1, 1, 2, 1, 2, 1, 1, 1, 1]
    """
    plan = check_plan(instance, one_pipeline(plan, "FlagScale's heterogeneous training"))
    _refuse(instance, plan)
    found = meshes(instance, plan)
    counts, problems, notes = transformer_split(instance, plan)
    if problems:
        raise InputError("plan.partition", problems[0])
    flags, more = decision_args(instance, plan)
    notes += more
    micro = plan.shares_at(0)[0]  # FlagScale's micro_batch_size: mesh 0's samples per replica
    hetero: dict[str, Any] = {
        "enable_hetero": True,
        "hetero_process_meshes": [x for m in found for x in m.flat()],
        "hetero_pipeline_layer_split": counts,
        "hetero_device_types": [m.device_type for m in found],
        "hetero_current_device_type": found[0].device_type,
        "standalone_embedding_stage": False,
    }
    system: dict[str, Any] = {"tensor_model_parallel_size": found[0].tp, "pipeline_model_parallel_size": plan.pp,
                              **_system_flags(flags)}
    if not isinstance(plan.recompute, str):
        system.update(_per_stage_recompute(instance, plan))
        notes.append("recomputation per stage: stages " + ", ".join(str(s) for s in range(plan.pp)
                                                                    if plan.recompute_of(s) == "full")
                     + " recompute every transformer layer (recompute_granularity_per_stage_micro_batch), the "
                       "others keep their activations")
    if plan.zero_stage == 1 and _tied(instance) and found[0].dp != found[-1].dp:
        hetero["use_partial_reduce_for_shared_embedding"] = True  # FlagScale asserts it in this case
    system["hetero"] = hetero
    config = {"system": system, "model": {"num_layers": sum(counts), "micro_batch_size": micro,
                                          "global_batch_size": instance.training.global_batch}}
    notes.append("hetero_current_device_type is set per node by FlagScale's runner from the hostfile's type=")
    return {
        "format": "amp_opt.export.flagscale",
        "config": config,
        "yaml": to_yaml(config),
        "meshes": [{"mesh": i, "stages": [m.first, m.last], "tp": m.tp, "cp": m.cp, "ep": 1, "dp": m.dp,
                    "pp": m.pp, "device_type": m.device_type, "micro_batch_per_replica": plan.shares_at(m.first)[0]}
                   for i, m in enumerate(found)],
        "launch": launch(instance, plan, found),
        "notes": notes,
    }


def logical_ranks(plan: Plan, found: list[Mesh]) -> list[dict[str, Any]]:
    """FlagScale's logical ranks, mesh by mesh in tp-cp-ep-dp-pp order, each with its plan device."""
    out, offset = [], 0
    for i, m in enumerate(found):
        for k in range(m.size):
            tp_rank, rest = k % m.tp, k // m.tp
            cp_rank, rest = rest % m.cp, rest // m.cp
            dp_rank, stage = rest % m.dp, m.first + rest // m.dp
            out.append({"rank": offset + k, "mesh": i, "stage": stage, "dp_rank": dp_rank, "cp_rank": cp_rank,
                        "tp_rank": tp_rank, "device": plan.stages[stage][cp_rank + m.cp * dp_rank][tp_rank]})
        offset += m.size
    return out


def launch(instance, plan: Plan, found: list[Mesh]) -> dict[str, Any]:
    """The hostfile (``host slots=N type=T``) and per-node device order that give each logical rank
    its plan device under FlagScale's RankMapper, when torchrun's node blocks can."""
    ranks = logical_ranks(plan, found)
    nodes: list[int] = []
    visible: dict[int, list[int]] = {}
    ok, prev = True, None
    for r in ranks:
        node = int(instance.device_node[r["device"]])
        if node not in visible:
            nodes.append(node)
            visible[node] = []
        elif node != prev:
            ok = False  # the node's ranks are split by another node's: no torchrun node block gives them
        prev = node
        visible[node].append(r["device"] - instance.node_first_device[node])
        r.update(hostname=instance.nodes[node].name)
    return {
        "world_size": len(ranks),
        "torchrun_compatible": ok,
        "hostfile": "".join(f"{instance.nodes[j].name} slots={len(visible[j])} type={_type(instance, j)}\n"
                            for j in nodes),
        "nodes": [{"hostname": instance.nodes[j].name, "device_type": _type(instance, j),
                   "cuda_visible_devices": ",".join(map(str, visible[j]))} for j in nodes],
        "ranks": ranks,
        "how": ("start FlagScale's runner with this hostfile (nodes in this order, CUDA_VISIBLE_DEVICES per node "
                "as listed): RankMapper then gives logical rank k the device in 'ranks'" if ok else
                "a node's devices are not one block of its type's logical ranks: torchrun's node ranks cannot give "
                "every logical rank its plan device; regroup the plan's stages or start the processes explicitly "
                "with RANK = the logical rank"),
    }


def _type(instance, node: int) -> str:
    return instance.nodes[node].device_type


def to_yaml(value: Any, indent: int = 0) -> str:
    """Nested dicts of scalars and lists as YAML (lists in flow style, strings quoted), the form of
    FlagScale's ``conf/train/*.yaml``."""
    lines = []
    for key, item in value.items():
        if isinstance(item, dict):
            lines.append(" " * indent + f"{key}:")
            lines.append(to_yaml(item, indent + 2).rstrip("\n"))
        else:
            lines.append(" " * indent + f"{key}: {json.dumps(item)}")
    return "\n".join(lines) + "\n"
