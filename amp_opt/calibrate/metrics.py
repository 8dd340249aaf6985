"""How well predictions match measurements: relative errors and rank correlation."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np


def ranks(values: Sequence[float]) -> np.ndarray:
    """Ranks 1..n of the values, ties sharing their average rank.

    Examples
    --------
    >>> ranks([0.3, 0.1, 0.3, 0.2]).tolist()
    [3.5, 1.0, 3.5, 2.0]
    """
    values = np.asarray(values, dtype=float)
    order = np.argsort(values, kind="stable")
    out = np.empty(len(values))
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[order[j + 1]] == values[order[i]]:
            j += 1
        out[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman's rank correlation (Pearson's of the ranks, ties averaged); None when undefined
    (fewer than two values, or one side constant).

    Examples
    --------
    >>> spearman([1, 2, 3, 4], [10, 20, 40, 30])
    0.8
    >>> spearman([1, 1], [1, 2]) is None
    True
    """
    if len(a) != len(b):
        raise ValueError("spearman needs two sequences of one length")
    if len(a) < 2:
        return None
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = math.sqrt(float(ra @ ra) * float(rb @ rb))
    return None if den == 0 else round(float(ra @ rb) / den, 12)


@dataclass(frozen=True)
class Errors:
    """Predicted against measured over a set of runs.

    ``median_abs_error`` and ``max_abs_error`` are of ``predicted / measured - 1``;
    ``rms_log_error`` is the root mean square of ``log(predicted / measured)`` (what the
    fit minimises); ``spearman`` the rank correlation (None when undefined).
    """

    count: int
    median_abs_error: float
    max_abs_error: float
    rms_log_error: float
    spearman: float | None

    def to_json(self) -> dict:
        return {"runs": self.count, "median_abs_error": self.median_abs_error, "max_abs_error": self.max_abs_error,
                "rms_log_error": self.rms_log_error, "spearman": self.spearman}


def errors(predicted: Sequence[float], measured: Sequence[float]) -> Errors:
    """The :class:`Errors` of predictions against measurements (positive numbers, same order).

    Examples
    --------
    >>> e = errors([1.1, 2.0, 2.7], [1.0, 2.0, 3.0])
    >>> round(e.median_abs_error, 3), round(e.max_abs_error, 3), e.spearman
    (0.1, 0.1, 1.0)
    """
    p, m = np.asarray(predicted, dtype=float), np.asarray(measured, dtype=float)
    if len(p) == 0:
        return Errors(0, math.nan, math.nan, math.nan, None)
    rel = np.abs(p / m - 1)
    return Errors(len(p), float(np.median(rel)), float(rel.max()), float(np.sqrt(np.mean(np.log(p / m) ** 2))),
                  spearman(p, m))
