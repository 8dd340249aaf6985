"""Plans of several pipelines (``docs/hetero-plans.md``, "Several pipelines"; ``formulations/hetero.md`` U6).

Each pipeline is a plan of its own (its depth, partition, per-stage tp and dp, shares and
devices) that runs ``micro_batches`` micro-batches of its own pipeline micro-batch per
iteration; the pipelines' samples add up to the global batch, and every layer's gradients are
reduced over every replica of every pipeline that holds the layer.  These functions read and
check the form; the single-pipeline reader and checker are passed in (``parse_one``,
``check_one``), so this module does not import the plan record's (:mod:`.plan` imports it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from ..errors import InputError
from .engines import engine_of
from .fields import whole_number

PIPELINES_KEYS = ("pipelines",)
PIPELINE_KEYS = ("micro_batches",)  # besides a plan's own fields


@dataclass(frozen=True)
class Pipelines:
    """Several pipelines joined by the gradient reduction: ``pipelines[i]`` is a plan that runs
    ``micro_batches[i]`` micro-batches per iteration.  ``stages`` of each plan name global device ids."""

    pipelines: tuple  # tuple[Plan, ...]
    micro_batches: tuple[int, ...]

    uniform = False  # never one plan of today's form (at least two pipelines)
    virtual_stages = 1  # U6 prices pipelines without interleaving

    def samples(self, i: int) -> int:
        """Samples pipeline i processes per iteration: its micro-batches times its pipeline micro-batch."""
        return self.micro_batches[i] * self.pipelines[i].pipeline_micro_batch

    @property
    def devices(self) -> int:
        return sum(p.devices for p in self.pipelines)

    def to_json(self) -> dict[str, Any]:
        return {"pipelines": [{**p.to_json(), "micro_batches": n} for p, n in zip(self.pipelines, self.micro_batches)]}


def parse_pipelines(data: Mapping, where: str, parse_one: Callable) -> Pipelines:
    """Read ``{"pipelines": [plan + "micro_batches", ...]}`` (at least two), each plan by ``parse_one``."""
    unknown = sorted(set(data) - set(PIPELINES_KEYS))
    if unknown:
        raise InputError(f"{where}.{unknown[0]}", "a plan of several pipelines has the one field \"pipelines\"; "
                                                  "give every setting inside each pipeline")
    items = data["pipelines"]
    if not isinstance(items, Sequence) or isinstance(items, str) or len(items) < 2:
        raise InputError(f"{where}.pipelines", "must be a list of at least two pipelines (write one pipeline as a "
                                               "plain plan)")
    plans, counts = [], []
    for i, item in enumerate(items):
        at = f"{where}.pipelines[{i}]"
        if not isinstance(item, Mapping):
            raise InputError(at, f"must be a JSON object (a plan with \"micro_batches\"), got {type(item).__name__}")
        if "pipelines" in item:
            raise InputError(f"{at}.pipelines", "pipelines do not nest")
        if item.get("micro_batches") is None:
            raise InputError(f"{at}.micro_batches", "is required: the micro-batches this pipeline runs per iteration")
        counts.append(whole_number(item["micro_batches"], f"{at}.micro_batches"))
        plans.append(parse_one({k: v for k, v in item.items() if k not in PIPELINE_KEYS}, where=at))
    return Pipelines(tuple(plans), tuple(counts))


def pipeline_instance(instance, plan: Pipelines, i: int):
    """The instance pipeline i sees on its own: the cluster and model, with the global batch its
    samples (what its micro-batch count, memory in flight and schedule read)."""
    return dataclasses.replace(instance, training=dataclasses.replace(instance.training,
                                                                      global_batch=plan.samples(i)))


def check_pipelines(instance, plan: Pipelines, where: str, check_one: Callable, rank_order: Callable) -> Pipelines:
    """Validate a plan of several pipelines against an instance; return it with every pipeline
    checked (explicit ``stages``: a pipeline without them takes the next devices in order)."""
    engine = engine_of(instance)
    if not engine.uneven:
        raise InputError(f"{where}.pipelines", f"{engine.name} runs one pipeline configuration: search.engine "
                                               "\"amp_opt\" allows several pipelines")
    batch = instance.training.global_batch
    total = sum(plan.samples(i) for i in range(len(plan.pipelines)))
    if total != batch:
        parts = " + ".join(f"{n}*{p.pipeline_micro_batch}" for p, n in zip(plan.pipelines, plan.micro_batches))
        raise InputError(f"{where}.pipelines", f"the pipelines process {parts} = {total} samples per iteration "
                                               f"(micro_batches * pipeline micro-batch), the global batch is {batch}")
    checked, first, seen = [], 0, {}
    for i, p in enumerate(plan.pipelines):
        at = f"{where}.pipelines[{i}]"
        zero = instance.training.zero_stage if p.zero_stage is None else p.zero_stage
        for field, bad in (("cp", p.cp > 1), ("virtual_stages", p.virtual_stages > 1), ("zero_stage", zero > 0)):
            if bad:
                raise InputError(f"{at}.{field}", "several pipelines are priced with cp 1, virtual_stages 1 and "
                                                  "zero_stage 0 (a plain allreduce across the pipelines)")
        if p.stages is None:
            p = dataclasses.replace(p, stages=tuple(tuple(tuple(first + d for d in g) for g in stage)
                                                    for stage in rank_order(p.tp, p.dp, p.pp, p.cp)))
        p = check_one(pipeline_instance(instance, plan, i), p, where=at)
        for s, stage in enumerate(p.stages):
            for group in stage:
                for d in group:
                    if d in seen:
                        raise InputError(f"{at}.stages[{s}]", f"device {d} is used by pipeline {seen[d]} too")
                    seen[d] = i
        first = max(first, 1 + max(seen))
        checked.append(p)
    return Pipelines(tuple(checked), plan.micro_batches)
