"""The DeepSpeed export: a DeepSpeed config file, with the pipeline split and launch mapping inside.

The file is a DeepSpeed config as it is: ``deepspeed --deepspeed_config FILE`` and
``DeepSpeedConfig(FILE)`` take it directly.  DeepSpeed reads the keys it knows
(``deepspeed/runtime/config.py`` reads each with ``get_scalar_param`` and the like) and
rejects none it does not, so amp_opt's part sits beside them under one key, ``amp_opt``:
the degrees, the stage boundaries (``amp_opt.pipeline.parts``), the topology and the
launch mapping.  :func:`amp_opt.export.pipeline.exact_pipeline_module` builds a
``PipelineModule`` whose stages have exactly those boundaries from this file.
"""

from __future__ import annotations

from typing import Any

from ..model.engines import ENGINES
from ..model.plan import Plan, check_plan
from .ranks import batch_sizes, launch_layout, require_uniform, stage_layers

SECTION = "amp_opt"  # the one key of the exported file that is not DeepSpeed's


def export_deepspeed(instance, plan: Plan) -> dict[str, Any]:
    """A DeepSpeed config whose ``amp_opt`` key holds the pipeline layout and the launch mapping.
    A plan DeepSpeed cannot run (e.g. context parallelism) is an InputError."""
    plan = check_plan(instance, plan)
    require_uniform(plan, "DeepSpeed")
    ENGINES["deepspeed"].check(instance, plan)
    batch, micro, gas = batch_sizes(instance, plan)
    config: dict[str, Any] = {
        "train_batch_size": batch,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": gas,
    }
    if plan.zero_stage:
        config["zero_optimization"] = {"stage": plan.zero_stage}
    parts = list(plan.partition)
    modes = [plan.recompute_of(s) for s in range(plan.pp)]
    config[SECTION] = {
        "format": "amp_opt.export.deepspeed",
        "note": "DeepSpeed ignores this key; the keys above are the DeepSpeed config",
        "check": f"train_batch_size {batch} = micro {micro} x gradient_accumulation_steps {gas} x dp {plan.dp}",
        "degrees": {"tp": plan.tp, "dp": plan.dp, "pp": plan.pp},
        "pipeline": {
            "num_stages": plan.pp,
            "parts": parts,
            "stages": stage_layers(instance, plan),
            "topology": (f"PipeModelDataParallelTopology(num_pp={plan.pp}, num_mp={plan.tp}, num_dp={plan.dp})"
                         if plan.tp > 1 else f"PipeDataParallelTopology(num_pp={plan.pp}, num_dp={plan.dp})"),
            # Per stage: "full" recomputes every layer from its input (activation_checkpoint_interval=1).
            "recompute": modes,
            "how": (
                "PipelineModule's partition_method ('parameters', 'uniform', 'type:REGEX') takes no explicit "
                "boundaries; amp_opt.export.pipeline.exact_pipeline_module(layers, 'THIS_FILE.json', ...) builds a "
                "PipelineModule whose stage i runs layers parts[i]..parts[i+1]-1. The layer list must match the "
                "instance's layer list one to one. It also sets each stage's activation_checkpoint_interval from "
                "'recompute' (1 where the stage recomputes, 0 where it does not)."
            ),
        },
        "launch": launch_layout(instance, plan),
    }
    return config


def deepspeed_config_only(exported: dict[str, Any]) -> dict[str, Any]:
    """The DeepSpeed keys of an export (without ``amp_opt``)."""
    return {k: v for k, v in exported.items() if k != SECTION}
