"""What would make a plan, or an instance, fit in memory: the analysis behind ``explain``.

Every number comes from the evaluator or the exact search: for a plan (:func:`explain_plan`),
the fullest stages, the bytes over each device type and the dominant part of the footprint,
then concrete alternatives (smaller micro-batch, ZeRO, sequence parallelism, recomputation,
more pipeline stages, larger tp; :func:`plan_alternatives`), each scored by
:func:`amp_opt.evaluate` or, for another candidate, by the exact stage DP over its groupings
(:func:`best_plan_of`).  For an instance without a plan (:func:`explain_instance`),
:func:`amp_opt.solve` runs on relaxed copies of the instance (:func:`relaxations`).
The command (:mod:`amp_opt.commands.explain`) prints what these return.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from ..errors import InfeasibleError, InputError, NoPlanFound
from ..model.candidates import allowed_tp
from ..model.costs import cost_model as get_cost_model
from ..model.costs import plan_of
from ..model.engines import engine_of
from ..model.evaluate import MemoryParts, evaluate, memory_parts
from ..model.load import DEFAULT_TP, RECOMPUTE
from ..model.plan import Candidate, Pipelines, check_plan, parse_plan, rank_order_stages
from ..model.plan_pipelines import pipeline_instance
from ..model.tables import Tables
from .context import Search
from .free_grouping import candidate_graph
from .options import solve_options
from .partition import optimal_path
from .solve import solve

GIB = 2**30


# ---------------------------------------------------------------------------
# Explaining a plan


@dataclass(frozen=True)
class Overflow:
    stage: int
    device_type: str
    memory: float
    capacity: float
    parts: MemoryParts
    position: int = 0  # the stage's place in the evaluation's stages (several pipelines: pipeline 0's first)
    pipeline: int | None = None  # several pipelines: the stage's pipeline

    @property
    def over(self) -> float:
        return self.memory - self.capacity


@dataclass(frozen=True)
class Alternative:
    """A concrete change to the plan (or its candidate), scored by the evaluator."""

    change: str
    plan: dict | None
    fits: bool
    predicted_time: float | None
    detail: str


def overflows(instance, ev, parts) -> list[Overflow]:
    """Every (stage, device type) whose memory is below the stage's per-device need."""
    out = []
    for at, (r, p) in enumerate(zip(ev.stages, parts)):
        for t in r.device_types:
            cap = instance.device_types[t].capacity
            if r.memory > cap:
                out.append(Overflow(r.index, t, r.memory, cap, p, at, r.pipeline))
    return out


def _evaluated(change: str, instance, plan, cost_model: str, detail: str = "") -> Alternative:
    ev = evaluate(instance, plan, cost_model)
    fits = all(r.fits for r in ev.stages)
    worst = max(ev.stages, key=lambda r: r.memory / r.capacity)
    if not detail:
        detail = (f"fullest stage {worst.index}: {worst.memory / GIB:.2f} of {worst.capacity / GIB:.2f} GiB")
    return Alternative(change, ev.plan.to_json(), fits, ev.predicted_time, detail)


def best_plan_of(instance, cand: Candidate, cost_model: str):
    """The exact search's best plan for one candidate, or None if none fits (or the engine cannot run it)."""
    if engine_of(instance).rule(instance, cand) is not None:
        return None
    search = Search(instance, solve_options(cost_model=cost_model))
    graph, to_plan = candidate_graph(search.tables, cand, search.model, search.options.placement, search.chunks(cand))
    best = optimal_path(graph)
    return None if best is None else search.evaluate(to_plan(best[1]))


def _searched(change: str, instance, cand: Candidate, cost_model) -> Alternative:
    ev = best_plan_of(instance, cand, cost_model)
    if ev is None:
        return Alternative(change, None, False, None, "no layer partition and device grouping of this candidate fits")
    return Alternative(change, ev.plan.to_json(), True, ev.predicted_time, "best partition and grouping found by the exact search")


def _changed(instance, plan, cost_model: str, change: str, **fields) -> list[Alternative]:
    """The plan with some settings changed, scored; nothing when its engine cannot run it."""
    other = dataclasses.replace(plan, **fields)
    if not other.uniform:  # per-stage degrees: the engine's rules on each stage, through the plan's checks
        try:
            check_plan(instance, other)
        except InputError:
            return []
    elif engine_of(instance).rule(instance, other.candidate) is not None:
        return []
    return [_evaluated(change, instance, other, cost_model)]


def _block_method(instance, plan, cost_model: str) -> list[Alternative]:
    """Megatron's block method: the fastest count r of first layers recomputed on every stage that
    fits (below the most transformer layers a stage of the plan holds), else the largest r."""
    if not isinstance(plan.recompute, str):
        return []
    most = max(sum(instance.layers[i].recomputes for i in plan.stage_layers(s)) for s in range(plan.pp))
    tried = [a for r in range(1, most) if r != plan.recompute_layers
             for a in _changed(instance, plan, cost_model, f"recompute full, first {r} layers of each stage (block method)",
                               recompute="full", recompute_layers=r)]
    fitting = [a for a in tried if a.fits]
    if fitting:
        return [min(fitting, key=lambda a: a.predicted_time)]
    return tried[-1:]


def _per_stage(instance, plan, cost_model: str) -> list[Alternative]:
    """On an engine whose stages may recompute differently (DeepSpeed, amp_opt): each stage in its faster
    mode that fits, full recomputation or none (what the search chooses per stage)."""
    if not engine_of(instance).per_stage_recompute or plan.pp == 1 or plan.virtual_stages > 1:
        return []
    if plan.uniform:
        cand = dataclasses.replace(plan.candidate, recompute="full", recompute_layers=0, per_stage=True)
        stages = plan.stages or rank_order_stages(plan.tp, plan.dp, plan.pp, plan.cp)
        modes = plan_of(get_cost_model(cost_model), Tables(instance), cand, plan.partition, stages).recompute
    else:  # stages whose degrees differ: a stage's mode changes its own terms only (hetero.md, "Decisions")
        bare = evaluate(instance, dataclasses.replace(plan, recompute="none", recompute_layers=None), cost_model)
        modes = tuple("none" if r.fits else "full" for r in bare.stages)
    if isinstance(modes, str) or len(set(modes)) == 1:
        return []  # one mode for every stage: listed with the uniform modes
    return _changed(instance, plan, cost_model, f"recompute per stage: {', '.join(modes)}",
                    recompute=tuple(modes), recompute_layers=None)


def _settings_changed(instance, plan, cost_model: str) -> list[Alternative]:
    """The plan with more memory-saving settings: ZeRO, sequence parallelism, recomputation, the
    block method, per-stage recomputation."""
    out = []
    for z in range(plan.zero_stage + 1, 4):
        out += _changed(instance, plan, cost_model, f"ZeRO stage {plan.zero_stage} -> {z}", zero_stage=z)
    if all(plan.tp_at(s) > 1 for s in range(plan.pp)) and not plan.sequence_parallel:
        out += _changed(instance, plan, cost_model, "sequence parallelism", sequence_parallel=True)
    for mode in ("selective", "full"):
        if mode != plan.recompute:
            out += _changed(instance, plan, cost_model, f"recompute {mode}", recompute=mode, recompute_layers=None)
    out += _block_method(instance, plan, cost_model)
    out += _per_stage(instance, plan, cost_model)
    return out


def _on_its_devices(instance, plan, cost_model: str) -> list[Alternative]:
    """The changes that keep a plan's partition and devices: a smaller micro-batch (one tp and dp),
    more memory-saving settings (where the cost model counts memory)."""
    out = []
    batch = instance.training.global_batch
    if plan.uniform:
        for b in sorted({m for m in instance.search.micro_batches if m < plan.micro_batch} | {
                m for m in (1, 2, 4, 8) if m < plan.micro_batch and batch % (plan.dp * m) == 0}, reverse=True):
            if batch % (plan.dp * b) == 0:
                out += _changed(instance, plan, cost_model,
                                f"micro_batch {plan.micro_batch} -> {b} (same partition and devices)", micro_batch=b)
    if get_cost_model(cost_model).enforces_memory:
        out += _settings_changed(instance, plan, cost_model)
    return out


def _pipeline_alternatives(instance, plan: Pipelines, over, cost_model: str) -> list[Alternative]:
    """Per pipeline with a stage that does not fit, the changes on its own devices (:func:`_on_its_devices`,
    on the samples it processes), each scored as the whole plan with that pipeline changed and its
    micro-batches set to keep its samples; the other pipelines unchanged."""
    out = []
    for i in sorted({o.pipeline for o in over}):
        samples = plan.samples(i)
        for alt in _on_its_devices(pipeline_instance(instance, plan, i), plan.pipelines[i], cost_model):
            changed = parse_plan(alt.plan)
            M = changed.pipeline_micro_batch
            if samples % M:
                continue
            whole = Pipelines(plan.pipelines[:i] + (changed,) + plan.pipelines[i + 1:],
                              plan.micro_batches[:i] + (samples // M,) + plan.micro_batches[i + 1:])
            try:
                out.append(_evaluated(f"pipeline {i}: {alt.change}", instance, whole, cost_model))
            except InputError:  # a setting several pipelines do not take (ZeRO): not an alternative
                continue
    return out


def plan_alternatives(instance, plan, cost_model: str) -> list[Alternative]:
    """Smaller micro-batch; more memory-saving settings (ZeRO, sequence parallelism, recomputation,
    the block method); more pipeline stages (same tp); larger tp: each scored.  A plan whose
    stages differ gets the settings only (its degrees are per stage, not one candidate's)."""
    L = instance.num_layers
    batch = instance.training.global_batch
    out = _on_its_devices(instance, plan, cost_model)
    if not plan.uniform:
        return out
    cand = plan.candidate
    devices = cand.devices
    for pp in range(plan.pp + 1, min(L, devices // (plan.tp * plan.cp)) + 1):
        if (devices // (plan.tp * plan.cp)) % pp:
            continue
        dp = devices // (plan.tp * plan.cp * pp)
        bs = [b for b in sorted({plan.micro_batch, 1}, reverse=True) if batch % (dp * b) == 0]
        if bs:
            out.append(_searched(f"pp {plan.pp} -> {pp} (tp {plan.tp}, dp {dp}, micro_batch {bs[0]})", instance,
                                 dataclasses.replace(cand, dp=dp, pp=pp, micro_batch=bs[0], virtual_stages=1), cost_model))
        if len([a for a in out if a.change.startswith("pp ")]) >= 3:
            break
    for tp in allowed_tp(instance) + [m for m in (2, 4, 8) if m not in instance.search.tp]:
        if tp <= plan.tp or any(node.devices % tp for node in instance.nodes) or devices % (tp * plan.cp * plan.pp):
            continue
        dp = devices // (tp * plan.cp * plan.pp)
        if batch % (dp * plan.micro_batch) == 0:
            out.append(_searched(f"tp {plan.tp} -> {tp} (pp {plan.pp}, dp {dp}, micro_batch {plan.micro_batch})", instance,
                                 dataclasses.replace(cand, tp=tp, dp=dp), cost_model))
    return out


def explain_plan(instance, plan, cost_model: str = "hetero") -> dict[str, Any]:
    """Why a plan does (not) fit, per stage, and which concrete alternatives fit."""
    plan = check_plan(instance, plan)
    ev = evaluate(instance, plan, cost_model)
    parts = memory_parts(instance, ev, cost_model)
    over = overflows(instance, ev, parts)
    stages = [
        {**({} if r.pipeline is None else {"pipeline": r.pipeline}),
         "stage": r.index, "tp": _own(ev.plan, r).tp_at(r.index), "dp": _own(ev.plan, r).dp_at(r.index),
         "shares": list(_own(ev.plan, r).shares_at(r.index)), "device_types": list(r.device_types), "memory": r.memory,
         "capacity": r.capacity,
         "headroom": r.capacity - r.memory, "model_state": p.model_state, "activations": p.activations,
         "reserve": p.reserve, "dominant": p.dominant}
        for r, p in zip(ev.stages, parts)
    ]
    out: dict[str, Any] = {
        "plan": ev.plan.to_json(),
        "cost_model": cost_model,
        "fits": not over,
        "feasible": ev.feasible,
        "predicted_time": ev.predicted_time,
        "stages": stages,
        "overflows": [{**({} if o.pipeline is None else {"pipeline": o.pipeline}),
                       "stage": o.stage, "position": o.position, "device_type": o.device_type, "memory": o.memory, "capacity": o.capacity,
                       "over_bytes": o.over, "dominant": o.parts.dominant} for o in over],
    }
    if not get_cost_model(cost_model).enforces_memory:
        out["note"] = f"the {ev.cost_model} cost model does not enforce memory; the memory figures are eq. H5's"
    if over:  # several pipelines: each overflowing pipeline's own settings, the others kept
        alternatives = (_pipeline_alternatives(instance, plan, over, cost_model) if isinstance(plan, Pipelines)
                        else plan_alternatives(instance, plan, cost_model))
        out["alternatives"] = [dataclasses.asdict(a) for a in alternatives]
    return out


def _own(plan, report):
    """The pipeline a stage report belongs to: the plan, or its own pipeline of several."""
    return plan if report.pipeline is None else plan.pipelines[report.pipeline]


# ---------------------------------------------------------------------------
# Explaining an instance


def relaxations(instance) -> list[tuple[str, Any]]:
    """Modified copies of an instance, each relaxing one rule that may keep every plan out of memory."""
    out = []
    tr, search = instance.training, instance.search

    def allow(change: str, **fields):
        out.append((change, dataclasses.replace(instance, search=dataclasses.replace(search, **fields))))

    if set(search.zero_stages) != {0, 1, 2, 3}:
        allow("allow ZeRO stages 0-3", zero_stages=(0, 1, 2, 3))
    if set(search.recompute) != set(RECOMPUTE):
        allow("allow activation recomputation", recompute=RECOMPUTE)
    if True not in search.sequence_parallel:
        allow("allow sequence parallelism", sequence_parallel=(False, True))
    wider = dataclasses.replace(instance, search=dataclasses.replace(search, tp=tuple(sorted({*search.tp, *DEFAULT_TP}))))
    if allowed_tp(wider) != allowed_tp(instance):
        out.append((f"allow tp in {allowed_tp(wider)}", wider))
    if 1 not in search.micro_batches:
        out.append(("allow micro_batch 1", dataclasses.replace(
            instance, search=dataclasses.replace(search, micro_batches=tuple(sorted({1, *search.micro_batches}))))))
    if search.max_pp < instance.num_layers:
        out.append((f"allow up to {instance.num_layers} pipeline stages",
                    dataclasses.replace(instance, search=dataclasses.replace(search, max_pp=instance.num_layers))))
    if tr.memory_reserve > 0:
        out.append(("memory_reserve 1 GiB -> 0.5 GiB" if tr.memory_reserve == GIB else
                    f"memory_reserve halved to {tr.memory_reserve / 2 / GIB:.2f} GiB",
                    dataclasses.replace(instance, training=dataclasses.replace(tr, memory_reserve=tr.memory_reserve / 2))))
    if len(out) > 2:  # all together, except the reserve: the framework's needs are real
        out.append(("all of the above except the reserve", _merged(instance, [r for _, r in out[:-1]])))
    return out


def _merged(instance, relaxed) -> Any:
    """One instance with every relaxed training/search field of the given copies."""
    tr, search = instance.training, instance.search
    for r in relaxed:
        tr = dataclasses.replace(tr, **{f.name: getattr(r.training, f.name) for f in dataclasses.fields(tr)
                                        if getattr(r.training, f.name) != getattr(instance.training, f.name)})
        search = dataclasses.replace(search, **{f.name: getattr(r.search, f.name) for f in dataclasses.fields(search)
                                                if getattr(r.search, f.name) != getattr(instance.search, f.name)})
    return dataclasses.replace(instance, training=tr, search=search)


def explain_instance(instance, cost_model: str = "hetero", time_limit: float = 30.0) -> dict[str, Any]:
    """Solve; if nothing fits, say why and which relaxations make a plan fit (each solve time-limited)."""
    try:
        result = solve(instance, cost_model=cost_model, time_limit=time_limit)
    except InfeasibleError as exc:
        reason = str(exc)
    else:
        best = result.best
        return {"solvable": True, "cost_model": cost_model, "predicted_time": best.predicted_time,
                "plan": best.plan.to_json(), "solver_status": result.solver.status,
                "stages": [{"stage": r.index, "headroom": r.capacity - r.memory} for r in best.stages]}
    tried = []
    for change, relaxed in relaxations(instance):
        start = time.perf_counter()
        try:
            r = solve(relaxed, cost_model=cost_model, time_limit=time_limit)
        except InfeasibleError as exc:
            tried.append({"change": change, "fits": False, "detail": str(exc),
                          "seconds": time.perf_counter() - start})
        except NoPlanFound as exc:  # no verdict within the time limit: neither fits nor not
            tried.append({"change": change, "fits": None, "detail": str(exc),
                          "seconds": time.perf_counter() - start})
        else:
            tried.append({"change": change, "fits": True, "predicted_time": r.best.predicted_time,
                          "plan": r.best.plan.to_json(), "seconds": time.perf_counter() - start})
    return {"solvable": False, "cost_model": cost_model, "reason": reason, "relaxations": tried}
