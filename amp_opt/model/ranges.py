"""Layer ranges [k, l): the grid every per-range table is built on, and the DP kernel over it.

A stage runs a contiguous range of layers, so every stage term is a table indexed
``[k, l]`` for 0 <= k < l <= L, with ``inf`` (or ``False``) where k >= l.  The
kernel below is the one implementation of the two steps every DP of amp_opt
takes from one stage to the next over such tables, and of walking a DP's
back-pointers; the partition DP, the candidate bounds and the stage-kind DPs all
call it (``formulations/partition.md``).

* :func:`min_max_step` -- ``row[l] = min_k max(values[k], table[k, l])``
* :func:`min_sum_step` -- ``row[l] = min_k values[k] + table[k, l]``
* :func:`band_min_sum_step` -- the same over ranges stored by (end l, length - 1), up
  to the longest one a table allows (the stage-kind DPs' layout)
* :func:`min_max_chain` -- p stages of min-max steps: the least possible largest
  value of a table over partitions into p ranges, and a partition reaching it
* :func:`backtrack` -- from the last stage to the first, any DP's pointers
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Sequence

import numpy as np

INF = np.inf
BAND_GATHER = 1 << 17  # cells (rows x ends x lengths) up to which a banded step gathers them all at once


@dataclass(frozen=True)
class Grid:
    """Index arrays of every pair (k, l), shape (L+1, L+1).

    ``start``/``stop`` are k and l where the range is non-empty and (0, 1) elsewhere, so
    that a prefix-sum difference can be taken everywhere and masked afterwards.
    """

    k: np.ndarray
    l: np.ndarray
    nonempty: np.ndarray
    start: np.ndarray
    stop: np.ndarray


@lru_cache(maxsize=16)
def grid(num_layers: int) -> Grid:
    """The range grid of a model of ``num_layers`` layers (arrays are shared: do not write to them)."""
    k, l = np.meshgrid(np.arange(num_layers + 1), np.arange(num_layers + 1), indexing="ij")
    nonempty = k < l
    out = Grid(k, l, nonempty, np.where(nonempty, k, 0), np.where(nonempty, l, 1))
    for array in (out.k, out.l, out.nonempty, out.start, out.stop):
        array.flags.writeable = False
    return out


def range_table(per_layer: np.ndarray) -> np.ndarray:
    """Sums of ``per_layer`` over every range [k, l): (L+1, L+1), inf where k >= l.

    Examples
    --------
    >>> table = range_table(np.array([1.0, 2.0]))
    >>> float(table[0, 2]), float(table[1, 1])
    (3.0, inf)
    """
    prefix = np.concatenate([[0.0], np.cumsum(per_layer)])
    g = grid(len(per_layer))
    return np.where(g.nonempty, prefix[g.stop] - prefix[g.start], INF)


def stage_room(num_layers: int, stages: int, stage: int) -> np.ndarray:
    """Ranges stage ``stage`` of ``stages`` may take: non-empty and leaving a layer for every other stage."""
    g = grid(num_layers)
    return g.nonempty & (g.k >= stage) & (g.l <= num_layers - (stages - 1 - stage))


def min_max_step(values: np.ndarray, table: np.ndarray, feasible: np.ndarray | None = None, *,
                 arg: bool = False):
    """One stage of a min-max DP: ``row[l] = min_k max(values[k], table[k, l])`` over feasible ranges.

    ``values`` is (L+1,), the best value of ending the previous stage at k.  Returns the new
    row, and with ``arg`` also, per l, the k reaching it.
    """
    return _reduce(np.maximum(values[:, None], table), feasible, arg)


def min_sum_step(values: np.ndarray, table: np.ndarray, feasible: np.ndarray | None = None, *,
                 arg: bool = False):
    """One stage of a min-sum DP: ``row[l] = min_k values[k] + table[k, l]`` over feasible ranges."""
    return _reduce(values[:, None] + table, feasible, arg)


def band_min_sum_step(values: np.ndarray, arcs: np.ndarray, ends: slice, *,
                      origin: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """One min-sum stage over banded ranges: for every end l in ``ends``,
    ``row[..., l] = min_j values[..., l-1-j] + arcs[..., l, j]``, and the j reaching it.

    ``values[..., i]`` holds position ``origin + i`` (a window of the positions the previous
    stage can end at; positions before it count as ``inf``).

    ``arcs[..., l, j]`` is the cost of the range [l-1-j, l) (``inf`` where there is none);
    ``values`` (..., L+1) broadcasts against ``arcs`` (..., L+1, band).  Ties go to the
    shortest range, and an end no range reaches gets ``inf`` and j = 0, as an argmin over j
    would give.  Large steps go one length at a time over slices, so nothing of size (ends x
    band) is built (that array, and the gather that filled it, were most of the multiset DP's
    time); small ones gather every cell at once, which takes fewer numpy calls.

    Examples
    --------
    >>> values = np.array([0.0, 1.0, INF])
    >>> arcs = np.array([[INF, INF], [2.0, INF], [5.0, 2.5]])  # [l, length - 1]
    >>> row, width = band_min_sum_step(values, arcs, slice(1, 3))
    >>> row.tolist(), width.tolist()
    ([2.0, 2.5], [0, 1])
    """
    lo, hi = ends.start, ends.stop
    if lo - 1 < origin or hi - 1 - origin > values.shape[-1]:
        raise ValueError("band_min_sum_step: the ends need starts inside the window of values")
    band = arcs.shape[-1]
    if values.size // values.shape[-1] * (hi - lo) * band <= BAND_GATHER:
        # Small: one gather of every (end, length) cell, then one argmin (fewer numpy calls).
        index, inside = _band_index(lo, hi, band, origin)
        cand = values[..., index] + arcs[..., lo:hi, :]
        if inside is not None:  # a start before the window (arcs there may be finite) counts as inf
            cand = np.where(inside, cand, INF)
        return cand.min(axis=-1), cand.argmin(axis=-1).astype(np.int16)
    row = values[..., lo - 1 - origin:hi - 1 - origin] + arcs[..., lo:hi, 0]
    width = np.zeros(row.shape, dtype=np.int16)
    for j in range(1, band):
        first = max(lo, j + 1 + origin)  # the first end whose start l-1-j is in the window
        if first >= hi:
            break
        cand = values[..., first - 1 - j - origin:hi - 1 - j - origin] + arcs[..., first:hi, j]
        here = row[..., first - lo:]
        better = cand < here
        np.copyto(here, cand, where=better)
        width[..., first - lo:][better] = j
    return row, width


@lru_cache(maxsize=4096)
def _band_index(lo: int, hi: int, band: int, origin: int):
    """Where in a window from ``origin`` the range (end l, length j + 1) starts, for the ends
    [lo, hi), clipped to 0; and which of those starts lie in the window (None: all that are
    ranges at all, origin 0).  Shared arrays: do not write to them."""
    starts = np.arange(lo, hi)[:, None] - 1 - np.arange(band)[None, :] - origin
    inside = starts >= 0
    index = np.where(inside, starts, 0)
    index.flags.writeable = inside.flags.writeable = False
    return index, (inside if origin > 0 else None)


def _reduce(cand: np.ndarray, feasible, arg: bool):
    if feasible is not None:
        cand = np.where(feasible, cand, INF)
    return (cand.min(axis=0), cand.argmin(axis=0)) if arg else cand.min(axis=0)


def start_row(num_layers: int) -> np.ndarray:
    """The DP row before the first stage: position 0 reached at no cost, nothing else."""
    row = np.full(num_layers + 1, INF)
    row[0] = 0.0
    return row


def chain_window(num_layers: int, stages: int, stage: int) -> tuple[slice, slice]:
    """The ranges [k, l) stage ``stage`` of a partition into ``stages`` ranges can take, as the
    (k, l) slices of a range table: k in [s, L-p+s], l in [s+1, L-p+s+1] (a start outside it
    cannot lead to a partition of all L layers)."""
    width = num_layers - stages + 1
    return slice(stage, stage + width), slice(stage + 1, stage + 1 + width)


def min_max_chain(tables: Sequence[np.ndarray], feasible: Sequence[np.ndarray] | None = None,
                  *, weights: Sequence[float] | None = None, windowed: bool = False, with_path: bool = False):
    """min over partitions into ``len(tables)`` ranges of max_s tables[s][range s] (times
    ``weights[s]`` if given: each stage's table at its weight, :func:`weighted`, only over the
    window the stage can use).  With ``windowed`` each table (and mask) is already that window
    (:func:`chain_window`); ``tables[0]`` then needs L: the window is (L-p+1, L-p+1).

    Returns the value (inf if no partition is feasible) and, with ``with_path``, the p+1
    boundaries of a partition reaching it (None if there is none).

    Examples
    --------
    >>> t = range_table(np.array([3.0, 1.0, 1.0, 1.0]))
    >>> min_max_chain([t, t], with_path=True)
    (3.0, (0, 1, 4))
    """
    p = len(tables)
    L = tables[0].shape[-1] + p - 1 if windowed else tables[0].shape[-1] - 1
    if p > L:  # every range is non-empty: no partition
        return (INF, None) if with_path else INF
    # Only each stage's window of its table is read (chain_window).
    width = L - p + 1
    values, back = start_row(L)[:width], []
    for s, table in enumerate(tables):
        window = (slice(None), slice(None)) if windowed else chain_window(L, p, s)
        mask = None if feasible is None else feasible[s][window]
        part = table[window] if weights is None else weighted(table[window], weights[s])
        if with_path:
            values, arg = min_max_step(values, part, mask, arg=True)
            back.append(arg + s)
        else:
            values = min_max_step(values, part, mask)
    value = float(values[-1])  # position L, the window's last end
    if not with_path:
        return value
    if not np.isfinite(value):
        return value, None
    _, boundaries = backtrack(p, L, None, lambda s, state, end: (None, int(back[s][end - s - 1]), None))
    return value, boundaries


def backtrack(stages: int, end: int, state, step: Callable) -> tuple[tuple, tuple[int, ...]]:
    """Walk a DP's back-pointers from the last stage to the first.

    ``step(s, state, end)`` returns ``(choice, start, previous state)`` for stage s ending at
    ``end`` in ``state``.  Returns the choices and the p+1 boundaries, in stage order.
    """
    choices, boundaries = [], [end]
    for s in range(stages - 1, -1, -1):
        choice, start, state = step(s, state, end)
        choices.append(choice)
        boundaries.append(start)
        end = start
    return tuple(reversed(choices)), tuple(reversed(boundaries))


def weighted(table: np.ndarray, weight: float) -> np.ndarray:
    """``weight * table`` with inf kept inf (0 * inf would be nan): a range table at a stage's
    bottleneck weight.

    Examples
    --------
    >>> weighted(range_table(np.array([1.0, 2.0])), 0.0)[0, 2], weighted(range_table(np.array([1.0])), 2.0)[0, 1]
    (np.float64(0.0), np.float64(2.0))
    """
    if 0.0 < weight < INF:  # inf * weight stays inf: one pass (the tables hold no nan or -inf)
        return table * weight
    finite = np.isfinite(table)
    return np.where(finite, np.where(finite, table, 0.0) * weight, INF)
