"""The iteration-time formula every cost model uses: weights of a weighted maximum plus sums.

``time = max_s c_s E_s + (1/v) sum_s E_s + r sum_s P_s + max_s AR_s`` with the weights of AMP's
closed form (``formulations/amp.md`` eq. A5, ``formulations/hetero.md`` H6, H11) or of the 1F1B
schedule (H13).  Pure arithmetic on per-stage terms, shared by the evaluator, the DP and the MIPs.
"""

from __future__ import annotations

from dataclasses import dataclass

FORWARD_SHARE = 1.0 / 3.0  # a layer's forward share of its forward+backward time (backward = 2 forward)
BACKWARD_SHARE = 1.0 - FORWARD_SHARE  # the share a gradient reduction can overlap (H18)

SCHEDULES = ("closed", "1f1b")  # the iteration-time formulas a cost model may use


@dataclass(frozen=True)
class Pipeline:
    """The weights of the iteration-time formula of one candidate::

        time = max_s bottleneck[s] E_s + (1/v) sum_s E_s + p2p sum_s P_s + max_s AR_s

    ``bottleneck`` has one weight per stage (all n - 1/v in the closed form, eq. H6/H11; by
    position under 1F1B, eq. H13), ``p2p`` weighs the boundary transfers (1, or 2 when the
    first micro-batch's round trip is counted both ways, H13).
    """

    bottleneck: tuple[float, ...]
    virtual: int = 1
    p2p: float = 1.0

    @property
    def fill(self) -> float:
        """The weight of each stage's compute in the sum."""
        return 1 / self.virtual

    @property
    def least(self) -> float:
        """The smallest bottleneck weight: least * max_s E_s bounds the weighted maximum from below."""
        return min(self.bottleneck)

    def time(self, compute, p2p, allreduce) -> float:
        """Seconds per iteration from the per-stage terms (``p2p[s]``: boundary s to s+1)."""
        lead = max(w * e for w, e in zip(self.bottleneck, compute))
        return float(lead + sum(compute) / self.virtual + self.p2p * sum(p2p) + max(allreduce))


def pipeline_weights(n_micro: int, pp: int, virtual_stages: int = 1, schedule: str = "closed") -> Pipeline:
    """The weights of a candidate's iteration time under a schedule model (``SCHEDULES``).

    ``"closed"``: AMP's closed form, every stage weighed n - 1/v (eq. A5, H6, H11).  ``"1f1b"``
    (eq. H13, non-interleaved only; with v > 1 the closed form H11): stage s is weighed
    (n-1) B + max(n - w_s - 1, 0) F with F = 1/3, B = 2/3 its forward and backward shares and
    w_s = min(p-s-1, n) its warm-up forwards, and each boundary is crossed twice.

    Examples
    --------
    >>> pipeline_weights(4, 2, schedule="closed").bottleneck
    (3.0, 3.0)
    >>> [round(w, 4) for w in pipeline_weights(4, 2, schedule="1f1b").bottleneck]
    [2.6667, 3.0]
    """
    n, v = n_micro, virtual_stages
    if schedule == "closed" or v > 1:
        return Pipeline((n - 1 / v,) * pp, v)
    if schedule != "1f1b":
        raise ValueError(f"unknown schedule {schedule!r} (choose from {', '.join(SCHEDULES)})")
    # (n-1) B + max(n - w - 1, 0) F = (n-1) - min(w, n-1) F: exactly n - 1 on the last stage.
    weights = tuple((n - 1) - min(pp - s - 1, n - 1) * FORWARD_SHARE for s in range(pp))
    return Pipeline(weights, 1, 2.0)


def iteration_time(n_micro: int, compute, p2p, allreduce, virtual_stages: int = 1, schedule: str = "closed") -> float:
    """Seconds per iteration from the per-stage terms: eq. A5 / H6 (H11 with interleaving), or
    H13 under the 1F1B schedule model."""
    return pipeline_weights(n_micro, len(compute), virtual_stages, schedule).time(compute, p2p, allreduce)
