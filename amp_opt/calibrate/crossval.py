"""How many parameters a fit keeps, chosen on runs it did not see (``formulations/calibration.md``, F8).

The runs are split into groups (the instance each ran on: one cluster and model); each
fold holds one group out (leave one cluster or model out), or, with a single group, every
K-th run (K = min(5, runs)).  For k = 0, 1, ... the first k parameters of the full fit's
order are refitted on the other folds and the held-out runs predicted.  k is the one with
the smallest held-out RMS log error among those whose held-out ranking (Spearman within
each group, each fold's model on the runs it held out) is no worse than the uncalibrated
model's in any group; k = 0, the uncalibrated model, always qualifies.  Deterministic: fixed folds, fixed order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from .metrics import Errors, errors, spearman

MAX_FOLDS = 5  # folds of a single group
MIN_RUNS = 3  # fewer runs: nothing to hold out


def folds(groups: Sequence[str]) -> list[np.ndarray] | None:
    """Indices held out by each fold: one group each when there are several groups, else every
    K-th run (K = min(5, runs)); None with fewer than three runs.

    Examples
    --------
    >>> [f.tolist() for f in folds(["a", "b", "a", "c"])]
    [[0, 2], [1], [3]]
    >>> [f.tolist() for f in folds(["a"] * 7)]
    [[0, 5], [1, 6], [2], [3], [4]]
    """
    n = len(groups)
    if n < MIN_RUNS:
        return None
    names = list(dict.fromkeys(groups))
    if len(names) > 1:
        return [np.array([i for i, g in enumerate(groups) if g == name]) for name in names]
    k = min(MAX_FOLDS, n)
    return [np.arange(f, n, k) for f in range(k)]


def within(values, measured, cells) -> list[float | None]:
    """Per cell (indices of runs one fold held out of one group), Spearman's rank correlation of
    the values with the measurements (None where undefined)."""
    return [spearman(values[c], measured[c]) if len(c) > 1 else None for c in cells]


def cells_of(split: Sequence[np.ndarray], groups: Sequence[str]) -> dict[str, list[np.ndarray]]:
    """Per group, the runs each fold holds out of it (a fold's model ranks only its own runs)."""
    out: dict[str, list[np.ndarray]] = {}
    for name in dict.fromkeys(groups):
        for test in split:
            cell = np.array([i for i in test if groups[i] == name], dtype=int)
            if len(cell):
                out.setdefault(name, []).append(cell)
    return out


def rank_no_worse(held: np.ndarray, before: np.ndarray, measured: np.ndarray,
                  cells: dict[str, list[np.ndarray]]) -> bool:
    """Whether, in every group, the held-out ranking is at least the uncalibrated model's: the mean
    over the group's cells of Spearman's rank correlation with the measurements (each cell ranked
    by the one fold model that did not see it; with one group out per fold, a group is one cell).
    Cells where the uncalibrated correlation is undefined are not judged; one lost counts as -1."""
    for group_cells in cells.values():
        old, new = within(before, measured, group_cells), within(held, measured, group_cells)
        judged = [(a, -1.0 if b is None else b) for a, b in zip(old, new) if a is not None]
        if judged and np.mean([b for _, b in judged]) < np.mean([a for a, _ in judged]) - 1e-12:
            return False
    return True


@dataclass(frozen=True)
class GroupErrors:
    """One group's runs: uncalibrated, in-sample calibrated and held-out errors (with Spearman)."""

    group: str
    runs: tuple[int, ...]  # indices in RUNS.json
    uncalibrated: Errors
    calibrated: Errors
    held_out: Errors

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "runs": list(self.runs), "uncalibrated": self.uncalibrated.to_json(),
                "calibrated": self.calibrated.to_json(), "held_out": self.held_out.to_json()}


@dataclass(frozen=True)
class CrossValidation:
    """F8's outcome: per parameter count k (0 = uncalibrated) the held-out predictions, their RMS
    log error and whether their ranking is no worse in every group; ``chosen`` the k kept."""

    scheme: str  # "leave one group out" or "K folds"
    groups: tuple[str, ...]  # per run
    held: tuple[tuple[float, ...], ...]  # held[k][i]
    rms: tuple[float, ...]
    ranking_ok: tuple[bool, ...]
    chosen: int

    @property
    def held_out(self) -> tuple[float, ...]:
        return self.held[self.chosen]

    def per_group(self, records, measured, before, after) -> tuple[GroupErrors, ...]:
        out = []
        for name in dict.fromkeys(self.groups):
            idx = [i for i, g in enumerate(self.groups) if g == name]
            pick = lambda v: [v[i] for i in idx]  # noqa: E731
            out.append(GroupErrors(name, tuple(records[i] for i in idx), errors(pick(before), pick(measured)),
                                   errors(pick(after), pick(measured)), errors(pick(self.held_out), pick(measured))))
        return tuple(out)

    def to_json(self) -> dict[str, Any]:
        return {"scheme": self.scheme, "parameters_kept": self.chosen,
                "per_count": [{"parameters": k, "held_out_rms_log_error": r, "ranking_no_worse": ok}
                              for k, (r, ok) in enumerate(zip(self.rms, self.ranking_ok))]}


def cross_validate(refit_predict: Callable[[int, np.ndarray, np.ndarray], np.ndarray], levels: int,
                   measured: np.ndarray, before: np.ndarray, groups: Sequence[str]) -> CrossValidation | None:
    """F8 over parameter counts 0..levels: ``refit_predict(k, train, test)`` fits the first k
    parameters on the runs ``train`` (indices) and returns the predictions of the runs ``test``.

    Examples
    --------
    Predictions 2x too slow in group a, exact in group b: a scale fitted on b does not carry to
    a, and the other way round, so the held-out error is worse with it and k = 0 is kept:

    >>> measured = np.array([1.0, 2.0, 3.0, 1.0, 2.0, 3.0])
    >>> before = np.array([2.0, 4.0, 6.0, 1.0, 2.0, 3.0])
    >>> def refit_predict(k, train, test):
    ...     scale = np.exp(np.mean(np.log(measured[train] / before[train]))) if k else 1.0
    ...     return before[test] * scale
    >>> cross_validate(refit_predict, 1, measured, before, ["a"] * 3 + ["b"] * 3).chosen
    0
    """
    split = folds(groups)
    if split is None:
        return None
    n = len(measured)
    held = [np.array(before, dtype=float)]
    for k in range(1, levels + 1):
        pred = np.empty(n)
        for test in split:
            train = np.setdiff1d(np.arange(n), test)
            pred[test] = refit_predict(k, train, test) if len(train) else before[test]
        held.append(pred)
    rms = [float(np.sqrt(np.mean(np.log(h / measured) ** 2))) for h in held]
    cells = cells_of(split, groups)
    ok = [rank_no_worse(h, np.asarray(before), measured, cells) for h in held]
    chosen = min((k for k in range(len(held)) if ok[k]), key=lambda k: (round(rms[k], 12), k))
    scheme = "leave one group out" if len(set(groups)) > 1 else f"{len(split)} folds"
    return CrossValidation(scheme, tuple(groups), tuple(tuple(float(v) for v in h) for h in held), tuple(rms),
                           tuple(ok), chosen)


def group_names(runs, records) -> list[str]:
    """The group of each record: the name of the instance it ran on (a cluster and a model), with
    its file where two instances share a name."""
    names = {key: inst.name for key, inst in runs.instances.items()}
    clash = {n for n in names.values() if list(names.values()).count(n) > 1}
    label = {key: (f"{n} ({key})" if n in clash and key is not None else n) for key, n in names.items()}
    return [label[r.instance] for r in records]
