"""The mixed-integer program of one candidate (tp, dp, pp, micro-batch).

The equations are stated in ``formulations/mip.md``; names here follow it.  The
program is assembled from its parts: the layer assignment (:mod:`.layers`, eq.
M1-M4, or the second formulation :mod:`.assignment`, eq. A1-A4), the stage times E[s], Emax, P[s], ARmax with their rows for a fixed placement
(M5-M8, here) or for free grouping (:mod:`.grouping_rows`, M5-M8 and M10-M12), and the
objective (M9).

Every coefficient comes from the cost model's
:class:`~amp_opt.model.costs.StageCosts` (or, for what does not depend on the
devices, its ``candidate_terms``, with the instance as the model prices it), so the program
prices a plan exactly as the evaluator does (up to the integer resolution of CP-SAT, see
``backends.py``); a model whose ``stage_costs`` is not built from ``candidate_terms`` is refused
before a program is built (:func:`~amp_opt.model.costs.contract.check_rows_price`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ...model.costs.terms import stage_order
from .grouping_rows import FreeGrouping, class_terms
from .assignment import AssignmentLayers
from .layers import PrefixLayers
from .linear import BIN, BYTES, TIME, LinearModel, above, lin


@dataclass
class Formulation:
    model: LinearModel
    decode: Callable[[dict[int, float]], tuple[tuple[int, ...], tuple]]  # values -> (boundaries, stages)
    hint_from: Callable[[tuple[int, ...], tuple], None]  # plan -> sets model.hint
    terms: int  # rounded coefficients on the objective's path (for the integer tolerance)
    extra: dict = field(default_factory=dict)


class Program:
    """One candidate's program under construction: the model, its layer assignment and its
    time variables, with upper bounds gathered as the rows are written.  Layers are in stage
    order; with interleaving the (fixed) chunks make each stage one range (eq. H11)."""

    def __init__(self, search, cand):
        chunks = search.chunks(cand)
        # The model's one source of terms; its instance (links, capacities) is the one the rows price.
        self.terms = search.model.candidate_terms(search.tables, cand, chunks=chunks)
        self.search, self.cand, self.instance = search, cand, self.terms.instance
        self.L, p = search.instance.num_layers, cand.pp
        self.pipeline = search.model.pipeline(search.tables, cand)  # the objective's weights (H6, H11, H13)
        self.enforce_memory = search.model.enforces_memory
        self.total_params = float(self.terms.sums.params.sum())
        self.mdl = LinearModel()
        layers = AssignmentLayers if search.options.layers == "assignment" else PrefixLayers
        self.layers = layers(self.mdl, self.terms.sums, self.L, p, None if chunks is None else stage_order(chunks, p)[1])
        self.E = [self.mdl.var(f"E[{s}]", 0, 0, TIME) for s in range(p)]
        self.Emax = self.mdl.var("Emax", 0, 0, TIME)
        self.P = [self.mdl.var(f"P[{s}]", 0, 0, TIME) for s in range(p - 1)]
        self.ARmax = self.mdl.var("ARmax", 0, 0, TIME)
        self.ub = {"E": 0.0, "P": 0.0, "AR": 0.0}
        self.vol = self.terms.volume
        self.peak = {}  # per (stage, buffer kind): (a variable at least the largest per-layer buffer (H7, H9), the buffers)
        self.w = {}  # (M15, M16) w[s,l] = 1 when layer l runs on stage s and recomputes there
        self.rec = {}  # (M16) rec[s] = 1 when stage s recomputes (a per-stage choice)
        self.q = self.terms.block_start() if self.terms.block else None
        if self.terms.block:
            self._block_rows()
        if self.terms.per_stage:
            self._choice_rows()

    def _block_rows(self) -> None:
        """(M15) The block method: a recomputing layer l of stage s is among the stage's first r
        recomputing layers exactly when the stage starts at q(l) or later, i.e. when layer q(l)-1
        sits on an earlier stage: w[s,l] = z[s,l] AND before[s,q(l)-1]."""
        for s in range(1, self.cand.pp):
            for l in np.flatnonzero(self.terms.recomputes & (self.q > 0)):
                self._both(s, int(l), self.layers.before(s, int(self.q[l]) - 1), "block")

    def _choice_rows(self) -> None:
        """(M16) A per-stage choice: stage s recomputes in full (rec[s] = 1) or not at all, and
        a recomputing layer l recomputes on s exactly when it runs there and s recomputes:
        w[s,l] = z[s,l] AND rec[s]."""
        for s in range(self.cand.pp):
            self.rec[s] = self.mdl.var(f"rec[{s}]", 0, 1, BIN)
            for l in np.flatnonzero(self.terms.recomputes):
                self._both(s, int(l), {self.rec[s]: 1.0}, "choice")

    def _both(self, s: int, l: int, other: dict, name: str) -> None:
        """w[s,l] = z[s,l] AND other, exact both ways in three rows (w lowers memory and raises
        time, so neither direction may be left to the objective); no w when either side is empty."""
        on = self.layers.z(s, l)
        if not on or not other:
            return
        w = self.w[s, l] = self.mdl.var(f"w[{s},{l}]", 0, 1, BIN)
        self.mdl.add(lin({w: 1}, (-1, on)), "<=", 0, "count", f"{name}_on[{s},{l}]")
        self.mdl.add(lin({w: 1}, (-1, other)), "<=", 0, "count", f"{name}_other[{s},{l}]")
        self.mdl.add(lin({w: 1}, (-1, on), (-1, other)), ">=", -1, "count", f"{name}_both[{s},{l}]")

    def recomputed(self, s: int, l: int) -> dict:
        """Layer l runs on stage s and recomputes its forward there in full (linear)."""
        terms = self.terms
        if terms.modes[s] != "full" or not terms.recomputes[l]:
            return {}
        if not (terms.per_stage or terms.block) or (terms.block and self.q[l] == 0):
            return self.layers.z(s, l)  # every layer, or one among the first r whatever the start
        return {self.w[s, l]: 1.0} if (s, l) in self.w else {}

    def stage_sum(self, s: int, base, extra=None) -> dict:
        """sum_l base[l] z[s,l] (+ extra[l] for the layers the block method recomputes): a stage
        term that is a sum over its layers, in the stage's base mode (M15)."""
        z = self.layers.z
        out = lin(*[(float(base[l]), z(s, l)) for l in range(self.L) if base[l]])
        if extra is not None and self.terms.base_mode(s) != self.terms.modes[s]:
            out = lin(out, *[(float(extra[l]), self.recomputed(s, l)) for l in range(self.L) if extra[l]])
        return out

    def comm_bytes(self, s: int) -> dict:
        """(H10) bytes stage s moves on its ring per micro-batch, linear in the assignment."""
        terms = self.terms
        base = terms.comm_layer_bytes(terms.base_mode(s))
        return lin(self.stage_sum(s, base, terms.comm_layer_bytes(terms.modes[s]) - base),
                   (terms.comm_param_bytes(), self.layers.params(s)))

    def comm_messages(self, s: int) -> dict:
        """(H19 on H10) messages stage s sends on its ring per micro-batch, linear in the assignment."""
        terms = self.terms
        base = terms.comm_layer_messages(terms.base_mode(s))
        return self.stage_sum(s, base, terms.comm_layer_messages(terms.modes[s]) - base)

    def memory_row(self, s: int, capacity: float, guard: dict, big_m, name: str) -> None:
        """(M8) bytes per device of stage s <= capacity (+ big-M slack when guarded)."""
        terms = self.terms
        kept = terms.layer_bytes(s)
        inflight = terms.in_flight(s) * terms.micro_batch
        expr = lin((terms.state_bytes_per_param, self.layers.params(s)),
                   (inflight, self.stage_sum(s, kept, terms.kept["full"] - kept)), self._peak(s))
        expr = lin((terms.allocator_scale, expr))  # H14: fragmentation scales the allocator's bytes
        rhs = capacity - terms.framework_bytes
        if guard:
            expr = lin(expr, (big_m, guard))  # + M * has  <=  cap + M
            rhs += big_m
        self.mdl.add(expr, "<=", rhs, "bytes", name)

    def _peak(self, s: int) -> dict:
        """The buffers of eq. H7 and H9 that a stage holds once: the activations of the layer being
        recomputed (full recomputation) and one layer's gathered weights and gradients (ZeRO-3).
        One variable per buffer, bounded below by every layer's: memory rows alone push it down."""
        terms, tr = self.terms, self.instance.training
        buffers = []
        if terms.modes[s] == "full":
            buffers.append(("recompute", terms.micro_batch * terms.recomputed_activations, self.recomputed))
        if self.cand.zero_stage >= 3:
            buffers.append(("gathered", terms.largest_params * (tr.weight_bytes + tr.gradient_bytes), self.layers.z))
        out = {}
        for kind, per_layer, holds in buffers:
            if not per_layer.any():
                continue
            key = (s, kind)
            if key not in self.peak:
                var = self.mdl.var(f"buffer[{s},{kind}]", 0, float(per_layer.max()), BYTES)
                self.peak[key] = (var, per_layer)
                for l in range(self.L):
                    if per_layer[l] and holds(s, l):
                        self.mdl.add(lin({var: 1}, (-float(per_layer[l]), holds(s, l))), ">=", 0,
                                     "bytes", f"buffer[{s},{kind},{l}]")
            out[self.peak[key][0]] = 1.0
        return out

    def fixed_rows(self, costs) -> None:
        """(M5-M8) on a fixed placement: every stage's classes, link and capacity are known."""
        mdl, e, L, ub = self.mdl, self.layers.e, self.L, self.ub
        self.vol = vol = costs.p2p_volume()
        for s in range(self.cand.pp):
            ring = (costs.ring_factor(s), self.comm_bytes(s))  # (H10)
            msgs = (costs.ring_latency(s), self.comm_messages(s))  # (H19)
            for times, extra, step in zip(costs.layer_times(s), costs.recompute_times(s), costs.step_overheads(s)):
                mdl.add(lin({self.E[s]: 1}, (-1.0, self.stage_sum(s, times, extra)), (-ring[0], ring[1]),
                            (-msgs[0], msgs[1])), ">=", step, "time", f"compute[{s}]")
                ub["E"] = max(ub["E"], float(times.sum() + extra.sum()) + step
                              + sum(f * sum(abs(c) for c in e.values()) for f, e in (ring, msgs)))
            if s < self.cand.pp - 1:
                phi, alpha = costs.p2p_factor(s), costs.p2p_latency(s)  # (H3, H19)
                mdl.add(lin({self.P[s]: 1}, *[(-float(vol[l] * phi), e(s, l)) for l in range(L)]), ">=", alpha, "time",
                        f"p2p[{s}]")
                ub["P"] = max(ub["P"], float(vol.max() * phi) + alpha)
            a, lam = costs.allreduce_factor(s), costs.allreduce_latency(s)  # (H4, H15; H19 a constant)
            if not costs.overlap_share:
                mdl.add(lin({self.ARmax: 1}, (-a, self.layers.params(s))), ">=", lam, "time", f"allreduce[{s}]")
            else:  # H18: max(0, reduction - window) + step, the window on the fastest class (a row per class)
                o, kappa = costs.optimizer_factor(s), costs.overlap_share
                mdl.add(lin({self.ARmax: 1}, (-o, self.layers.params(s))), ">=", 0, "time", f"step[{s}]")
                for c, (times, extra) in enumerate(zip(costs.layer_times(s), costs.recompute_times(s))):
                    mdl.add(lin({self.ARmax: 1}, (-a, self.layers.params(s)), (kappa, self.stage_sum(s, times, extra))),
                            ">=", lam, "time", f"allreduce[{s},{c}]")
            ub["AR"] = max(ub["AR"], a * self.total_params + lam)
            if self.enforce_memory:
                self.memory_row(s, costs.capacity[s], {}, None, f"memory[{s}]")

    def objective(self) -> int:
        """(M9, H11, H13) w Emax + (1/v) sum E + r sum P + ARmax with Emax >= (w_s / w) E[s], w the
        largest bottleneck weight w_s (all equal in the closed form); returns the rounded
        coefficients on its path."""
        mdl, E, P = self.mdl, self.E, self.P
        pipe = self.pipeline
        w = max(pipe.bottleneck)
        for s, (a, b) in enumerate(_bottleneck_rows(pipe.bottleneck)):
            mdl.add(lin((a, {self.Emax: 1}), (-b, {E[s]: 1})), ">=", 0, "time", f"bottleneck[{s}]")
        for v, key in [(self.Emax, "E"), (self.ARmax, "AR")] + [(x, "E") for x in E] + [(x, "P") for x in P]:
            mdl.vars[v].ub = above(self.ub[key])
        v = self.cand.virtual_stages
        mdl.objective = lin({self.Emax: float(w)}, *[{x: 1 / v} for x in E], *[{x: pipe.p2p} for x in P],
                            {self.ARmax: 1.0})
        mdl.objective_scale = v
        # Rounded coefficients on the objective's path: w * L (Emax), L (sum E), r p (P), L (AR).
        return (math.ceil(w) + 2) * self.L + math.ceil(pipe.p2p) * self.cand.pp

    def hint_times(self, boundaries, stages) -> None:
        """The time and buffer variables' values for a plan (``boundaries`` in stage order), priced by
        the cost model."""
        hint, p = self.mdl.hint, self.cand.pp
        costs = self.search.stage_costs(self.cand, stages)
        for s in range(p):
            hint[self.E[s]] = float(costs.compute(s, boundaries[s], boundaries[s + 1]))
            if s < p - 1:
                hint[self.P[s]] = float(costs.p2p(s, boundaries[s + 1]))
        top = max(self.pipeline.bottleneck)
        hint[self.Emax] = max(hint[self.E[s]] * (w / top if top > 0 else 1.0)
                              for s, w in enumerate(self.pipeline.bottleneck))
        hint[self.ARmax] = max(float(costs.allreduce(s, boundaries[s], boundaries[s + 1])) for s in range(p))
        for (s, kind), (var, per_layer) in self.peak.items():
            k, l = boundaries[s], boundaries[s + 1]
            held = per_layer[k:int(costs.split(s, k, l)) if kind == "recompute" else l]
            hint[var] = float(np.ceil(held.max())) if len(held) else 0.0
        for (s, l), var in self.w.items():
            hint[var] = float(boundaries[s] <= l < costs.split(s, boundaries[s], boundaries[s + 1]))
        for s, var in self.rec.items():
            hint[var] = float(costs.split(s, boundaries[s], boundaries[s + 1]) > boundaries[s])


def _bottleneck_rows(weights) -> list[tuple[float, float]]:
    """Per stage the coefficients (a, b) of a Emax >= b E[s], i.e. Emax >= (w_s / w) E[s] with w the
    largest weight: (1, 1) where w_s = w, else whole numbers when some m <= 12 makes every m w_s
    whole (H13's weights are thirds), since CP-SAT rounds time-by-time coefficients."""
    w = max(weights)
    if w <= 0:
        return [(1.0, 1.0)] * len(weights)
    m = next((m for m in range(1, 13) if all(abs(m * x - round(m * x)) <= 1e-9 * max(1.0, m * x) for x in weights)),
             None)
    rows = []
    for x in weights:
        if x == w:
            rows.append((1.0, 1.0))
        elif m is not None:
            rows.append((float(round(m * w)), float(round(m * x))))
        else:
            rows.append((1.0, x / w))
    return rows


def build(search, cand, fixed_stages=None) -> Formulation:
    """The program of a candidate: fixed placement (``fixed_stages``) or, without it, free grouping.
    ``decode`` gives stage boundaries in stage order (:meth:`Search.partition` makes the plan's)."""
    prog = Program(search, cand)
    grouping = None
    if fixed_stages is not None:
        prog.fixed_rows(search.stage_costs(cand, fixed_stages))
    else:
        grouping = FreeGrouping(prog, class_terms(prog.terms))
    terms = prog.objective()

    def decode(values):
        boundaries = prog.layers.boundaries(values)
        return boundaries, (fixed_stages if grouping is None else grouping.decode(values))

    def hint_from(boundaries, stages):
        prog.mdl.hint.clear()
        prog.layers.hint(boundaries, prog.mdl.hint)
        prog.hint_times(boundaries, stages)
        if grouping is not None:
            grouping.hint(stages, prog.mdl.hint)
            costs = search.stage_costs(cand, stages)
            for s, var in grouping.X.items():
                k, l = boundaries[s], boundaries[s + 1]
                mid = costs.split(s, k, l)
                prog.mdl.hint[var] = float(costs.terms.stage_comm_bytes(s, k, l, mid) * costs.ring_factor(s)
                                           + costs.terms.stage_comm_messages(s, k, l, mid) * costs.ring_latency(s))

    return Formulation(prog.mdl, decode, hint_from, terms,
                       {"node_classes": 0 if grouping is None else len(grouping.classes)})
