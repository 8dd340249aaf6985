"""The mixed-integer program of one candidate (tp, dp, pp, micro-batch).

The equations are stated in ``formulations/mip.md``; names here follow it.  The
program is assembled from its parts: the layer assignment (:mod:`.layers`, eq.
M1-M4, or the second formulation :mod:`.assignment`, eq. A1-A4), the stage times E[s], Emax, P[s], ARmax with their rows for a fixed placement
(M5-M8, here) or for free grouping (:mod:`.grouping`, M5-M8 and M10-M14), and the
objective (M9).

Every coefficient comes from the cost model's
:class:`~amp_opt.model.costs.StageCosts` (or, for what does not depend on the
devices, :class:`~amp_opt.model.costs.CandidateTerms`), so the program prices a plan
exactly as the evaluator does (up to the integer resolution of CP-SAT, see
``backends.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ...model.costs import CandidateTerms
from .grouping import FreeGrouping, class_terms
from .assignment import AssignmentLayers
from .layers import PrefixLayers
from .model import TIME, LinearModel, lin


@dataclass
class Formulation:
    model: LinearModel
    decode: Callable[[dict[int, float]], tuple[tuple[int, ...], tuple]]  # values -> (bounds, stages)
    hint_from: Callable[[tuple[int, ...], tuple], None]  # plan -> sets model.hint
    terms: int  # rounded coefficients on the objective's path (for the integer tolerance)
    extra: dict = field(default_factory=dict)


class Program:
    """One candidate's program under construction: the model, its layer assignment and its
    time variables, with upper bounds gathered as the rows are written."""

    def __init__(self, search, cand):
        self.search, self.cand, self.instance = search, cand, search.instance
        self.L, p = search.instance.num_layers, cand.pp
        self.terms = CandidateTerms(search.tables, cand)
        self.enforce_memory = search.model.enforces_memory
        self.total_params = float(self.terms.sums.params.sum())
        self.mdl = LinearModel()
        layers = AssignmentLayers if search.options.layers == "assignment" else PrefixLayers
        self.layers = layers(self.mdl, self.terms.sums, self.L, p)
        self.E = [self.mdl.var(f"E[{s}]", 0, 0, TIME) for s in range(p)]
        self.Emax = self.mdl.var("Emax", 0, 0, TIME)
        self.P = [self.mdl.var(f"P[{s}]", 0, 0, TIME) for s in range(p - 1)]
        self.ARmax = self.mdl.var("ARmax", 0, 0, TIME)
        self.ub = {"E": 0.0, "P": 0.0, "AR": 0.0}
        self.vol = self.terms.volume

    def memory_row(self, s: int, capacity: float, guard: dict, big_m, name: str) -> None:
        """(M8) bytes per device of stage s <= capacity (+ big-M slack when guarded)."""
        terms, z = self.terms, self.layers.z
        act = terms.sums.activation_memory
        inflight = terms.in_flight(s) * terms.micro_batch
        expr = lin((terms.state_bytes_per_param, self.layers.params(s)),
                   *[(float(inflight * act[l]), z(s, l)) for l in range(self.L)])
        rhs = capacity - self.instance.training.memory_reserve
        if guard:
            expr = lin(expr, (big_m, guard))  # + M * has  <=  cap + M
            rhs += big_m
        self.mdl.add(expr, "<=", rhs, "bytes", name)

    def fixed_rows(self, costs) -> None:
        """(M5-M8) on a fixed placement: every stage's classes, link and capacity are known."""
        mdl, z, e, L, ub = self.mdl, self.layers.z, self.layers.e, self.L, self.ub
        self.vol = vol = costs.p2p_volume()
        for s in range(self.cand.pp):
            for times in costs.layer_times(s):
                mdl.add(lin({self.E[s]: 1}, *[(-float(times[l]), z(s, l)) for l in range(L)]), ">=", 0, "time",
                        f"compute[{s}]")
                ub["E"] = max(ub["E"], float(times.sum()))
            if s < self.cand.pp - 1:
                phi = costs.p2p_factor(s)
                mdl.add(lin({self.P[s]: 1}, *[(-float(vol[l] * phi), e(s, l)) for l in range(L)]), ">=", 0, "time",
                        f"p2p[{s}]")
                ub["P"] = max(ub["P"], float(vol.max() * phi))
            a = costs.allreduce_factor(s)
            mdl.add(lin({self.ARmax: 1}, (-a, self.layers.params(s))), ">=", 0, "time", f"allreduce[{s}]")
            ub["AR"] = max(ub["AR"], a * self.total_params)
            if self.enforce_memory:
                self.memory_row(s, costs.capacity[s], {}, None, f"memory[{s}]")

    def objective(self) -> int:
        """(M9) w Emax + sum E + sum P + ARmax; returns the rounded coefficients on its path."""
        mdl, E, P = self.mdl, self.E, self.P
        for s in range(self.cand.pp):
            mdl.add(lin({self.Emax: 1}, (-1, {E[s]: 1})), ">=", 0, "time", f"bottleneck[{s}]")
        for v, key in [(self.Emax, "E"), (self.ARmax, "AR")] + [(x, "E") for x in E] + [(x, "P") for x in P]:
            mdl.vars[v].ub = self.ub[key] * (1 + 1e-6) + 1e-12  # slack for float round-off in hints
        w = self.terms.n_micro - 1
        mdl.objective = lin({self.Emax: float(w)}, *[{x: 1.0} for x in E], *[{x: 1.0} for x in P], {self.ARmax: 1.0})
        # Rounded coefficients on the objective's path: w * L (Emax), L (sum E), p (P), L (AR).
        return (w + 2) * self.L + self.cand.pp

    def hint_times(self, bounds, stages) -> None:
        """The time variables' values for a plan, priced by the cost model."""
        hint, p = self.mdl.hint, self.cand.pp
        costs = self.search.stage_costs(self.cand, stages)
        for s in range(p):
            hint[self.E[s]] = float(costs.compute(s, bounds[s], bounds[s + 1]))
            if s < p - 1:
                hint[self.P[s]] = float(costs.p2p(s, bounds[s + 1]))
        hint[self.Emax] = max(hint[self.E[s]] for s in range(p))
        hint[self.ARmax] = max(float(costs.allreduce(s, bounds[s], bounds[s + 1])) for s in range(p))


def build(search, cand, fixed_stages=None) -> Formulation:
    """The program of a candidate: fixed placement (``fixed_stages``) or, without it, free grouping."""
    prog = Program(search, cand)
    grouping = None
    if fixed_stages is not None:
        prog.fixed_rows(search.stage_costs(cand, fixed_stages))
    else:
        grouping = FreeGrouping(prog, class_terms(search.tables, cand))
    terms = prog.objective()

    def decode(values):
        bounds = prog.layers.bounds(values)
        return bounds, (fixed_stages if grouping is None else grouping.decode(values))

    def hint_from(bounds, stages):
        prog.mdl.hint.clear()
        prog.layers.hint(bounds, prog.mdl.hint)
        prog.hint_times(bounds, stages)
        if grouping is not None:
            grouping.hint(stages, prog.mdl.hint)

    return Formulation(prog.mdl, decode, hint_from, terms,
                       {"node_classes": 0 if grouping is None else len(grouping.classes)})
