"""The Lagrangian kind bound of a candidate (``formulations/mip.md`` eq. B4).

For thresholds T on the largest weighted stage compute (max_s w_s E_s, H6/H13's bottleneck
term) and U on the largest allreduce,

    time >= w * T_lo + U_lo + h_lambda(T, U) - lambda . G,   w = 1 (0 without a bottleneck term)

for every plan whose largest weighted stage compute lies in (T_lo, T] and whose largest
allreduce lies in (U_lo, U] (h from :meth:`KindModel.sweep`).  :class:`KindSearch`
works best-first over such threshold cells, raising each cell's dual by a
trust-region cutting-plane ascent (:class:`Ascent`); a bound that reaches
``KindModel.ceiling`` proves the candidate has no plan.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from ...model.ranges import INF
from ..clock import NO_LIMIT, Clock
from ..tuning import FINEST, LP_MS, REACH, WAVE
from .lagrangian import KindModel, KindPath, min_max


@dataclass
class Cell:
    """Plans whose largest stage compute is in (T_lo, T_hi] and largest allreduce in (U_lo, U_hi]."""

    T_lo: float
    T_hi: float
    U_lo: float
    U_hi: float
    lam: np.ndarray
    bound: float = -INF
    settled: bool = False  # the dual over lambda has converged for this cell
    tries: int = 0  # dual ascents run on this cell
    ascent: object = None  # its Ascent (cuts so far), kept between tries
    path: KindPath | None = None  # the relaxed path at the best lambda so far

    def lead(self, w: float) -> float:
        return w * self.T_lo + self.U_lo


class Ascent:
    """The dual of one cell over lambda, by a trust-region cutting-plane method (eq. B4).

    The dual function is concave and piecewise linear in lambda (one cut per DP path); the
    next lambda maximises the cuts' minimum in a box around the best lambda so far.  Shifting
    every price by the same amount changes nothing (the stages take p*d = sum G groups), so
    the first class's price stays where it is.
    """

    def __init__(self, cell: Cell, target: float, classes: int):
        self.cell, self.target, self.classes = cell, target, classes
        self.lam, self.center = cell.lam.copy(), cell.lam.copy()
        self.radius, self.boxed = 0.2 * max(1e-3, float(np.abs(self.center).max())), False
        self.done = False
        self.rows: list[tuple[float, np.ndarray]] = []  # cuts as theta - g . y <= rhs
        self.reach: list[tuple[float, float]] = []  # per cut, its path's largest weighted compute and allreduce
        self._model = None  # [GLOP model, its y, cuts in it] while the ascent runs

    def _lp(self):
        """The steps' LP, max theta subject to the cuts, and its y: kept while the ascent runs, one
        row added per cut (set coefficient by coefficient: GLOP's expression API is slow at this size)."""
        from ortools.linear_solver import pywraplp

        if self._model is None:
            lp = pywraplp.Solver.CreateSolver("GLOP")
            theta = lp.NumVar(-lp.infinity(), lp.infinity(), "theta")
            y = [lp.NumVar(0.0, 0.0, f"y{c}") for c in range(len(self.center))]
            objective = lp.Objective()
            objective.SetCoefficient(theta, 1.0)
            objective.SetMaximization()
            self._model = [lp, y, 0]
        lp, y, added = self._model
        theta = lp.variable(0)
        for rhs, g_row in self.rows[added:]:
            row = lp.Constraint(-lp.infinity(), rhs)
            row.SetCoefficient(theta, 1.0)
            for c in np.flatnonzero(g_row):
                row.SetCoefficient(y[c], -float(g_row[c]))
        self._model[2] = len(self.rows)
        return lp, y

    def release(self) -> None:
        """Let the LP go (the cuts stay; it is rebuilt from them if the ascent runs again)."""
        self._model = None

    def inherit(self, parent: Ascent, shift: float) -> None:
        """Start from the cuts of ``parent`` (the ascent of a cell holding this one) whose paths keep
        within this cell's thresholds, moved by ``shift``, the change of the lead term (eq. B4, "Cuts
        kept"): each stays above this cell's dual function, so the first steps start where the
        parent's left off instead of from one cut."""
        cell = self.cell
        for (rhs, g), (t, u) in zip(parent.rows, parent.reach):
            if t <= cell.T_hi and u <= cell.U_hi:
                self.rows.append((rhs + shift, g))
                self.reach.append((t, u))

    def record(self, value: float, g: np.ndarray, path: KindPath, reach: tuple[float, float]) -> None:
        """Take the dual value, subgradient and DP path at ``self.lam`` (``reach``: the path's largest
        weighted stage compute and allreduce, :meth:`KindModel.reach`); choose the next lambda or finish."""
        from ortools.linear_solver import linear_solver_pb2, pywraplp  # heavy: imported when a dual step runs

        cell = self.cell
        # The cut theta <= value + g . (y - lam), as theta - g . y <= value - g . lam
        self.rows.append((float(value - g @ self.lam), g.copy()))
        self.reach.append(reach)
        if value > cell.bound or cell.path is None:
            cell.path = path
        if value > cell.bound:
            cell.bound, cell.lam, self.center = value, self.lam.copy(), self.lam.copy()
            if self.boxed:
                self.radius = min(2 * self.radius, REACH * self.target)
        elif len(self.rows) > 1:
            self.radius *= 0.5
        C = self.classes
        # A path meeting the supply and the cuts with complementary slackness: the dual is solved.
        solved = not g[:C].any() and (g[C:] <= 0).all() and not (self.lam[C:] * g[C:]).any()
        if cell.bound >= self.target or solved:
            self.done = cell.settled = True
            return
        lp, y = self._lp()
        for _ in range(20):  # widenings of the box; flat directions (a cut met exactly) end it
            # The box: lambda_0 fixed, the rest within the radius; mu >= 0 (K7 rows are inequalities).
            reach = np.full(len(self.center), self.radius)
            reach[0] = 0.0
            low = self.center - reach
            low[C:] = np.maximum(0.0, low[C:])
            for var, lo, hi in zip(y, low, self.center + reach):
                var.SetBounds(float(lo), float(hi))
            # Solved afresh each step (re-solving the kept model from its last basis could stall):
            # the model is handed over as a proto, which also spares rebuilding it row by row.
            request = linear_solver_pb2.MPModelRequest(
                solver_type=linear_solver_pb2.MPModelRequest.GLOP_LINEAR_PROGRAMMING,
                solver_time_limit_seconds=LP_MS / 1000)
            lp.ExportModelToProto(request.model)
            response = linear_solver_pb2.MPSolutionResponse()
            pywraplp.Solver.SolveWithProto(request, response)
            if response.status != linear_solver_pb2.MPSOLVER_OPTIMAL:
                self.done = True
                return
            solution = np.array(response.variable_value)  # theta, then y
            self.lam = solution[1:]
            self.boxed = bool(np.abs(self.lam - self.center).max() >= self.radius * (1 - 1e-6))
            if solution[0] - cell.bound > 1e-4 * self.target:
                return
            if not self.boxed or self.radius >= REACH * self.target:
                break
            self.radius = min(4 * self.radius, REACH * self.target)
        self.done = cell.settled = True  # no price in reach gains more


def ascend(model: KindModel, cells: list[Cell], target: float, iterations: int, clock: Clock = NO_LIMIT) -> int:
    """Raise the bounds of ``cells`` together (one batched DP sweep per round) for at most
    ``iterations`` rounds, or until ``clock`` runs out (or a stop request: every round leaves valid
    bounds); marks each cell settled when its dual has converged.  Returns the number of DP
    paths computed."""
    w = model.w
    for cell in cells:
        # A cell's cuts stay valid for it; a new target only changes when to stop.
        if cell.ascent is None:
            cell.ascent = Ascent(cell, target, len(model.classes))
        cell.ascent.target, cell.ascent.done, cell.settled = target, False, False
    ascents = [cell.ascent for cell in cells]
    paths_seen, cut_short = 0, False
    for _ in range(iterations):
        live = [a for a in ascents if not a.done]
        if not live:
            break
        if clock.out_of_time():
            cut_short = True
            break
        T = np.array([a.cell.T_hi for a in live])
        U = np.array([a.cell.U_hi for a in live])
        lam = np.array([a.lam for a in live])
        h, paths = model.sweep(lam, T, U, paths=True)
        paths_seen += len(live)
        for a, value, path in zip(live, h, paths):
            if path is None:
                a.cell.bound, a.done, a.cell.settled = INF, True, True  # nothing fits these thresholds
                continue
            g = model.subgradient(path, a.lam)
            a.record(a.cell.lead(w) + float(value) - model.constant(a.lam), g, path, model.reach(path))
    for a in ascents:
        a.release()
    if not cut_short:  # an ascent the clock cut short is continued, not counted as a try
        for cell in cells:
            cell.tries += 1
    return paths_seen


class KindSearch:
    """Eq. B4 for one candidate, kept between calls: best-first over threshold cells.

    The cells with the smallest bounds get dual steps until their duals are settled, then
    are split in two along the term (w*T or U) whose range is wider; a wave of up to WAVE
    cells is worked on at once.  The lowest cells also say where good plans may lie
    (``promising``).
    """

    def __init__(self, model: KindModel, target: float, clock: Clock = NO_LIMIT):
        w = model.w
        self.model, self.sweeps, self.pushed = model, 0, 0
        self.heap: list = []
        self.floor = INF
        T0 = min_max(model, model.compute, weighted=True) if w > 0 else 0.0
        U0 = min_max(model, model.allreduce)
        if not (np.isfinite(T0) and np.isfinite(U0)):
            return
        # Plans with w*max E + max AR above the first target cannot be of interest.
        T_hi = max(T0, (target - U0) / w) if w > 0 else INF
        U_hi = max(U0, target - w * T0)
        self._work([Cell(T0, T_hi, U0, U_hi, np.zeros(model.dims))], target, 40, clock)

    @property
    def bound(self) -> float:
        return float(min([self.floor] + [b for b, _, _ in self.heap]))

    def _work(self, cells: list[Cell], target: float, iterations: int, clock: Clock = NO_LIMIT) -> None:
        self.sweeps += ascend(self.model, cells, target, iterations, clock)
        for cell in cells:
            self.pushed += 1
            heapq.heappush(self.heap, (cell.bound, self.pushed, cell))

    def raise_to(self, target: float, sweeps: int, clock: Clock = NO_LIMIT) -> float:
        """Refine until the bound reaches ``target`` or ``sweeps`` more DP paths are spent (or
        ``clock`` runs out).

        Returns v with every plan of the candidate costing at least v; v <= target (the cells
        only cover plans below the first target, and targets only decrease).
        """
        w, stop = self.model.w, self.sweeps + sweeps
        while self.heap and self.sweeps < stop and not clock.out_of_time():
            wave = []
            while self.heap and self.heap[0][0] < target and len(wave) < WAVE:
                cell = heapq.heappop(self.heap)[2]
                T_hi = min(cell.T_hi, max(cell.T_lo, (target - cell.U_lo) / w)) if w > 0 else cell.T_hi
                U_hi = min(cell.U_hi, max(cell.U_lo, target - w * cell.T_lo))
                if np.isfinite(target) and (_halved(cell.T_lo, cell.T_hi, T_hi) or _halved(cell.U_lo, cell.U_hi, U_hi)):
                    # Started with a much higher target (or none): plans above the target are of
                    # no interest (the bound is reported as at most it), so the cell shrinks, and
                    # its dual starts again from the cuts whose paths keep within the new thresholds
                    # (the others would undershoot).
                    cell.T_hi, cell.U_hi = T_hi, U_hi
                    wider, cell.settled, cell.ascent = cell.ascent, False, None
                    if wider is not None:
                        cell.ascent = Ascent(cell, target, len(self.model.classes))
                        cell.ascent.inherit(wider, 0.0)
                if not cell.settled and cell.tries < 2:
                    wave.append(cell)
                    continue
                wide_T = w * (cell.T_hi - cell.T_lo) if w > 0 else 0.0
                wide_U = cell.U_hi - cell.U_lo
                if not np.isfinite(max(wide_T, wide_U)):
                    heapq.heappush(self.heap, (cell.bound, self.pushed, cell))  # no target to split at yet
                    break
                if max(wide_T, wide_U) <= FINEST * target:
                    self.floor = min(self.floor, cell.bound)  # as fine as it gets: the bound is final
                    continue
                for half in (0, 1):
                    child = Cell(cell.T_lo, cell.T_hi, cell.U_lo, cell.U_hi, cell.lam.copy(), cell.bound)
                    if wide_T >= wide_U:
                        mid = (cell.T_lo + cell.T_hi) / 2
                        child.T_lo, child.T_hi = (cell.T_lo, mid) if half == 0 else (mid, cell.T_hi)
                    else:
                        mid = (cell.U_lo + cell.U_hi) / 2
                        child.U_lo, child.U_hi = (cell.U_lo, mid) if half == 0 else (mid, cell.U_hi)
                    if cell.ascent is not None:  # the half starts from the whole's cuts that hold in it
                        child.ascent = Ascent(child, target, len(self.model.classes))
                        child.ascent.inherit(cell.ascent, child.lead(w) - cell.lead(w))
                    wave.append(child)
            if not wave:
                break
            self._work(wave, target, 15, clock)
        return min(self.bound, target)

    def promising(self, count: int) -> list[Cell]:
        """The ``count`` cells with the smallest bounds."""
        return [cell for _, _, cell in heapq.nsmallest(count, self.heap, key=lambda e: e[:2])]


def _halved(lo: float, hi: float, new_hi: float) -> bool:
    """Whether clipping (lo, hi] at new_hi removes at least half of it (or all of an open end)."""
    return new_hi < hi and (not np.isfinite(hi) or new_hi - lo <= 0.5 * (hi - lo))


def kind_bound(model: KindModel, target: float, sweeps: int = 1500, clock: Clock = NO_LIMIT) -> float:
    """Eq. B4: a lower bound on every plan of the candidate, raised until it reaches ``target``
    or ``sweeps`` DP sweeps are spent (or ``clock`` runs out)."""
    return KindSearch(model, target).raise_to(target, sweeps, clock)
