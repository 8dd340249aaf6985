"""The DeepSpeed export: a config, the pipeline layer split and the launch mapping."""

from __future__ import annotations

from typing import Any

from ..model.plan import Plan, check_plan
from .ranks import batch_sizes, launch_layout, stage_layers


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
