"""Disjoint windows of consecutive layers, one per block: the least work they force (S13).

In a configuration of the class-stage space each block's k stages are consecutive, so the block
holds one run of consecutive layers, at least k of them, and the runs of different blocks are
disjoint (``formulations/uneven-search.md``, S13).  Whatever the order of the blocks, each run
contains a window of exactly k consecutive layers, and those windows are pairwise disjoint; the
least over every family of such windows of what they cost is therefore a bound.
:func:`disjoint_windows` computes it by a DP over the subsets of blocks.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..model.ranges import INF

# Blocks beyond which the DP over their subsets gives way to each block's own least window (a weaker
# bound, still valid): the DP takes C 2^(C-1) vector steps, 1024 at 8 blocks, and grows twice as fast
# as the blocks; a configuration of R has one block per node class it uses.
MAX_EXACT = 8


def window_values(values: np.ndarray, length: int, *, worst: bool = False) -> np.ndarray:
    """Per start i, the sum (``worst``: the largest) of ``values[i:i + length]``."""
    if worst:
        return np.lib.stride_tricks.sliding_window_view(values, length).max(axis=1)
    prefix = np.concatenate([[0.0], np.cumsum(values)])
    return prefix[length:] - prefix[:-length]


def disjoint_windows(values: Sequence[np.ndarray], lengths: Sequence[int], *, worst: bool = False,
                     in_order: bool = False) -> float:
    """The least, over families of pairwise disjoint windows (row b's window: ``lengths[b]``
    consecutive positions of ``values[b]``; with ``in_order``, each row's window after the one of the
    row before), of the sum over the rows of their window's sum, or with ``worst`` of the largest
    over the rows of their window's largest value; INF where the windows do not fit.  Past
    MAX_EXACT rows in any order, each row's own least window (windows may overlap: a weaker bound).

    Examples
    --------
    Both rows are cheapest on the first two positions, but their windows may not overlap:

    >>> disjoint_windows([np.array([0.0, 1.0, 5.0, 5.0]), np.array([0.0, 1.0, 2.0, 9.0])], [2, 1])
    3.0
    >>> disjoint_windows([np.array([0.0, 1.0, 5.0, 5.0]), np.array([0.0, 1.0, 2.0, 9.0])], [2, 1], worst=True)
    2.0
    """
    L, C = len(values[0]), len(values)
    if sum(lengths) > L:
        return INF
    windows = [window_values(np.asarray(v, dtype=float), k, worst=worst) for v, k in zip(values, lengths)]
    if in_order:  # a chain: the least cost of rows 0..j's windows within the first e positions
        best = np.zeros(L + 1) if not worst else np.full(L + 1, -INF)
        for k, window in zip(lengths, windows):
            ends = np.full(L + 1, INF)
            ends[k:] = np.maximum(best[:L - k + 1], window) if worst else best[:L - k + 1] + window
            best = np.minimum.accumulate(ends)
        return float(best[L])
    if C > MAX_EXACT:
        least = [float(w.min()) for w in windows]
        return max(least) if worst else sum(least)
    # best[S][e]: the least cost of the windows of the rows in S, all within positions [0, e).
    best = {0: np.zeros(L + 1) if not worst else np.full(L + 1, -INF)}
    for S in range(1, 1 << C):  # every S - {b} is a smaller number: solved before S
        ends = np.full(L + 1, INF)
        for b in (b for b in range(C) if S >> b & 1):
            k, rest = lengths[b], best[S ^ (1 << b)]
            step = np.maximum(rest[:L - k + 1], windows[b]) if worst else rest[:L - k + 1] + windows[b]
            ends[k:] = np.minimum(ends[k:], step)
        best[S] = np.minimum.accumulate(ends)
    return float(best[(1 << C) - 1][L])
