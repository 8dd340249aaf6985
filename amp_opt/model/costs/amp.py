"""The ``amp`` cost model: AMP's reference model, reproduced exactly (``formulations/amp.md``).

One compute profile blended over the cluster's device types for every stage (A1),
p2p volumes counted as fp32 elements and averaged over replicas (A2), AMP's allreduce
link between the last and the first replica (A4); memory is not enforced.  AMP prices
its rank order only.
"""

from __future__ import annotations

import numpy as np

from ...errors import InputError
from ..ranges import min_max_chain, range_table
from .contract import CostModel
from .stage_costs import StageCosts

AMP_WIRE_BYTES = 4.0  # AMP counts volumes in elements and charges each as fp32


def blended_times(tables, tp: int, micro_batch: int) -> tuple[np.ndarray, bool]:
    """Eq. A1: per-layer seconds of one micro-batch, blended over device classes weighted by
    device count (measured at micro-batch 1, scaled linearly); and whether any was estimated."""
    inst = tables.instance
    weights: dict[tuple[str, float], int] = {}
    for node in inst.nodes:
        key = (node.device_type, node.intra_bandwidth)
        weights[key] = weights.get(key, 0) + node.devices
    blended, estimated = np.zeros(inst.num_layers), False
    for (dtype, intra), count in weights.items():
        times = tables.layer_times(dtype, intra, tp, 1)
        estimated |= times.estimated
        blended += count / inst.num_devices * times.seconds
    return micro_batch * blended, estimated


class AmpCosts(StageCosts):
    """Stage terms of the amp model."""

    def _price(self) -> None:
        inst, m, d = self.instance, self.tp, self.dp
        blended, self.estimated = blended_times(self.tables, m, self.micro_batch)
        prefix = np.concatenate([[0.0], np.cumsum(blended)])
        self._compute_prefixes = [[(prefix, prefix, 0.0)]] * self.pp
        # A2: p2p volume as fp32 elements; the link factor is averaged over replicas.
        self._volume = self._volume * (AMP_WIRE_BYTES / inst.training.activation_element_bytes)
        link = inst.link_bandwidth
        stages = self.stages
        self._p2p_factor = [
            float(np.mean([1.0 / min(link(a, b) for a, b in zip(stages[s][k], stages[s + 1][k])) for k in range(d)]))
            for s in range(self.pp - 1)
        ] + [0.0]
        # A4: AMP's allreduce looks at the link between the last and the first replica only.
        self._allreduce_factor = [
            max(2 * (d - 1) / (d * link(stages[s][d - 1][j], stages[s][0][j])) for j in range(m)) * AMP_WIRE_BYTES
            for s in range(self.pp)
        ]


class AmpModel(CostModel):
    name = "amp"
    description = "the AMP paper's reference model: one blended profile, AMP's links, memory not enforced"
    enforces_memory = False
    placements = ("rank-order",)
    idle = False  # the blended profile (A1) averages over every device of the cluster

    def prices(self, cand) -> bool:
        """AMP's model knows the strategy space of 2022: no context or sequence parallelism,
        no recomputation, no interleaving (ZeRO only changes the memory it does not enforce)."""
        return (cand.cp == 1 and not cand.sequence_parallel and cand.recompute == "none"
                and cand.virtual_stages == 1)

    def stage_costs(self, tables, cand, stages, *, chunks=None, modes=None) -> AmpCosts:
        if not self.prices(cand) or (modes is not None and set(modes) != {"none"}):
            raise InputError("plan", "the amp cost model prices tp, dp, pp and micro-batch only (no cp, "
                                     "sequence parallelism, recomputation or virtual stages): use --cost-model hetero")
        return AmpCosts(self, tables, cand, stages)

    def lower_bound(self, tables, cand, *, labelled: bool = True, enough: float = np.inf) -> float:
        """Eq. B1: every stage runs the blended profile; the bottleneck is at least its exact
        min-max partition into p stages, the fill/drain at least the whole model's time
        (cheap: computed whole whatever ``enough``)."""
        blended, _ = blended_times(tables, cand.tp, cand.micro_batch)
        n = cand.n_micro(tables.instance)
        return (n - 1) * min_max_chain([range_table(blended)] * cand.pp) + float(blended.sum())


AMP = AmpModel()
