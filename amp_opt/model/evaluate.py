"""The one evaluator: the score of a plan under a cost model, term by term.

Every solver's plan, every baseline and every plug-in's plan is re-scored here:
:func:`evaluate` checks the plan against the instance, prices each stage through the
cost model's :class:`~amp_opt.model.costs.StageCosts` and adds the terms with the
model's iteration-time formula (eq. A5 / H6 / H11, or H13 under the 1F1B schedule).  It also reports the price of an
iteration (the devices the plan uses, at their $/hour) and the model-FLOPs
utilisation.  :func:`memory_parts` splits a stage's bytes per device into the parts
of eq. H5, for reports.  A plan whose stages or replicas differ (per-stage tp and dp, uneven
shares) is priced by :class:`~amp_opt.model.costs.stages.UnevenCosts` (eq. U1-U4) and added up
the same way; a uniform plan takes the uniform path.  A plan of several pipelines is priced
pipeline by pipeline on the batch each processes, joined at the end by the gradient reduction
over every pipeline (eq. U6, :mod:`~amp_opt.model.costs.pipelines`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import InputError
from .costs import CostModel, StageCosts, cost_model as get_cost_model
from .costs.hetero import HeteroModel
from .costs.pipelines import stage_ends
from .costs.stages import UnevenCosts
from .costs.terms import stage_order
from .plan import Plan, Pipelines, check_plan, devices_of, parse_plan
from .plan_pipelines import pipeline_instance
from .profiles import worst_source
from .tables import LayerSums, Tables

GIB = 2**30


@dataclass(frozen=True)
class StageReport:
    index: int
    layers: tuple[int, int]  # [start, stop): the stage's layers, or with interleaving the span of its chunks
    groups: tuple[tuple[int, ...], ...]
    device_types: tuple[str, ...]
    nodes: tuple[str, ...]
    compute: float
    p2p: float
    allreduce: float
    memory: float  # bytes per device
    capacity: float  # bytes, the smallest device type in the stage
    fits: bool
    chunks: tuple[tuple[int, int], ...] = ()  # with interleaving: the stage's layer ranges
    recompute: str = "none"
    replica_compute: tuple[float, ...] = ()  # a non-uniform plan: each replica's seconds per micro-batch
    compute_source: str = "measured"  # where its layer times come from: measured, derived or datasheet
    optimizer_step: float = 0.0  # seconds of the optimizer step (H15), the part of ``allreduce`` after the reduction
    pipeline: int | None = None  # a plan of several pipelines: the pipeline the stage belongs to

    def to_json(self, instance) -> dict[str, Any]:
        a, b = self.layers
        out = {
            **({} if self.pipeline is None else {"pipeline": self.pipeline}),
            "stage": self.index,
            "layers": [a, b],
            "layer_names": [instance.layers[a].name, instance.layers[b - 1].name],
            "devices": [list(g) for g in self.groups],
            "device_types": list(self.device_types),
            "nodes": list(self.nodes),
            "compute": self.compute,
            "p2p": self.p2p,
            "allreduce": self.allreduce,
            "memory": self.memory,
            "capacity": self.capacity,
            "fits": self.fits,
            "recompute": self.recompute,
            "compute_source": self.compute_source,
        }
        if len(self.chunks) > 1:
            out["chunks"] = [list(c) for c in self.chunks]
        if self.replica_compute:
            out["replica_compute"] = list(self.replica_compute)
        return out


@dataclass(frozen=True)
class Evaluation:
    """A plan's score under one cost model, with every term that makes it up.

    ``cost`` is the price of one iteration in USD (None when a used device type has no
    price); ``mfu`` the model-FLOPs utilisation, training FLOPs of the global batch over
    time x the used devices' peak FLOP/s (None when FLOPs or peaks are unknown).  For a plan
    of several pipelines, ``n_micro`` lists each pipeline's micro-batches, ``stages`` holds every
    pipeline's stages (each naming its pipeline) and ``pipelines`` each pipeline's own evaluation
    on the samples it processes (its ``allreduce`` column U6's end, its time its own pipeline
    time plus its stages' slowest end).
    """

    plan: Plan | Pipelines
    cost_model: str
    predicted_time: float  # seconds per iteration
    feasible: bool
    breakdown: dict[str, float]
    n_micro: int | tuple[int, ...]
    stages: tuple[StageReport, ...]
    violations: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())
    devices_used: int = 0
    cost: float | None = None  # USD per iteration
    mfu: float | None = None
    pipelines: tuple["Evaluation", ...] = ()

    def to_json(self, instance) -> dict[str, Any]:
        return {
            "plan": self.plan.to_json(),
            "cost_model": self.cost_model,
            "predicted_time": self.predicted_time,
            "feasible": self.feasible,
            "breakdown": dict(self.breakdown),
            "micro_batches_per_iteration": self.n_micro if isinstance(self.n_micro, int) else list(self.n_micro),
            "devices_used": self.devices_used,
            "cost_per_iteration": self.cost,
            "model_flops_utilization": self.mfu,
            "stages": [s.to_json(instance) for s in self.stages],
            "violations": list(self.violations),
            "notes": list(self.notes),
            **({"pipelines": [{"micro_batches": n, "samples": self.plan.samples(i), "predicted_time": p.predicted_time}
                              for i, (n, p) in enumerate(zip(self.n_micro, self.pipelines))]}
               if self.pipelines else {}),
        }


def stage_costs(instance, plan: Plan, model: str | CostModel, tables: Tables | None = None) -> StageCosts | UnevenCosts:
    """The StageCosts of a checked plan (explicit stages); a non-uniform plan's UnevenCosts."""
    model = get_cost_model(model)
    if not plan.uniform:
        return UnevenCosts(model, tables or Tables(instance), plan)
    return model.stage_costs(tables or Tables(instance), plan.candidate, plan.stages,
                             chunks=plan.partition if plan.virtual_stages > 1 else None,
                             modes=None if isinstance(plan.recompute, str) else plan.recompute)


def stage_boundaries(plan: Plan) -> tuple[int, ...]:
    """The stages' layer ranges in stage order (the partition, or with interleaving each stage's
    chunks made contiguous, eq. H11)."""
    return plan.partition if plan.virtual_stages == 1 else stage_order(plan.partition, plan.pp)[1]


def evaluate(instance, plan: Plan, cost_model: str | CostModel = "hetero", *, tables: Tables | None = None) -> Evaluation:
    """Score a plan: predicted seconds per iteration, feasibility and the breakdown.

    Parameters
    ----------
    instance : Instance
    plan : Plan, Pipelines or dict
        Validated against the instance here (missing ``stages`` means rank order); a dict in
        the plan format (``parse_plan``) is parsed first.  Several pipelines are priced by eq. U6.
    cost_model : "hetero" (default), "amp", or a :class:`~amp_opt.model.costs.CostModel`
    tables : Tables, optional
        Derived tables to reuse (a solve passes its own); built afresh when omitted.

    Returns
    -------
    Evaluation

    Examples
    --------
    >>> import amp_opt
    >>> inst = amp_opt.load_instance("instances/amp_het_cluster.json")
    >>> plan = amp_opt.parse_plan({"tp": 1, "dp": 4, "pp": 4, "micro_batch": 1, "partition": [0, 7, 14, 20, 30]})
    >>> round(amp_opt.evaluate(inst, plan, "amp").predicted_time, 4)
    1.0859
    """
    model = get_cost_model(cost_model)
    plan = check_plan(instance, parse_plan(plan) if isinstance(plan, Mapping) else plan)
    if isinstance(plan, Pipelines):
        return _evaluate_pipelines(instance, plan, model, tables or Tables(instance))
    return _evaluate_one(instance, plan, model, stage_costs(instance, plan, model, tables))


def _evaluate_one(instance, plan: Plan, model: CostModel, costs) -> Evaluation:
    """Score one checked pipeline from its stage terms."""
    boundaries = stage_boundaries(plan)
    reports = [_stage_report(instance, plan, costs, s, boundaries[s], boundaries[s + 1]) for s in range(plan.pp)]
    compute, p2p = [r.compute for r in reports], [r.p2p for r in reports]
    total = costs.pipeline.time(compute, p2p, [r.allreduce for r in reports])
    over = [r for r in reports if not r.fits]
    violations = tuple(
        f"stage {r.index} ({', '.join(r.device_types)}) needs {r.memory / GIB:.2f} GiB per device, "
        f"capacity {r.capacity / GIB:.2f} GiB"
        for r in over
    )
    notes = _notes(model, reports, violations)
    devices = devices_of(plan)
    return Evaluation(
        plan=plan,
        cost_model=model.name,
        predicted_time=total,
        feasible=not over if model.enforces_memory else True,
        breakdown=_breakdown(costs.pipeline, reports, plan.virtual_stages),
        n_micro=costs.n_micro,
        stages=tuple(reports),
        violations=violations if model.enforces_memory else (),
        notes=tuple(notes),
        devices_used=len(devices),
        cost=_price(instance, devices, total),
        mfu=_mfu(instance, devices, total),
    )


def _evaluate_pipelines(instance, plan: Pipelines, model: CostModel, tables: Tables) -> Evaluation:
    """Score a checked plan of several pipelines (eq. U6): each pipeline on its own samples, the
    iteration ending with the slowest stage's reduction and step after the slowest pipeline."""
    if not isinstance(model, HeteroModel):
        raise InputError("plan.pipelines", f"the {model.name} cost model prices one pipeline: use --cost-model hetero")
    subs = [pipeline_instance(instance, plan, i) for i in range(len(plan.pipelines))]
    costs = [stage_costs(sub, p, model, tables.with_batch(sub)) for sub, p in zip(subs, plan.pipelines)]
    own = [_evaluate_one(sub, p, model, c) for sub, p, c in zip(subs, plan.pipelines, costs)]
    # a pipeline's time to the end of its last micro-batch: H13 without its end, which U6 replaces
    bodies = [c.pipeline.time([r.compute for r in ev.stages], [r.p2p for r in ev.stages], [0.0])
              for c, ev in zip(costs, own)]
    bounds = [stage_boundaries(p) for p in plan.pipelines]
    windows = [[float(c.overlap_window(s, b[s], b[s + 1])) if c.overlap_share else 0.0 for s in range(p.pp)]
               for c, p, b in zip(costs, plan.pipelines, bounds)]
    finish = stage_ends(instance, tables, plan, bodies, windows, [[r.optimizer_step for r in ev.stages] for ev in own])
    # each stage's end as the one-pipeline reports give it: its seconds after the slowest pipeline's body
    total, slowest = max(max(row) for row in finish), max(range(len(own)), key=bodies.__getitem__)
    ends = [[max(0.0, t - bodies[slowest]) for t in row] for row in finish]
    parts = tuple(replace(ev, stages=tuple(replace(r, allreduce=x, pipeline=i) for r, x in zip(ev.stages, ends[i])),
                          predicted_time=max(finish[i]), breakdown={**ev.breakdown, "allreduce": max(ends[i])})
                  for i, ev in enumerate(own))
    end = max(max(row) for row in ends)
    devices = devices_of(plan)
    return Evaluation(
        plan=plan, cost_model=model.name, predicted_time=total, feasible=all(ev.feasible for ev in own),
        breakdown={**own[slowest].breakdown, "allreduce": end}, n_micro=plan.micro_batches,
        stages=tuple(r for ev in parts for r in ev.stages),
        violations=tuple(f"pipeline {i} {v}" for i, ev in enumerate(own) for v in ev.violations),
        notes=tuple(dict.fromkeys(n for ev in own for n in ev.notes)), devices_used=len(devices),
        cost=_price(instance, devices, total), mfu=_mfu(instance, devices, total), pipelines=parts)


def _breakdown(pipe, reports, v: int) -> dict[str, float]:
    """The iteration time's terms (eq. H13): the weighted bottleneck stage, the stages' sum
    (fill and drain), the p2p transfers and the slowest gradient synchronisation."""
    compute = [r.compute for r in reports]
    return {
        "pipeline_bottleneck": max(w * e for w, e in zip(pipe.bottleneck, compute)),
        "stage_compute": sum(compute) / v,
        "p2p": pipe.p2p * sum(r.p2p for r in reports),
        "allreduce": max(r.allreduce for r in reports),
    }


def _notes(model, reports, violations) -> list[str]:
    """What a reader of the score should know: where compute times came from, and a memory
    overflow the cost model does not enforce."""
    notes = []
    sources = {r.compute_source for r in reports}
    if "datasheet" in sources:
        notes.append("some compute times were estimated from FLOPs and the datasheet peak (nothing measured on a "
                     "device type)")
    if "derived" in sources:
        notes.append("some compute times were derived from measurements at another tp degree or micro-batch size")
    if not model.enforces_memory and violations:
        notes.append(f"the {model.name} cost model does not enforce memory; the plan would not fit: " + "; ".join(violations))
    return notes


def _stage_report(instance, plan: Plan, costs: StageCosts, s: int, k: int, l: int) -> StageReport:
    """One stage's terms; [k, l) is its range in stage order."""
    place = costs.placement[s]
    chunks = tuple(plan.chunks(s))
    uneven = isinstance(costs, UnevenCosts)
    memory, capacity = costs.tightest(s, k, l) if uneven else (float(costs.memory(s, k, l)), costs.capacity[s])
    return StageReport(
        index=s, layers=(chunks[0][0], chunks[-1][1]), groups=plan.stages[s], device_types=place.device_types,
        nodes=tuple(dict.fromkeys(instance.nodes[j].name for j in place.all_nodes)),
        compute=float(costs.compute(s, k, l)), p2p=float(costs.p2p(s, l)), allreduce=float(costs.allreduce(s, k, l)),
        memory=memory, capacity=capacity, fits=costs.fits(s, k, l) if uneven else memory <= capacity, chunks=chunks,
        recompute=plan.recompute_of(s),
        replica_compute=tuple(float(t) for t in costs.replica_compute(s, k, l)) if uneven else (),
        compute_source=_compute_source(instance, costs, plan, s), optimizer_step=float(costs.optimizer_step(s, k, l)))


def _compute_source(instance, costs, plan: Plan, s: int) -> str:
    """Where stage s's layer times come from: the least measured over its replicas' devices at the
    replica's tp and share (``measured``, ``derived`` from a measurement, or the ``datasheet``;
    :mod:`.profiles`)."""
    shares, tp = plan.shares_at(s), plan.tp_at(s)
    keys = {(instance.nodes[instance.device_node[d]].device_type, instance.nodes[instance.device_node[d]].intra_bandwidth,
             shares[r // plan.cp]) for r, group in enumerate(plan.stages[s]) for d in group}
    return worst_source(costs.tables.layer_times(t, bw, tp, b).source for t, bw, b in sorted(keys))


def _price(instance, devices, seconds: float) -> float | None:
    """USD of one iteration on the devices used, at their types' $/hour."""
    prices = [instance.device_types[instance.nodes[instance.device_node[d]].device_type].price_per_hour for d in devices]
    return None if any(p is None for p in prices) else sum(prices) * seconds / 3600.0


def model_flops(instance) -> float | None:
    """Training FLOPs of one iteration as MFU counts them: 6 x parameters x tokens (Chowdhery
    et al. 2022 without the attention term; the convention of the Llama 3 and Megatron MFU
    figures), when the model gives its sequence length; else the layers' own FLOPs (forward
    and backward, as executed) over the global batch; None when neither is known."""
    tr = instance.training
    if tr.tokens_per_sample is not None:
        params = float(LayerSums(instance, 1).params_in(0, instance.num_layers))
        return 6.0 * params * tr.tokens_per_sample * tr.global_batch
    if any(layer.flops is None for layer in instance.layers):
        return None
    return sum(layer.flops for layer in instance.layers) * tr.global_batch


def _mfu(instance, devices, seconds: float) -> float | None:
    """Model-FLOPs utilisation: :func:`model_flops` over seconds x the used devices' peak FLOP/s."""
    flops = model_flops(instance)
    peaks = [instance.device_types[instance.nodes[instance.device_node[d]].device_type].peak_flops for d in devices]
    if flops is None or any(p is None for p in peaks) or seconds <= 0:
        return None
    return flops / (seconds * sum(peaks))


@dataclass(frozen=True)
class MemoryParts:
    """Per-device bytes of one stage, split as eq. H5 adds them up."""

    stage: int
    model_state: float  # weights + gradients + optimizer states
    activations: float  # kept for backward, for the micro-batches in flight (and buffers)
    reserve: float  # the framework's bytes (eq. H14): reserve, NCCL buffers, fragmentation
    total: float

    @property
    def dominant(self) -> str:
        parts = {"model state": self.model_state, "activations": self.activations, "reserve": self.reserve}
        return max(parts, key=parts.get)


def memory_parts(instance, evaluation: Evaluation, cost_model: str | CostModel = "hetero") -> tuple[MemoryParts, ...]:
    """An evaluation's per-stage memory split into model state, activations and reserve (eq. H5),
    by the terms of ``cost_model`` (the one the evaluation was made with); several pipelines'
    stages in the order of ``evaluation.stages``, each by its own pipeline's terms."""
    plan, model = evaluation.plan, get_cost_model(cost_model)
    if isinstance(plan, Pipelines):
        return tuple(part for i, ev in enumerate(evaluation.pipelines)
                     for part in memory_parts(pipeline_instance(instance, plan, i), ev, model))
    tables, chunks = Tables(instance), plan.partition if plan.virtual_stages > 1 else None
    per_stage = [model.candidate_terms(tables, plan.stage_candidate(s), chunks=chunks) for s in range(plan.pp)]
    boundaries = stage_boundaries(plan)
    out = []
    for r in evaluation.stages:
        terms = per_stage[r.index]  # the stage's own tp_s and dp_s (the same for every stage of a uniform plan)
        state = float(terms.sums.params_in(boundaries[r.index], boundaries[r.index + 1])) * terms.state_bytes_per_param
        activations = (r.memory - terms.framework_bytes) / terms.allocator_scale - state
        out.append(MemoryParts(r.index, state, activations, r.memory - state - activations, r.memory))
    return tuple(out)
