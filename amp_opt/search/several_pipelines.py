"""Ruling out plans of several pipelines: the bound P1 over every split of the devices and samples.

A plan of several pipelines (U6 of ``formulations/hetero.md``) is never faster than its slowest
pipeline run alone on its own devices and samples (P1, ``formulations/exactness.md``, X6).  So
when, over every split of the cluster's devices and the global batch into two pipelines or more,
the slowest pipeline's own optimum (a solve of that sub-cluster at that batch) is at least the
plan found, no plan of several pipelines beats it, and OPTIMAL covers them too.  The sub-clusters
are per-node device counts up to the symmetry of identical nodes (X3); the recursion over the
splits is :func:`_Splits.least`.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass

from ..errors import InfeasibleError, NoPlanFound
from ..model.classes import node_classes
from ..model.instance import idle_level
from .device_sets import WITHIN, device_set
from .uneven import ONE_PIPELINE, SEVERAL_UNSEARCHED

# Sub-solves (one per sub-cluster and batch) a bound may need at most: the splits of a tiny cluster
# need a few dozen (three single-GPU nodes of two types, a batch of 8: at most 35); the cap keeps
# the bound to clusters where every split is a solve of a few milliseconds.
MAX_SUB_SOLVES = 256

REL = 1e-9  # a pipelines' bound this close to the plan found ties it (the evaluator's rounding)


@dataclass(frozen=True)
class PipelinesBound:
    """What P1 proved against the plan checked: ``ruled_out`` when no plan of several pipelines
    beats it; otherwise ``split_below``, the slowest pipeline's optimum on a split found below it
    (such a split may hold a faster plan of several pipelines, or not: P1 cannot tell), or
    ``why`` nothing was proved; ``sub_solves``: the sub-cluster searches run."""

    ruled_out: bool
    sub_solves: int
    split_below: float | None = None
    why: str | None = None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def why_not(instance, options) -> str | None:
    """Why P1 is not tried on this solve (one phrase), None when it is."""
    if options.placement != "free":
        return "the rank-order placement (plans of one pipeline in rank order only)"
    if options.objective != "time":
        return "the cost objective (P1 bounds time)"
    if any(node.inter_latency < node.intra_latency for node in instance.nodes):
        return "a node whose inter-node latency is below its intra-node one (P1's premise)"
    level = idle_level(instance.search.idle)
    if level not in ("devices", "none"):
        return f"search.idle {level!r} (P1 splits devices)"
    if _count(instance) > MAX_SUB_SOLVES:
        return f"more than {MAX_SUB_SOLVES} sub-clusters and batches to solve"
    return None


def _count(instance) -> int:
    """Sub-clusters times batches the recursion may ask for, at most."""
    vectors = math.prod(math.comb(len(c.nodes) + c.devices, c.devices) for c in node_classes(instance))
    return (vectors - 1) * (instance.training.global_batch - 1)


def pipelines_bound(instance, options, value: float, sub_solve, clock) -> PipelinesBound:
    """P1 against ``value`` (seconds per iteration of the plan checked: the K-th best with
    ``top_k`` K).  ``sub_solve(sub_instance, clock)``: the one-pipeline search of a sub-cluster
    (a :class:`~amp_opt.search.result.SolveResult`, or InfeasibleError / NoPlanFound)."""
    why = why_not(instance, options)
    if why is not None:
        return PipelinesBound(False, 0, why=why)
    splits = _Splits(instance, sub_solve, clock, limit=value * (1 - REL))
    whole = tuple((c.devices,) * len(c.nodes) for c in node_classes(instance))
    least = splits.least(whole, instance.training.global_batch, several=True)
    if splits.unknown:  # a sub-cluster's optimum was not proven (taken as its bound, or 0)
        return PipelinesBound(False, splits.solves, why=splits.unknown)
    if least < splits.limit:
        return PipelinesBound(False, splits.solves, split_below=least)
    return PipelinesBound(True, splits.solves)


class _Splits:
    """The recursion of P1 over (devices left as per-class node counts, samples left), with the
    one-pipeline optima of the sub-clusters cached."""

    def __init__(self, instance, sub_solve, clock, *, limit: float):
        self.instance, self.sub_solve, self.clock, self.limit = instance, sub_solve, clock, limit
        self.exact = idle_level(instance.search.idle) == "none"  # every device in some pipeline
        self.opt: dict = {}
        self.solves, self.unknown = 0, None

    def least(self, rem: tuple, samples: int, *, several: bool) -> float:
        """The least, over ways to run ``samples`` on the devices ``rem`` as one pipeline or (with
        ``several``, only) two or more, of the slowest pipeline's optimum; any value at or above
        ``limit`` stands for "at least the limit"."""
        best = math.inf if several else self.optimum(rem, samples)
        if best < self.limit:
            return best
        for first, rest in self._two_ways(rem):
            for s in range(1, samples):
                a = self.optimum(first, s)
                if a >= min(best, self.limit):
                    continue  # this split cannot go below what is known (or below the limit)
                b = self.least(rest, samples - s, several=False)
                best = min(best, max(a, b))
                if best < self.limit:
                    return best
        return best

    def _two_ways(self, rem: tuple):
        """Every (first pipeline's devices, the rest), both non-empty, each a per-class tuple of
        non-increasing node counts (a node's devices may go to both); with idle devices allowed the
        rest is all that is left, the pipelines after the first leaving idle what they do not use."""
        seen = set()
        per_class = [itertools.product(*(range(u + 1) for u in counts)) for counts in rem]
        for parts in itertools.product(*(list(p) for p in per_class)):
            first = tuple(tuple(sorted(part, reverse=True)) for part in parts)
            rest = tuple(tuple(sorted((u - v for u, v in zip(counts, part)), reverse=True))
                         for counts, part in zip(rem, parts))
            if not any(map(any, first)) or not any(map(any, rest)) or (first, rest) in seen:
                continue
            seen.add((first, rest))
            yield first, rest

    def optimum(self, key: tuple, samples: int) -> float:
        """A lower bound on every one-pipeline plan of the sub-cluster ``key`` at ``samples``: its
        proven optimum (or bound), +inf when proven infeasible, 0 when unknown."""
        if (key, samples) in self.opt:
            return self.opt[key, samples]
        if not any(map(any, key)):
            value = math.inf
        elif self.clock.out_of_time():
            self.unknown = self.unknown or self.clock.stopped_why()
            value = 0.0
        else:
            part = device_set(self.instance, key).instance
            sub = dataclasses.replace(part, training=dataclasses.replace(part.training, global_batch=samples))
            self.solves += 1
            value = self._solved(sub)
        self.opt[key, samples] = value
        return value

    def _solved(self, sub) -> float:
        try:
            result = self.sub_solve(sub, self.clock)
        except InfeasibleError:
            return math.inf  # proven: no plan of one pipeline fits
        except NoPlanFound as exc:
            self.unknown = self.unknown or "a sub-cluster's search stopped before it proved its bound"
            return exc.bound or 0.0
        within = [p for p in (result.solver.within or "").split("; ") if p and p != ONE_PIPELINE
                  and not (self.exact and p.startswith(WITHIN["none"]))]  # without idle devices: what P1 asks
        if within:  # the sub-search proved its bound over less than its whole space
            self.unknown = self.unknown or f"a sub-cluster was searched within {within[0]}"
            return 0.0
        return float(result.solver.bound)


def infeasible(instance, options, exc: InfeasibleError, clock, search) -> InfeasibleError:
    """An engine-amp_opt solve's infeasible verdict with P1 against no plan at all: every split
    leaves some pipeline a sub-cluster on which no plan fits, or the verdict says which plans of
    several pipelines are left."""
    proof = pipelines_bound(instance, options, math.inf, _sub(options, search), clock)
    if proof.ruled_out:
        said = "nor does any plan of several pipelines (P1: every split of the devices and batch leaves a pipeline " \
               "on which no plan fits)"
    else:
        said = f"plans of several pipelines not ruled out ({proof.why or 'P1: a split whose every pipeline fits alone'})"
    message = str(exc)
    return InfeasibleError(message.replace(SEVERAL_UNSEARCHED, said) if SEVERAL_UNSEARCHED in message
                           else f"{message} ({said})")


def _sub(options, search):
    """The one-pipeline search of a sub-cluster (helpers and extras off)."""
    sub_options = dataclasses.replace(options, top_k=1, per_candidate=False, pipelines="skip", progress=None,
                                      diagnose=False, carry=None, cutoff=math.inf, processes=1)
    return lambda sub, part: search(sub, sub_options, part)


def checked(instance, options, result, clock, search):
    """``result`` (an engine-amp_opt solve) with P1 applied: ``solver.within`` loses its
    one-pipeline part when no plan of several pipelines beats the K-th best plan, and
    ``solver.extra["pipelines"]`` says what P1 proved.  ``search(instance, options, clock)``: the
    solve's own search of one instance."""
    top = result.top
    value = top[options.top_k - 1].predicted_time if len(top) >= options.top_k else math.inf
    proof = pipelines_bound(instance, options, value, _sub(options, search), clock)
    within = result.solver.within
    if proof.ruled_out and within:
        within = "; ".join(p for p in within.split("; ") if p != ONE_PIPELINE) or None
    solver = dataclasses.replace(result.solver, within=within, extra={**result.solver.extra, "pipelines": proof.to_json()})
    return dataclasses.replace(result, solver=solver)
