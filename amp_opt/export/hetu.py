"""The Hetu export: a heterogeneous strategy of several pipelines (Hetu's Malleus and HexiScale work).

Hetu (github.com/PKU-DAIR/Hetu) trains one model over pipelines that each have their own stages,
layer split and tensor-parallel degree per stage, and their own micro-batch count.  Its strategy
(the ``ds_parallel`` block of its YAML config, ``StrategyConfig`` in
python/hetu/utils/parallel/ds_config.py, turned into the parallel annotations by
``generate_*_hetero_4d_config.py``) holds ``dp`` (pipelines), ``cp_list``, ``tp`` (the largest
tensor-parallel degree of any stage), ``hetero_layers`` (per pipeline, transformer layers per
stage), ``micro_batch_num_list`` (per pipeline), ``rank_to_device_mapping`` and ``unused_rank``.
Ranks: every stage of every pipeline owns ``tp`` virtual ranks, pipeline by pipeline and stage by
stage ((stages before it + s) * tp + j); a stage of tensor-parallel degree t < tp lists its last
tp - t ranks in ``unused_rank``, and every virtual rank maps to a distinct launched device (the
unused ones to devices the plan leaves idle, which skip training).  One ``micro_batch_size``
serves every pipeline, and pipeline i processes ``micro_batch_size * micro_batch_num_list[i]``
samples of each step's ``global_load_size``.

A plan becomes Hetu's when every stage of a pipeline is one tensor-parallel group: a plan of
several pipelines whose stages have dp 1, or one pipeline with one dp and equal shares (its
replica r is pipeline r).  Refused, each in one line naming the field: a stage of several
replicas within a pipeline of several, pipelines of different micro-batch sizes, uneven shares
within a stage, a stage without a transformer layer, context parallelism, interleaving, ZeRO
(Hetu's ``zero`` shards gradients and a copy of the parameters as well as the optimizer states),
selective recomputation or the block method, and more virtual ranks than the cluster has devices.
A stage that recomputes in full lists its transformer layers in ``recompute_layer_idxs_list``
(per pipeline, global layer ids; Hetu recomputes a listed layer whole).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..errors import InputError
from ..model.plan import Pipelines, Plan, check_plan
from ..model.plan_pipelines import pipeline_instance
from .flagscale import to_yaml
from .megatron import transformer_split

SOURCE = "python/hetu/utils/parallel/ds_config.py (StrategyConfig), python/hetu/engine/trainer.py"


def _as_pipelines(instance, plan) -> list[tuple[Any, Plan, int, str]]:
    """Per Hetu pipeline: (the instance it sees, its one-replica-per-stage plan, its micro-batches,
    the field a refusal names) of a checked plan."""
    if isinstance(plan, Pipelines):
        out = []
        for i, p in enumerate(plan.pipelines):
            at = f"plan.pipelines[{i}]"
            if any(p.dp_at(s) > 1 for s in range(p.pp)):
                raise InputError(f"{at}.dp", "Hetu runs one tensor-parallel group per stage of a pipeline: write "
                                             "each data-parallel replica as a pipeline of its own")
            out.append((pipeline_instance(instance, plan, i), p, plan.micro_batches[i], at))
        sizes = {p.pipeline_micro_batch for _, p, _, _ in out}
        if len(sizes) > 1:
            raise InputError("plan.pipelines", f"Hetu runs one micro-batch size in every pipeline, got "
                                               f"{sorted(sizes)}")
        return out
    dps = {plan.dp_at(s) for s in range(plan.pp)}
    shares = {b for s in range(plan.pp) for b in plan.shares_at(s)}
    if len(dps) > 1 or len(shares) > 1:
        raise InputError("plan.shares" if len(dps) == 1 else "plan.dp",
                         "Hetu's pipelines take equal micro-batches: a plan of one pipeline needs one dp and "
                         "equal shares (write uneven replicas as pipelines of their own)")
    n = instance.training.global_batch // plan.pipeline_micro_batch
    return [(instance, _replica(plan, r), n, "plan") for r in range(plan.dp_at(0))]


def _replica(plan: Plan, r: int) -> Plan:
    """Replica r of a plan whose stages all have the same dp and share: a pipeline of one group per stage."""
    return replace(plan, dp=1, shares=None, micro_batch=plan.shares_at(0)[r],
                   stages=tuple((stage[r],) for stage in plan.stages))


def _refuse(plan) -> None:
    """What the export does not map onto Hetu's strategy, named by field."""
    pipes = plan.pipelines if isinstance(plan, Pipelines) else (plan,)
    for i, p in enumerate(pipes):
        at = f"plan.pipelines[{i}]" if isinstance(plan, Pipelines) else "plan"
        modes = {p.recompute} if isinstance(p.recompute, str) else set(p.recompute)
        for field, bad in (("cp", p.cp > 1), ("virtual_stages", p.virtual_stages > 1),
                           ("zero_stage", (p.zero_stage or 0) > 0), ("recompute", "selective" in modes),
                           ("recompute_layers", bool(p.recompute_layers))):
            if bad:
                raise InputError(f"{at}.{field}", "the Hetu export writes plans with cp 1, virtual_stages 1, "
                                                  "zero_stage 0 and recomputation none or full per stage (Hetu's "
                                                  "zero shards gradients and parameters too, which amp_opt does "
                                                  "not price as such)")


def _recompute(pipes, layers) -> dict[str, Any]:
    """Hetu's ``recompute`` block: per pipeline the global ids of the transformer layers whose stage
    recomputes in full (``recompute_layer_idxs_list``; Hetu recomputes a listed layer whole), or
    every key null when no stage recomputes."""
    ids, any_full = [], False
    for (_, p, _, _), counts in zip(pipes, layers):
        start, mine = 0, []
        for s, count in enumerate(counts):
            if p.recompute_of(s) == "full":
                mine += list(range(start, start + count))
            start += count
        any_full = any_full or bool(mine)
        ids.append(mine)
    if not any_full:
        return {"recompute_granularity": None, "recompute_method": None, "recompute_num_layers": None,
                "recompute_layer_idxs_list": None}
    return {"recompute_granularity": "full", "recompute_method": None, "recompute_num_layers": None,
            "recompute_layer_idxs_list": ids}


def _any_sp(plan) -> bool:
    return any(p.sequence_parallel for p in (plan.pipelines if isinstance(plan, Pipelines) else (plan,)))


def export_hetu(instance, plan) -> dict[str, Any]:
    """Hetu's ``ds_parallel`` strategy and batch settings for a plan, with the launch order of devices.

    Examples
    --------
    >>> out = export_hetu(instance, plan)  # doctest: +SKIP
    >>> out["config"]["ds_parallel"]["hetero_layers"]  # doctest: +SKIP
    [[2, 2], [4]]
    """
    plan = check_plan(instance, plan)
    _refuse(plan)
    pipes = _as_pipelines(instance, plan)
    layers, stages = [], []
    for sub, p, _, at in pipes:
        counts, problems, _ = transformer_split(sub, p)
        if problems or 0 in counts:
            why = problems[0] if problems else f"stage {counts.index(0)} holds no transformer layer"
            raise InputError(f"{at}.partition", f"{why}; Hetu places the embedding with the first transformer layer "
                                                "and the head with the last")
        layers.append(counts)
        stages += [group for stage in p.stages for group in stage]
    tp = max(len(group) for group in stages)
    slots = len(stages) * tp
    used = sorted(d for group in stages for d in group)
    taken = set(used)
    idle = [d for d in range(instance.num_devices) if d not in taken]
    if slots > instance.num_devices:
        raise InputError("plan.tp", f"Hetu gives each of the {len(stages)} stages {tp} virtual ranks (the largest tp), "
                                    f"each on a device of its own: {slots} devices, the cluster has "
                                    f"{instance.num_devices}")
    launch = sorted(used + idle[:slots - len(used)])  # the launched devices, in the order of their process ranks
    index = {d: k for k, d in enumerate(launch)}
    spare = iter(idle[:slots - len(used)])
    mapping, unused = {}, []
    for g, group in enumerate(stages):
        for j in range(tp):
            rank = g * tp + j
            if j < len(group):
                mapping[rank] = index[group[j]]
            else:
                mapping[rank] = index[next(spare)]
                unused.append(rank)
    n_micro = [n for _, _, n, _ in pipes]
    seq = instance.training.tokens_per_sample
    mbs = pipes[0][1].pipeline_micro_batch
    nodes = instance.nodes
    config = {"ds_parallel": {"hetero": True, "dp": len(pipes), "cp": 1, "cp_list": [1] * len(pipes), "tp": tp,
                              "pp": max(len(c) for c in layers), "zero": False, "num_gpus": slots,
                              "num_layers": sum(layers[0]), "gpus_per_stage": tp, "hetero_layers": layers,
                              "micro_batch_num_list": n_micro, "seq_len_list": None if seq is None else
                              [seq] * len(pipes), "rank_to_device_mapping": mapping, "unused_rank": unused,
                              "recompute": _recompute(pipes, layers)},
              "trainer": {"micro_batch_size": mbs, "global_load_size": instance.training.global_batch,
                          "packing": False, **({} if seq is None else {"max_seq_length": seq})},
              "model": {"num_hidden_layers": sum(layers[0])}}
    return {
        "format": "amp_opt.export.hetu",
        "source": SOURCE,
        "config": config,
        "yaml": to_yaml(config),
        "pipelines": [{"pipeline": i, "micro_batches": n, "samples": n * mbs, "layers_per_stage": c,
                       "devices": [list(group) for stage in p.stages for group in stage]}
                      for i, ((_, p, n, _), c) in enumerate(zip(pipes, layers))],
        "launch": {"world_size": slots, "ranks": [
            {"rank": k, "device": d, "node": nodes[instance.device_node[d]].name,
             "local_device": d - instance.node_first_device[instance.device_node[d]],
             "device_type": nodes[instance.device_node[d]].device_type, "idle": d not in taken}
            for k, d in enumerate(launch)]},
        "notes": ["devices marked idle run Hetu's unused virtual ranks, which skip training; launch the "
                  "processes in the order of launch.ranks (rank_to_device_mapping maps to these ranks)",
                  "the rest of Hetu's config (rpc hosts, the model's sizes, tokenizer, optimizer, data) is the run's "
                  "own; Hetu's Llama runs its tensor-parallel layers with sequence parallelism always on, its "
                  "GPT without (amp_opt priced the plan with sequence_parallel "
                  f"{'on' if _any_sp(plan) else 'off'})"],
    }
