"""Regularised least squares on log errors, and which parameters enter (``formulations/calibration.md``, F2-F4).

The objective is sum_i r_i^2 + sigma^2 |x|^2 over unitless coordinates x
(:class:`~.params.Parameter`), r_i = log(predicted_i / measured_i).  Minimisation is
Levenberg-Marquardt from a start point with the iterate clipped to the bounds; the
Jacobian is a forward difference at the start (or a given one) and is then kept up to date
by Broyden's rank-one update, a fresh forward difference only when a step fails: each
iteration costs one prediction of the runs instead of one per parameter.  Every accepted
step lowers the objective.  Deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from .params import Parameter

SHRINK_STEPS = (1.0, 0.75, 0.5, 0.25, 0.0)  # F4
FD_STEP = 1e-4  # finite-difference step in the unitless parameters
MAX_ITERATIONS = 100
TOLERANCE = 1e-4  # stop when a step lowers the objective by less than this many prior units (lam)
RELATIVE_TOLERANCE = 1e-4  # or by less than this fraction of the objective


@dataclass(frozen=True)
class Solution:
    """A fit of some parameters: their unitless coordinates, the fraction of the fitted step kept
    (F4) and the order in which they entered (F3; the first k are the fit with k parameters)."""

    parameters: tuple[Parameter, ...]
    x: tuple[float, ...]
    shrink: float  # F4: the fraction of the fitted step kept
    iterations: int
    order: tuple[str, ...] = ()  # parameter names in the order they entered


def objective(r: np.ndarray, x: np.ndarray, lam: float) -> float:
    return float(r @ r + lam * (x @ x))


def jacobian(residuals, x: np.ndarray, r: np.ndarray, bounds) -> np.ndarray:
    """Forward differences of the residuals at x (backward at an upper bound)."""
    J = np.empty((len(r), len(x)))
    for j in range(len(x)):
        h = FD_STEP if x[j] + FD_STEP <= bounds[j][1] else -FD_STEP
        e = x.copy()
        e[j] += h
        J[:, j] = (residuals(e) - r) / h
    return J


def least_squares(residuals: Callable[[np.ndarray], np.ndarray], x0: np.ndarray, lam: float,
                  bounds: Sequence[tuple[float, float]], J0: np.ndarray | None = None
                  ) -> tuple[np.ndarray, float, int]:
    """Levenberg-Marquardt with the iterate clipped to the bounds, from ``x0`` (``J0``: a Jacobian
    to start from, else a forward difference at x0).  Returns (x, objective, iterations); the
    result is never worse than ``x0`` on the objective."""
    x = np.array(x0, dtype=float)
    r = residuals(x)
    F = objective(r, x, lam)
    if len(x) == 0:
        return x, F, 0
    lo, hi = np.array([b[0] for b in bounds]), np.array([b[1] for b in bounds])
    J, fresh = (jacobian(residuals, x, r, bounds), True) if J0 is None else (np.array(J0, dtype=float), False)
    mu, refreshed = 1e-3, False
    for it in range(1, MAX_ITERATIONS + 1):
        g = J.T @ r + lam * x
        H = J.T @ J + lam * np.eye(len(x))
        step = np.linalg.solve(H + mu * np.diag(np.diag(H)), -g)
        xn = np.clip(x + step, lo, hi)
        rn = residuals(xn)
        Fn = objective(rn, xn, lam)
        dx = xn - x
        if dx @ dx > 0:  # Broyden: the model's prediction of rn corrected along the step taken
            J = J + np.outer(rn - r - J @ dx, dx) / (dx @ dx)
        if Fn < F:
            done = F - Fn <= max(TOLERANCE * lam, RELATIVE_TOLERANCE * F) or float(np.abs(dx).max()) < 1e-6
            x, r, F, fresh = xn, rn, Fn, False
            mu = max(mu / 10, 1e-12)
            if done:
                return x, F, it
            continue
        if not fresh and not refreshed:  # the updated Jacobian misled: measure it again (once per fit)
            J, fresh, refreshed = jacobian(residuals, x, r, bounds), True, True
            continue
        mu *= 10
        if mu >= 1e12:
            return x, F, it
    return x, F, MAX_ITERATIONS


def identifiable(J: np.ndarray, candidates: Sequence) -> list[int]:
    """F3: the candidates the runs can tell apart, in priority order: a candidate whose column
    of the Jacobian at the uncalibrated model is zero (no run depends on it) or lies in the
    span of earlier ones (no run separates it from them) is left out.

    Examples
    --------
    >>> J = np.array([[1.0, 0.0, 2.0], [1.0, 0.0, 2.0]])  # the third column is twice the first
    >>> identifiable(J, ["a", "b", "c"])
    [0]
    """
    chosen: list[int] = []
    for j in range(len(candidates)):
        if not np.any(J[:, j]):
            continue
        sv = np.linalg.svd(J[:, chosen + [j]], compute_uv=False)
        if sv[-1] > 1e-6 * sv[0]:
            chosen.append(j)
    return chosen


def max_parameters(runs: int) -> int:
    """F3: at most one free parameter per two runs (rounded up).

    Examples
    --------
    >>> [max_parameters(n) for n in (1, 2, 3, 8)]
    [1, 1, 2, 4]
    """
    return (runs + 1) // 2


def scores(r: np.ndarray) -> tuple[float, float]:
    """(RMS log error, median absolute relative error) of log residuals."""
    if len(r) == 0:
        return (0.0, 0.0)
    return (float(np.sqrt(np.mean(r ** 2))), float(np.median(np.abs(np.expm1(r)))))


def shrunk(residual_of, params: Sequence[Parameter], x, iterations: int, order=()) -> Solution:
    """F4: the fit scaled by the largest t of 1, 0.75, 0.5, 0.25, 0 at which neither the RMS log
    error nor the median absolute error on the runs is worse than the uncalibrated model's."""
    base = scores(residual_of(params, np.zeros(len(params))))
    for t in SHRINK_STEPS:
        kept = t * np.asarray(x, dtype=float)
        if t == 0.0 or all(a <= b + 1e-12 for a, b in zip(scores(residual_of(params, kept)), base)):
            return Solution(tuple(params), tuple(float(v) for v in kept), t, iterations, tuple(order))
    raise AssertionError("unreachable: the last shrink step is the uncalibrated model")  # pragma: no cover


def fit_parameters(residual_of: Callable[[Sequence[Parameter], np.ndarray], np.ndarray],
                   candidates: Sequence[Parameter], runs: int, noise: float, *, limit: int | None = None,
                   start: dict | None = None) -> Solution:
    """Select and fit parameters (F1-F4) given ``residual_of(parameters, x) -> log errors``.

    F3: the identifiable candidates are fitted jointly when there are at most
    ``max_parameters(runs)`` (or ``limit``) of them; otherwise they enter one at a time,
    each round taking the candidate whose joint fit with the chosen ones lowers the
    objective most (ties to the earlier one).  ``start`` (name -> x) warm-starts the fit.

    Examples
    --------
    Two runs, each 2.5 times slower than predicted; a scale factor explains both:

    >>> scale = Parameter("compute_scale[g]", ("device_types", "g", "compute_scale"), 1.0, 1.0, True)
    >>> predicted, measured = np.array([1.0, 3.0]), np.array([2.5, 7.5])
    >>> def residual_of(params, x):
    ...     factor = params[0].value(x[0]) if params else 1.0
    ...     return np.log(factor * predicted / measured)
    >>> sol = fit_parameters(residual_of, [scale], runs=2, noise=0.05)
    >>> [p.name for p in sol.parameters], round(sol.parameters[0].value(sol.x[0]), 2)
    (['compute_scale[g]'], 2.5)
    """
    lam = noise ** 2
    k_max = min(max_parameters(runs) if limit is None else limit, len(candidates))
    bounds = [p.x_bounds() for p in candidates]
    x0 = np.zeros(len(candidates))
    r0 = residual_of(candidates, x0)
    J0 = jacobian(lambda v: residual_of(candidates, v), x0, r0, bounds)
    pool = identifiable(J0, candidates)
    start = start or {}

    def fit(cols):
        params = [candidates[c] for c in cols]
        init = np.array([start.get(p.name, 0.0) for p in params])
        init = np.clip(init, [bounds[c][0] for c in cols], [bounds[c][1] for c in cols]) if cols else init
        J = J0[:, cols] if not start else None  # from x = 0 the Jacobian at x = 0 is already known
        return least_squares(lambda v: residual_of(params, v), init, lam, [bounds[c] for c in cols], J)

    iterations = 0
    if len(pool) <= k_max:
        chosen = entered = pool
        x, _, iterations = fit(chosen)
    else:
        chosen, entered, x = [], [], np.zeros(0)
        F = float(r0 @ r0)
        while len(chosen) < k_max:
            best = None
            for j in pool:
                if j not in chosen:
                    cols = sorted(chosen + [j])
                    xc, Fc, its = fit(cols)
                    iterations += its
                    if Fc < F - 1e-15 and (best is None or Fc < best[2] - 1e-15):
                        best = (cols, xc, Fc, j)
            if best is None:
                break
            chosen, x, F = best[:3]
            entered = entered + [best[3]]
    params = [candidates[c] for c in chosen]
    return shrunk(residual_of, params, x, iterations, [candidates[c].name for c in entered])


def refit(residual_of, params: Sequence[Parameter], noise: float, start: dict | None = None,
          J0: np.ndarray | None = None) -> Solution:
    """F1-F2 and F4 for a fixed set of parameters (no selection), warm-started at ``start``
    (name -> x; ``J0`` the Jacobian there, if known): what each cross-validation fold fits (F8)."""
    bounds = [p.x_bounds() for p in params]
    init = np.array([min(max((start or {}).get(p.name, 0.0), b[0]), b[1]) for p, b in zip(params, bounds)])
    x, _, its = least_squares(lambda v: residual_of(params, v), init, noise ** 2, bounds, J0)
    return shrunk(residual_of, params, x, its, [p.name for p in params])
