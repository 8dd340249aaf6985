"""A DeepSpeed ``PipelineModule`` with exactly the stage boundaries of an amp_opt plan.

DeepSpeed's ``partition_method`` ('parameters', 'uniform', 'type:REGEX') cannot express
explicit boundaries; the only way is a subclass whose ``_partition_layers`` sets them.
This helper is that subclass, so that users need not write it::

    from amp_opt.export.pipeline import exact_pipeline_module
    model = exact_pipeline_module(layers, "ds_config.json", loss_fn=loss_fn)   # or parts=[0, 8, 13, 20, 30]
    engine, *_ = deepspeed.initialize(model=model, config="ds_config.json", ...)

``layers`` is the ``PipelineModule`` layer list (modules or ``LayerSpec``), one entry per
layer of the instance; ``ds_config.json`` is the file written by ``amp_opt export
--format deepspeed`` (its ``amp_opt.pipeline.parts``); keyword arguments go to
``PipelineModule`` (``num_stages`` is taken from the boundaries unless ``topology`` is
given).  Each stage's ``activation_checkpoint_interval`` follows the export's
``amp_opt.pipeline.recompute`` (1 on a stage that recomputes: every layer keeps only its
input, eq. H7; 0 elsewhere), unless the caller passes one.  DeepSpeed is imported only
when this is called.  The override follows
DeepSpeed's own ``_partition_layers`` (``deepspeed/runtime/pipe/module.py``): it reads
the stage of this rank from ``self._topo.get_coord(self.global_rank).pipe``, sets
``self.parts`` and calls ``self._set_bounds``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence


def stage_boundaries(source: str | Path | dict[str, Any] | Sequence[int]) -> list[int]:
    """The pp+1 boundaries from an exported DeepSpeed file (path or dict) or a list of ints."""
    if isinstance(source, (str, Path)):
        source = json.loads(Path(source).read_text())
    if isinstance(source, dict):
        try:
            source = source["amp_opt"]["pipeline"]["parts"]
        except (KeyError, TypeError):
            raise ValueError("not an amp_opt DeepSpeed export: no amp_opt.pipeline.parts") from None
    parts = [int(p) for p in source]
    if len(parts) < 2 or parts[0] != 0 or any(b <= a for a, b in zip(parts, parts[1:])):
        raise ValueError(f"stage boundaries must start at 0 and increase, got {parts}")
    return parts


def stage_recompute(source) -> list[str] | None:
    """Per stage, the recomputation mode of an exported DeepSpeed file (path or dict); None if
    it does not say."""
    if isinstance(source, (str, Path)):
        source = json.loads(Path(source).read_text())
    if not isinstance(source, dict):
        return None
    modes = source.get("amp_opt", {}).get("pipeline", {}).get("recompute")
    return None if modes is None else [str(m) for m in modes]


def exact_pipeline_module(layers, source, **kwargs):
    """A ``deepspeed.pipe.PipelineModule`` over ``layers`` whose stage i runs layers
    ``parts[i] .. parts[i+1]-1``, ``parts`` from :func:`stage_boundaries` of ``source``, and
    recomputes as the export says (``stage_recompute``) unless ``activation_checkpoint_interval``
    is given."""
    from deepspeed.pipe import PipelineModule  # needs DeepSpeed (and PyTorch)

    parts = stage_boundaries(source)
    modes = None if "activation_checkpoint_interval" in kwargs else stage_recompute(source)
    if parts[-1] != len(layers):
        raise ValueError(f"the boundaries cover {parts[-1]} layers, the layer list has {len(layers)}")

    class ExactPipelineModule(PipelineModule):
        """PipelineModule with the stage boundaries of an amp_opt plan."""

        def _partition_layers(self, method="uniform"):
            stages = self._topo.get_dim("pipe")
            if stages != len(parts) - 1:
                raise ValueError(f"the topology has {stages} pipeline stages, the plan {len(parts) - 1}")
            stage_id = self._topo.get_coord(self.global_rank).pipe
            self.parts = list(parts)
            self._set_bounds(start=self.parts[stage_id], stop=self.parts[stage_id + 1])
            if modes is not None:  # read at every forward (PipelineModule.forward)
                self.activation_checkpoint_interval = 1 if modes[stage_id] != "none" else 0

    if "topology" not in kwargs:
        kwargs.setdefault("num_stages", len(parts) - 1)
    return ExactPipelineModule(layers=layers, **kwargs)
