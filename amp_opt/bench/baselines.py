"""Plans to compare amp_opt's plan against, all scored by ``evaluate(instance, plan, "hetero")``.

* :func:`amp_optimum`: the amp-model optimum, what AMP's method deploys when searched exactly.
  The optimum of AMP's own cost model in AMP's search space
  (``solve(..., cost_model="amp", placement="rank-order")``), re-scored under hetero.  (Not
  AMP's own plan, the one AMP's released search reports: its partition DP is not exact, so that
  plan can be slower still; tests/test_amp_reproduction.py.)  AMP's model ignores memory, so the
  optimum may not fit;
  then the best amp-ranked plan that does fit is found by walking
  ``solve(..., top_k=K, per_candidate=True)`` for growing K.
* :func:`expert_default`: a Megatron-LM practitioner's default: tp = GPUs per
  node, an even layer split, rank order, the fewest pipeline stages that fit,
  the largest micro-batch that fits.
* :func:`ideal_bound`: the compute-only throughput bound (no bubbles, no
  communication, perfect load balance over every GPU).

Times come from :func:`amp_opt.evaluate` and :func:`amp_opt.solve`; the ideal
bound reads per-layer times from :func:`amp_opt.model.profiles.layer_times`, the same
table the evaluator uses.  Nothing here re-derives a cost term.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..model.candidates import allowed_tp
from ..model.engines import even_partition
from ..model.evaluate import Evaluation, evaluate
from ..model.plan import Plan
from ..model.tables import Tables
from ..search.solve import solve

# Sizes of the amp-ranked lists walked to find the best plan that fits.
AMP_WALK = (16, 64, 256, 1024)


# ---------------------------------------------------------------- (b) the amp-model optimum

@dataclass(frozen=True)
class AmpOptimum:
    """AMP's optimum under its own model, and the best amp-ranked plan that fits.

    ``optimum`` and ``fitting`` are hetero evaluations; ``fitting`` is ``optimum`` when
    the optimum fits, the first plan of AMP's ranking that fits otherwise, or None
    (``reason`` says why).  ``fitting_rank`` is its 1-based place in the ranking.
    The ranking lists each candidate (tp, dp, pp, micro-batch) once, with its
    amp-optimal partition, as ``solve(top_k=K, per_candidate=True)`` returns it.
    """

    optimum: Evaluation
    amp_time: float  # the optimum's time under the amp model (seconds)
    status: str  # the amp solve's status: OPTIMAL, or FEASIBLE if it hit the time limit
    fitting: Evaluation | None
    fitting_rank: int | None
    ranked: int  # amp-ranked plans examined
    reason: str = ""


def amp_optimum(instance, time_limit: float | None = None, walk: tuple[int, ...] = AMP_WALK) -> AmpOptimum:
    """The amp-model optimum re-scored under hetero; if it does not fit, walk AMP's ranking.

    ``time_limit`` bounds the whole function (every solve gets what is left).
    Raises InfeasibleError if AMP's search space is empty (the amp model
    ignores memory, so it has an optimum whenever it has a candidate).
    """
    deadline = None if time_limit is None else time.perf_counter() + time_limit

    def remaining():
        return None if deadline is None else max(deadline - time.perf_counter(), 1e-3)

    first = solve(instance, cost_model="amp", placement="rank-order", top_k=1, time_limit=remaining())
    optimum = evaluate(instance, first.best.plan, "hetero")
    common = dict(optimum=optimum, amp_time=first.best.predicted_time, status=first.solver.status)
    if optimum.feasible:
        return AmpOptimum(**common, fitting=optimum, fitting_rank=1, ranked=1)
    checked = 1
    for k in walk:
        if deadline is not None and time.perf_counter() >= deadline:
            return AmpOptimum(**common, fitting=None, fitting_rank=None, ranked=checked,
                           reason=f"time limit reached after {checked} amp-ranked plans, none fits")
        result = solve(instance, cost_model="amp", placement="rank-order", top_k=k, per_candidate=True,
                       time_limit=remaining())
        for rank, ranked in enumerate(result.top[checked:], start=checked + 1):
            ev = evaluate(instance, ranked.plan, "hetero")
            if ev.feasible:
                return AmpOptimum(**common, fitting=ev, fitting_rank=rank, ranked=rank)
        checked = max(checked, len(result.top))
        if result.solver.status != "OPTIMAL":  # stopped by the time limit: the list may be short
            return AmpOptimum(**common, fitting=None, fitting_rank=None, ranked=checked,
                           reason=f"time limit reached after {checked} amp-ranked plans, none fits")
        if len(result.top) < k:  # the ranking is exhausted
            return AmpOptimum(**common, fitting=None, fitting_rank=None, ranked=checked,
                           reason=f"none of the {checked} amp-ranked plans fits in memory")
    return AmpOptimum(**common, fitting=None, fitting_rank=None, ranked=checked,
                   reason=f"none of the first {checked} amp-ranked plans fits in memory")


# ---------------------------------------------------------------- (c) expert default

@dataclass(frozen=True)
class ExpertPlan:
    """The Megatron-style default plan, hetero-scored, or None with the reason."""

    evaluation: Evaluation | None
    reason: str  # how it was chosen, or why there is none


def expert_default(instance) -> ExpertPlan:
    """tp = GPUs per node, even split, rank order, fewest stages and largest micro-batch that fit.

    tp is the largest allowed degree dividing every node's device count (the
    node size on uniform 8-GPU clusters).  pp runs over the powers of two
    dividing devices/tp, smallest first; dp = devices/(tp*pp) must divide the
    global batch; for each pp the micro-batches that divide global/dp are tried
    from the largest down, and the first plan that fits in memory is returned.
    """
    tps = allowed_tp(instance)
    if not tps:
        return ExpertPlan(None, f"no allowed tp degree {list(instance.search.tp)} divides every node")
    tp = max(tps)
    per_tp = instance.num_devices // tp
    batch = instance.training.global_batch
    tried = []
    pp = 1
    while pp <= per_tp:
        if per_tp % pp == 0 and pp <= instance.search.max_pp:
            dp = per_tp // pp
            partition = even_partition(instance, pp)
            sizes = [b for b in instance.search.micro_batches if batch % (dp * b) == 0]
            if partition is None or not sizes:
                tried.append(f"pp={pp}: " + ("more stages than layers" if partition is None
                                              else f"no micro-batch with dp={dp} divides the batch {batch}"))
            for b in sorted(sizes, reverse=True):
                ev = evaluate(instance, Plan(tp, dp, pp, b, partition), "hetero")
                if ev.feasible:
                    return ExpertPlan(ev, f"tp={tp} (largest dividing every node), smallest power-of-two pp that fits")
            if sizes and partition is not None:
                tried.append(f"pp={pp}: no micro-batch fits in memory")
        pp *= 2
    return ExpertPlan(None, f"no plan with tp={tp} fits: " + "; ".join(tried))


# ---------------------------------------------------------------- (d) ideal bound

@dataclass(frozen=True)
class IdealBound:
    """Seconds per iteration if every GPU computed at full speed, nothing else.

    ``per_sample[g]`` is P_g, the device-seconds one sample costs on device type
    g at its most efficient (tp, micro-batch) setting; ``time`` is
    global_batch / sum over devices of 1 / P_type(device).
    """

    time: float
    per_sample: dict[str, float]
    devices: dict[str, int]


def ideal_bound(instance) -> IdealBound:
    """The compute-only bound: global_batch / Σ_devices 1/P_g.

    P_g = min over allowed tp degrees m and micro-batch sizes b of
    m · Σ_l t(l, g, m, b) / b, with t the evaluator's per-layer forward+backward
    time (:func:`amp_opt.model.profiles.layer_times`): the device-seconds of one
    sample through the whole model.  Under the FLOPs estimate this is
    Σ_l flops(l) / (peak(g) · η) (tp = 1, no communication).

    It assumes no pipeline bubble, no p2p, no allreduce, no memory limit and
    perfect load balance.  Every hetero plan is at least this slow when the
    layer times of all device types are proportional (always true of the
    FLOPs estimate); with measured profiles a type that is relatively faster on
    some layers could in principle beat it slightly.  Nodes of one type with
    different intra-node links take the smaller P.
    """
    tps = allowed_tp(instance) or [1]
    tables = Tables(instance)
    per_sample: dict[str, float] = {}
    devices: dict[str, int] = {}
    for node in instance.nodes:
        best = min(
            m * float(tables.layer_times(node.device_type, node.intra_bandwidth, m, b,
                                         latency=node.intra_latency).seconds.sum()) / b
            for m in tps
            for b in instance.search.micro_batches
        )
        per_sample[node.device_type] = min(best, per_sample.get(node.device_type, best))
        devices[node.device_type] = devices.get(node.device_type, 0) + node.devices
    speed = sum(count / per_sample[g] for g, count in devices.items())
    return IdealBound(instance.training.global_batch / speed, per_sample, devices)


__all__ = ["AmpOptimum", "ExpertPlan", "IdealBound", "amp_optimum", "expert_default", "ideal_bound", "even_partition"]
