"""One order of the blocks of the class-stage space R (``formulations/uneven-search.md``, S11 and
S13 in order): the least pipeline weight of each block's positions, and S11's programs over the
partitions of the layers into the stages in that order.  :class:`~.class_bounds.Bounds` builds
their tables from a configuration.
"""

from __future__ import annotations

import numpy as np

from ..model.ranges import INF, min_max_chain, min_sum_step, start_row, weighted


def block_weights(weights, stages) -> list[float]:
    """The least pipeline weight over each block's positions (blocks of ``stages`` stages in order):
    the stage of a block holding its slowest layer is weighed at least that much.

    >>> block_weights((10.0, 10.5, 11.0, 11.5), [1, 3])
    [10.0, 10.5]
    """
    starts = np.cumsum([0] + list(stages))
    return [min(weights[a:a + k]) for a, k in zip(starts, stages)]


GRID = 8  # thresholds of S11's parametric program: more is tighter and slower (each is one DP)


def partitioned(E, X, weights, fill: float, value: float = INF) -> float:
    """S11 over the partitions of L layers into the stages, in order: ``E[s]``, ``X[s]`` are
    (L+1, L+1) matrices of stage s's seconds and end holding layers [k, l) (+inf where it cannot).
    The larger of (a) min max_s w_s E_s + fill * min sum_s E_s + min max_s X_s, each over the
    partitions apart, and (b) the least of T + fill * S(T) over T, S(T) the least sum_s E_s with
    every w_s E_s + X_s at most T, taken on a grid of GRID steps from its least T up to
    ``value`` (or twice the least T): for T between two steps, T is at least the lower and S(T)
    at least S at the upper.  With a finite ``value`` the answer may be a weaker bound on the same
    side of ``value`` (the caller only compares): (a) alone where it reaches ``value``, (a) and
    the least T where some step goes below it.

    Examples
    --------
    Two layers of 1 s and 2 s, two stages of weight 3 and 2 and no end: one layer each, the
    slowest weighted stage 2 * 2 s, and 3 s in all.

    >>> E = np.array([[np.inf, 1.0, 3.0], [np.inf, np.inf, 2.0], [np.inf] * 3])
    >>> partitioned([E, E], [np.zeros((3, 3))] * 2, (3.0, 2.0), 1.0)
    7.0
    """
    L = E[0].shape[0] - 1
    heavy = [weighted(e, w) for w, e in zip(weights, E)]

    def least_sum(limit: float = INF) -> float:
        row = start_row(L)
        for we, e, x in zip(heavy, E, X):
            row = min_sum_step(row, e, None if limit == INF else we + x <= limit)
        return float(row[L])

    total = least_sum()
    if total == INF:
        return INF
    apart = min_max_chain(heavy) + fill * total + min_max_chain(X)
    if apart >= value:
        return apart  # at the caller's incumbent already
    low = min_max_chain([we + x for we, x in zip(heavy, X)])
    high = value if low < value < INF else 2 * low
    steps = [low + (high - low) * i / GRID for i in range(GRID + 1)]
    joint, known = steps[-1] + fill * total, total  # known: S at the lowest step priced so far (S falls as T rises)
    for i in range(GRID - 1, -1, -1):  # from the top: S(steps[i + 1]) >= known
        if steps[i] + fill * known >= joint:
            continue  # this step cannot lower the least
        known = least_sum(steps[i + 1])
        if known == INF:
            break  # no partition within steps[i + 1], nor within any lower step
        joint = min(joint, steps[i] + fill * known)
        if joint < value < INF:
            return max(apart, low)  # below the caller's incumbent: a weaker bound that says so too
    return max(apart, joint)
