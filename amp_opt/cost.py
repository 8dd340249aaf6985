"""The cost models and the one evaluator.

Both cost models score a plan with the same iteration-time formula
(``formulations/amp.md`` eq. A5, ``formulations/hetero.md`` eq. H6)::

    time = (n-1) max_s E_s + sum_s E_s + sum_s p2p_s + max_s AR_s

and differ in how the stage terms are computed:

* ``amp`` -- AMP's reference model (``formulations/amp.md``): one blended
  compute profile for every stage, p2p averaged over replicas, AMP's
  allreduce link, volumes counted as fp32 elements; memory is not enforced.
* ``hetero`` -- each stage runs at its slowest replica's device speed, links
  are the slowest one a stage uses, and every device must fit its memory.

:class:`StageCosts` computes the terms of any stage for any layer range
(vectorised), so that the evaluator, the partition DP and the MIPs all read
their numbers from one place.  :func:`evaluate` is the one function that
scores a plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import InputError
from .plan import Plan, Stages, check_plan
from .profiles import layer_times

COST_MODELS = ("hetero", "amp")
AMP_WIRE_BYTES = 4.0  # AMP counts volumes in elements and charges each as fp32


def check_cost_model(name: str) -> str:
    if name not in COST_MODELS:
        raise InputError("--cost-model", f"unknown cost model {name!r} (choose from {', '.join(COST_MODELS)})")
    return name


def iteration_time(n_micro: int, compute, p2p, allreduce) -> float:
    """Eq. A5 / H6: seconds per iteration from the per-stage terms."""
    return float((n_micro - 1) * max(compute) + sum(compute) + sum(p2p) + max(allreduce))


def hetero_link(instance, nodes) -> float:
    """The hetero model's link rule (eq. H3, H4): intra-node bandwidth when every
    group sits in one node, else the slowest inter-node link among the nodes."""
    used = set(nodes)
    if len(used) == 1:
        return instance.nodes[next(iter(used))].intra_bandwidth
    return min(instance.nodes[j].inter_bandwidth for j in used)


def allreduce_factor(instance, dp: int, bandwidth: float) -> float:
    """Seconds per parameter (per rank) of a ring allreduce over dp replicas (eq. H4)."""
    return 2 * (dp - 1) / dp * instance.training.allreduce_bytes_per_param / bandwidth


class LayerSums:
    """Per-rank layer quantities at one tp degree, summed over any range [k, l)."""

    def __init__(self, instance, tp: int):
        layers = instance.layers
        self.params = np.array([layer.params.at(tp) for layer in layers])
        self.activation_bytes = np.array([layer.activation_bytes.at(tp) for layer in layers])
        self.activation_memory = np.array([layer.activation_memory_bytes.at(tp) for layer in layers])
        self._params_prefix = np.concatenate([[0.0], np.cumsum(self.params)])
        self._act_mem_prefix = np.concatenate([[0.0], np.cumsum(self.activation_memory)])
        # A tie group's shared tensor is held once per stage: per rank, the smallest
        # member's declared shared count (default: its whole params) split over tp.
        groups: dict[str, list[int]] = {}
        for i, layer in enumerate(layers):
            if layer.tie is not None:
                groups.setdefault(layer.tie, []).append(i)
        self._ties = []
        for members in groups.values():
            if len(members) > 1:
                shared = min(
                    layers[i].tied_params / tp if layers[i].tied_params is not None else self.params[i] for i in members
                )
                self._ties.append((np.array(members), min(shared, *(self.params[i] for i in members))))

    @classmethod
    def of(cls, instance, tp: int) -> "LayerSums":
        key = ("layer_sums", tp)
        if key not in instance.memo:
            instance.memo[key] = cls(instance, tp)
        return instance.memo[key]

    @property
    def ties(self) -> list[tuple[np.ndarray, float]]:
        """(member layers, per-rank shared parameters) of every tie group."""
        return self._ties

    def params_in(self, k, l):
        """Parameters per rank held by a stage of layers [k, l); tied tensors once."""
        k, l = np.asarray(k), np.asarray(l)
        total = self._params_prefix[l] - self._params_prefix[k]
        for members, shared in self._ties:
            inside = ((k[..., None] <= members) & (members < l[..., None])).sum(axis=-1)
            total = total - np.maximum(inside - 1, 0) * shared
        return total

    def activation_memory_in(self, k, l):
        return self._act_mem_prefix[np.asarray(l)] - self._act_mem_prefix[np.asarray(k)]


@dataclass(frozen=True)
class StagePlacement:
    """What the cost of a stage depends on, derived from its device groups."""

    nodes: tuple[int, ...]  # node of each replica's group
    device_types: tuple[str, ...]  # sorted distinct types in the stage


class StageCosts:
    """The cost terms of one candidate (tp, dp, pp, micro-batch) on one placement.

    Methods take layer ranges [k, l) as integers or broadcastable arrays.
    """

    def __init__(self, instance, cost_model: str, tp: int, dp: int, pp: int, micro_batch: int, stages: Stages):
        self.instance = instance
        self.cost_model = check_cost_model(cost_model)
        self.tp, self.dp, self.pp, self.micro_batch = tp, dp, pp, micro_batch
        self.n_micro = instance.training.global_batch // (dp * micro_batch)
        self.stages = stages
        self.sums = LayerSums.of(instance, tp)
        self.estimated = False  # whether any compute time came from FLOPs
        node_of = instance.device_node
        self.placement = tuple(
            StagePlacement(
                nodes=tuple(int(node_of[group[0]]) for group in stage),
                device_types=tuple(sorted({instance.nodes[node_of[group[0]]].device_type for group in stage})),
            )
            for stage in stages
        )
        if cost_model == "amp":
            self._init_amp()
        else:
            self._init_hetero()
        self._init_memory()

    # -- amp (formulations/amp.md) ------------------------------------------
    def _init_amp(self):
        inst, m, d = self.instance, self.tp, self.dp
        # A1: one profile blended over device classes, weighted by device count, times mbs.
        weights: dict[tuple[str, float], int] = {}
        for node in inst.nodes:
            key = (node.device_type, node.intra_bandwidth)
            weights[key] = weights.get(key, 0) + node.devices
        blended = np.zeros(inst.num_layers)
        for (dtype, intra), count in weights.items():
            times = layer_times(inst, dtype, intra, m, 1)
            self.estimated |= times.estimated
            blended += count / inst.num_devices * times.seconds
        prefix = np.concatenate([[0.0], np.cumsum(self.micro_batch * blended)])
        self._compute_prefixes = [[prefix]] * self.pp
        # A2: p2p volume as fp32 elements; the link factor is averaged over replicas.
        scale = AMP_WIRE_BYTES / inst.training.activation_element_bytes
        self._volume = self.micro_batch * self.sums.activation_bytes * scale
        link = inst.link_bandwidth
        self._p2p_factor = [
            float(np.mean([1.0 / min(link(a, b) for a, b in zip(self.stages[s][k], self.stages[s + 1][k])) for k in range(d)]))
            for s in range(self.pp - 1)
        ] + [0.0]
        # A4: AMP's allreduce looks at the link between the last and the first replica only.
        self._allreduce_factor = [
            max(2 * (d - 1) / (d * link(self.stages[s][d - 1][j], self.stages[s][0][j])) for j in range(m)) * AMP_WIRE_BYTES
            for s in range(self.pp)
        ]

    # -- hetero (formulations/hetero.md) --------------------------------------
    def _init_hetero(self):
        inst, m, d, b = self.instance, self.tp, self.dp, self.micro_batch
        nodes = inst.nodes
        self._compute_prefixes = []
        for place in self.placement:
            prefixes = []
            for key in sorted({(nodes[j].device_type, nodes[j].intra_bandwidth) for j in place.nodes}):
                times = layer_times(inst, key[0], key[1], m, b)
                self.estimated |= times.estimated
                prefixes.append(np.concatenate([[0.0], np.cumsum(times.seconds)]))
            self._compute_prefixes.append(prefixes)
        # H3: one micro-batch's boundary activation over the slowest link of the two stages.
        self._volume = b * self.sums.activation_bytes
        self._p2p_factor = [1.0 / self.boundary_bandwidth(s) for s in range(self.pp - 1)] + [0.0]
        # H4: ring allreduce of the stage's gradients over its slowest link.
        self._allreduce_factor = [allreduce_factor(inst, d, self.ring_bandwidth(s)) for s in range(self.pp)]

    def ring_bandwidth(self, s: int) -> float:
        """Bytes/s of stage s's data-parallel ring (eq. H4)."""
        return hetero_link(self.instance, self.placement[s].nodes)

    def boundary_bandwidth(self, s: int) -> float:
        """Bytes/s between stage s and s+1 (eq. H3)."""
        return hetero_link(self.instance, self.placement[s].nodes + self.placement[s + 1].nodes)

    def p2p_volume(self) -> np.ndarray:
        """Per layer: what p2p_factor multiplies when a boundary follows the layer."""
        return self._volume

    def p2p_factor(self, s: int) -> float:
        return self._p2p_factor[s]

    # -- memory (both models; only hetero enforces it) ------------------------
    def _init_memory(self):
        tr = self.instance.training
        optimizer = tr.optimizer_bytes / (self.dp if tr.zero_stage >= 1 else 1)
        self._state_per_param = tr.weight_bytes + tr.gradient_bytes + optimizer
        types = self.instance.device_types
        self.capacity = [min(types[t].memory for t in place.device_types) for place in self.placement]

    # -- the terms ----------------------------------------------------------
    def compute(self, s: int, k, l):
        """E_s: seconds of one micro-batch through layers [k, l) on stage s (slowest replica)."""
        k, l = np.asarray(k), np.asarray(l)
        prefixes = self._compute_prefixes[s]
        out = prefixes[0][l] - prefixes[0][k]
        for prefix in prefixes[1:]:
            out = np.maximum(out, prefix[l] - prefix[k])
        return out

    def p2p(self, s: int, l):
        """Seconds to send one micro-batch from stage s (ending before layer l) to s+1."""
        return self._volume[np.asarray(l) - 1] * self._p2p_factor[s]

    def allreduce(self, s: int, k, l):
        """Seconds of stage s's gradient allreduce for layers [k, l)."""
        return self.sums.params_in(k, l) * self._allreduce_factor[s]

    def memory(self, s: int, k, l):
        """Bytes per device of stage s for layers [k, l) under 1F1B (eq. H5)."""
        return (
            self.sums.params_in(k, l) * self._state_per_param
            + self.in_flight(s) * self.micro_batch * self.sums.activation_memory_in(k, l)
            + self.instance.training.memory_reserve
        )

    # -- per-layer coefficients, for the MIPs (sums of these are the terms above) ----
    def layer_times(self, s: int) -> list[np.ndarray]:
        """Per compute class present in stage s: seconds of each layer for one micro-batch."""
        return [np.diff(prefix) for prefix in self._compute_prefixes[s]]

    def allreduce_factor(self, s: int) -> float:
        return self._allreduce_factor[s]

    @property
    def state_bytes_per_param(self) -> float:
        return self._state_per_param

    def in_flight(self, s: int) -> int:
        """Micro-batches stage s keeps activations for under 1F1B."""
        return min(self.pp - s, self.n_micro)

    def fits(self, s: int, k, l):
        return self.memory(s, k, l) <= self.capacity[s]

    @property
    def enforces_memory(self) -> bool:
        return self.cost_model == "hetero"


# ---------------------------------------------------------------------------
# The evaluator


@dataclass(frozen=True)
class StageReport:
    index: int
    layers: tuple[int, int]  # [start, stop)
    groups: tuple[tuple[int, ...], ...]
    device_types: tuple[str, ...]
    nodes: tuple[str, ...]
    compute: float
    p2p: float
    allreduce: float
    memory: float  # bytes per device
    capacity: float  # bytes, the smallest device type in the stage
    fits: bool

    def to_json(self, instance) -> dict[str, Any]:
        a, b = self.layers
        return {
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
        }


@dataclass(frozen=True)
class Evaluation:
    """A plan's score under one cost model, with every term that makes it up."""

    plan: Plan
    cost_model: str
    predicted_time: float  # seconds per iteration
    feasible: bool
    breakdown: dict[str, float]
    n_micro: int
    stages: tuple[StageReport, ...]
    violations: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    def to_json(self, instance) -> dict[str, Any]:
        return {
            "plan": self.plan.to_json(),
            "cost_model": self.cost_model,
            "predicted_time": self.predicted_time,
            "feasible": self.feasible,
            "breakdown": dict(self.breakdown),
            "micro_batches_per_iteration": self.n_micro,
            "stages": [s.to_json(instance) for s in self.stages],
            "violations": list(self.violations),
            "notes": list(self.notes),
        }


def stage_costs(instance, plan: Plan, cost_model: str) -> StageCosts:
    """The StageCosts of a checked plan (explicit stages)."""
    return StageCosts(instance, cost_model, plan.tp, plan.dp, plan.pp, plan.micro_batch, plan.stages)


def evaluate(instance, plan: Plan, cost_model: str = "hetero") -> Evaluation:
    """Score a plan: predicted seconds per iteration, feasibility and the breakdown.

    Parameters
    ----------
    instance : Instance
    plan : Plan
        Validated against the instance here (missing ``stages`` means rank order).
    cost_model : "hetero" or "amp"

    Returns
    -------
    Evaluation
    """
    check_cost_model(cost_model)
    plan = check_plan(instance, plan)
    costs = stage_costs(instance, plan, cost_model)
    bounds = plan.partition
    reports = []
    compute, p2p, allreduce = [], [], []
    for s in range(plan.pp):
        k, l = bounds[s], bounds[s + 1]
        e, c, a = float(costs.compute(s, k, l)), float(costs.p2p(s, l)), float(costs.allreduce(s, k, l))
        mem = float(costs.memory(s, k, l))
        compute.append(e)
        p2p.append(c)
        allreduce.append(a)
        place = costs.placement[s]
        reports.append(
            StageReport(
                index=s,
                layers=(k, l),
                groups=plan.stages[s],
                device_types=place.device_types,
                nodes=tuple(dict.fromkeys(instance.nodes[j].name for j in place.nodes)),
                compute=e,
                p2p=c,
                allreduce=a,
                memory=mem,
                capacity=costs.capacity[s],
                fits=mem <= costs.capacity[s],
            )
        )
    n = costs.n_micro
    breakdown = {
        "pipeline_bottleneck": (n - 1) * max(compute),
        "stage_compute": sum(compute),
        "p2p": sum(p2p),
        "allreduce": max(allreduce),
    }
    total = iteration_time(n, compute, p2p, allreduce)
    over = [r for r in reports if not r.fits]
    violations = tuple(
        f"stage {r.index} ({', '.join(r.device_types)}) needs {r.memory / 2**30:.2f} GiB per device, "
        f"capacity {r.capacity / 2**30:.2f} GiB"
        for r in over
    )
    notes = []
    if costs.estimated:
        notes.append("some compute times were estimated from FLOPs (no measured profile for a device type at this tp degree)")
    if not costs.enforces_memory and over:
        notes.append("the amp cost model does not enforce memory; the plan would not fit: " + "; ".join(violations))
    feasible = not over if costs.enforces_memory else True
    return Evaluation(
        plan=plan,
        cost_model=cost_model,
        predicted_time=total,
        feasible=feasible,
        breakdown=breakdown,
        n_micro=n,
        stages=tuple(reports),
        violations=violations if costs.enforces_memory else (),
        notes=tuple(notes),
    )
