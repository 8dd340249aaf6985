"""Solving a long model over blocks of consecutive layers (:mod:`amp_opt.model.coarsen`).

The search runs on the coarse instance; its plans are mapped back to layer boundaries
and re-scored by the evaluator on the original instance (the same value: the cost terms
of whole blocks are exact).  Bounds: the coarse search's bound holds only for plans
whose boundaries lie on block boundaries (it is reported as ``block_plans_bound``), so
the bound reported is one that holds for every plan of the original model:

    time >= c * max(F / p, f_max) + F / v

per candidate of the original instance, F the sum over layers of the fastest compute
class's time (hetero) or of the blended time (amp), over cp, f_max the largest such time
of one layer, v the virtual stages, c the least bottleneck weight of the cost model's
iteration time (n - 1/v in the closed form H6/H11, stage 0's under 1F1B, H13): the slowest stage takes at least the average and at least one layer, fill and
drain at least every layer once; communication and memory are left out.  Its minimum
over the candidates is the bound (per-layer times are computed once per (tp,
micro-batch) and reduced to F and f_max at once).  A coarse search that proves no block
plan fits does not prove the model infeasible (a finer split might fit), so it ends as
"no plan found" (exit 4), not as infeasible.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import InfeasibleError, NoPlanFound
from ..model.candidates import candidates
from ..model.costs import cost_model
from ..model.costs.iteration import pipeline_weights
from ..model.costs.contract import library_priced
from ..model.costs.amp import blended_times
from ..model.evaluate import evaluate
from ..model.profiles import layer_times
from .clock import Clock
from .result import SolveResult, status_of
from .tuning import REMAP_SECONDS_PER_LAYER


def solve_blocks(instance, coarse, boundaries: tuple[int, ...], run, clock: Clock, *, model) -> SolveResult:
    """``run(coarse, clock)``, its plans mapped to ``instance``'s layers and re-scored; the coarse
    search's clock keeps REMAP_SECONDS_PER_LAYER per original layer back for that."""
    try:
        result = run(coarse, clock.less(REMAP_SECONDS_PER_LAYER * instance.num_layers, floor=0.01))
    except NoPlanFound as exc:  # said with the caller's time limit, without the coarse search's bound
        raise (NoPlanFound(clock.stopped_why()) if exc.reason.startswith("time limit") else exc) from None
    except InfeasibleError:
        raise NoPlanFound("coarsened", f"no plan with stage boundaries on the {len(boundaries) - 1} blocks of "
                                       f"consecutive layers fits ({instance.num_layers} layers in all); a finer split was not "
                                       "searched, so infeasibility is not proven") from None
    top = tuple(evaluate(instance, dataclasses.replace(ev.plan, partition=tuple(boundaries[i] for i in ev.plan.partition)),
                         model) for ev in result.top)
    objective = top[0].predicted_time
    bound = min(objective, layer_bound(instance, model))
    stats = result.solver
    extra = {**stats.extra, "coarsened": (f"{instance.num_layers} layers searched as {len(boundaries) - 1} blocks of "
                                          "consecutive layers; stage boundaries on block boundaries only"),
             "block_plans_bound": stats.bound, "block_plans_status": stats.status}
    stats = dataclasses.replace(stats, objective=objective, bound=bound, extra=extra,
                                status=status_of(objective, bound))
    return SolveResult(top[0], top, stats)


def layer_bound(instance, model) -> float:
    """A lower bound on every plan of the original model (module doc) under ``model`` (a name
    or a :class:`~amp_opt.model.costs.CostModel`)."""
    model = cost_model(model)
    if not library_priced(model):  # the bound reads the layer tables, which a caller's model may not
        return 0.0
    sums: dict[tuple[int, int], tuple[float, float]] = {}
    keys = sorted({n.compute_key for n in instance.nodes})
    schedule = model.schedule
    best = np.inf
    for cand in candidates(instance, model):
        key = (cand.tp, cand.micro_batch)
        if key not in sums:
            if model.name == "amp":
                per_layer = blended_times(_Uncached(instance), cand.tp, cand.micro_batch)[0]
            else:
                per_layer = np.min([layer_times(instance, t, bw, cand.tp, cand.micro_batch, latency=lat).seconds
                                    for t, bw, lat in keys], axis=0)
            sums[key] = float(per_layer.sum()), float(per_layer.max())
        F, f_max = (x / cand.cp for x in sums[key])  # context parallelism splits every layer's work
        v = cand.virtual_stages
        weight = pipeline_weights(cand.n_micro(instance), cand.pp, v, schedule).least
        best = min(best, weight * max(F / cand.pp, f_max) + F / v)
    return best


class _Uncached:
    """The part of Tables that blended_times uses, without keeping per-layer arrays."""

    def __init__(self, instance):
        self.instance = instance

    def layer_times(self, device_type, intra_bw, tp, micro_batch):
        return layer_times(self.instance, device_type, intra_bw, tp, micro_batch)
