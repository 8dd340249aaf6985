"""The terms every cost model prices, and the protocol a cost model implements.

Every cost model scores a plan with the same iteration-time formula
(``formulations/amp.md`` eq. A5, ``formulations/hetero.md`` eq. H6)::

    time = (n-1) max_s E_s + sum_s E_s + sum_s p2p_s + max_s AR_s

and differs in how the stage terms E_s, p2p_s and AR_s are computed.  A cost model
(:class:`CostModel`) turns a candidate (tp, dp, pp, micro-batch) on a placement (the
devices of every stage) into a :class:`StageCosts`, which computes the terms of any
stage for any layer range, vectorised, so that the evaluator, the partition DP and the
MIPs all read their numbers from one place; and it knows a lower bound on every plan of
a candidate.  Memory (eq. H5) does not depend on the placement: :class:`CandidateTerms`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..plan import Stages


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


class CandidateTerms:
    """What a candidate's stages need whatever their devices: micro-batches, parameters and
    bytes per device (eq. H5) of any layer range, and the p2p bytes after any layer."""

    def __init__(self, tables, cand):
        instance = tables.instance
        self.instance, self.cand = instance, cand
        self.tp, self.dp, self.pp, self.micro_batch = cand.tp, cand.dp, cand.pp, cand.micro_batch
        self.n_micro = cand.n_micro(instance)
        self.sums = tables.layer_sums(cand.tp)
        tr = instance.training
        optimizer = tr.optimizer_bytes / (cand.dp if tr.zero_stage >= 1 else 1)
        self.state_bytes_per_param = tr.weight_bytes + tr.gradient_bytes + optimizer
        self.volume = cand.micro_batch * self.sums.activation_bytes  # bytes sent after each layer

    def in_flight(self, s: int) -> int:
        """Micro-batches stage s keeps activations for under 1F1B."""
        return min(self.pp - s, self.n_micro)

    def memory(self, s: int, k, l):
        """Bytes per device of stage s for layers [k, l) under 1F1B (eq. H5)."""
        return (
            self.sums.params_in(k, l) * self.state_bytes_per_param
            + self.in_flight(s) * self.micro_batch * self.sums.activation_memory_in(k, l)
            + self.instance.training.memory_reserve
        )


@dataclass(frozen=True)
class StagePlacement:
    """What the cost of a stage depends on, derived from its device groups."""

    nodes: tuple[int, ...]  # node of each replica's group
    device_types: tuple[str, ...]  # sorted distinct types in the stage


class StageCosts:
    """The cost terms of one candidate on one placement.

    A cost model's subclass fills, in ``_price``: per stage the prefix sums of its compute
    classes' layer times (E_s is the slowest), the p2p bytes after each layer and the
    factor (seconds per byte) of each boundary, and the allreduce factor (seconds per
    parameter) of each stage.  Methods take layer ranges [k, l) as integers or
    broadcastable arrays.
    """

    def __init__(self, model, tables, cand, stages: Stages):
        instance = tables.instance
        self.model, self.tables, self.instance = model, tables, instance
        self.terms = CandidateTerms(tables, cand)
        self.tp, self.dp, self.pp, self.micro_batch = cand.tp, cand.dp, cand.pp, cand.micro_batch
        self.n_micro = self.terms.n_micro
        self.sums = self.terms.sums
        self.stages = stages
        self.estimated = False  # whether any compute time came from FLOPs
        node_of = instance.device_node
        self.placement = tuple(
            StagePlacement(
                nodes=tuple(int(node_of[group[0]]) for group in stage),
                device_types=tuple(sorted({instance.nodes[node_of[group[0]]].device_type for group in stage})),
            )
            for stage in stages
        )
        types = instance.device_types
        self.capacity = [min(types[t].memory for t in place.device_types) for place in self.placement]
        self._compute_prefixes: list[list[np.ndarray]] = []
        self._volume = self.terms.volume
        self._p2p_factor: list[float] = []
        self._allreduce_factor: list[float] = []
        self._price()

    def _price(self) -> None:  # pragma: no cover - every cost model defines it
        raise NotImplementedError

    def _layer_times(self, device_type: str, intra: float, micro_batch: int) -> np.ndarray:
        times = self.tables.layer_times(device_type, intra, self.tp, micro_batch)
        self.estimated |= times.estimated
        return times.seconds

    @property
    def enforces_memory(self) -> bool:
        return self.model.enforces_memory

    @property
    def state_bytes_per_param(self) -> float:
        return self.terms.state_bytes_per_param

    def in_flight(self, s: int) -> int:
        return self.terms.in_flight(s)

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
        """Bytes per device of stage s for layers [k, l) (eq. H5)."""
        return self.terms.memory(s, k, l)

    def fits(self, s: int, k, l):
        return self.memory(s, k, l) <= self.capacity[s]

    # -- per-layer coefficients, for the MIPs (sums of these are the terms above) ----
    def layer_times(self, s: int) -> list[np.ndarray]:
        """Per compute class present in stage s: seconds of each layer for one micro-batch."""
        return [np.diff(prefix) for prefix in self._compute_prefixes[s]]

    def p2p_volume(self) -> np.ndarray:
        """Per layer: what p2p_factor multiplies when a boundary follows the layer."""
        return self._volume

    def p2p_factor(self, s: int) -> float:
        return self._p2p_factor[s]

    def allreduce_factor(self, s: int) -> float:
        return self._allreduce_factor[s]


class CostModel:
    """The protocol of a cost model (a strategy): its name, whether it enforces memory, the
    placements it can price, its stage terms and its bound.

    ``placements`` lists the placements the model prices, the default first.
    ``stage_costs(tables, cand, stages)`` returns the :class:`StageCosts` of a candidate on
    a placement; ``lower_bound(tables, cand, labelled=...)`` a time no plan of the
    candidate beats (``inf`` when none fits).  A cheap ``labelled=False`` bound is enough for
    callers that refine it themselves.
    """

    name: str = ""
    description: str = ""
    enforces_memory: bool = True
    placements: tuple[str, ...] = ()

    def stage_costs(self, tables, cand, stages: Stages) -> StageCosts:  # pragma: no cover
        raise NotImplementedError

    def lower_bound(self, tables, cand, *, labelled: bool = True) -> float:  # pragma: no cover
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<cost model {self.name}>"
