"""The mixed-integer program of one candidate (tp, dp, pp, micro-batch).

The equations are stated in ``formulations/mip.md``; names here follow it:
Y[s,l] (layer l runs on a stage <= s), z[s,l] = Y[s,l] - Y[s-1,l] (layer l on
stage s), e[s,l] = Y[s,l] - Y[s,l+1] (l is stage s's last layer), E[s], Emax,
P[s], ARmax, and for free grouping x[s,c] (groups of node class c, aggregated),
y[s,j] (groups of node j, for nodes that can host a whole stage), u[s,c]
(stage s uses class c), loc[s,j] (stage s sits in node j), sh[s,j] (stages s
and s+1 share node j), any[s,t] (stage s holds a layer of tie group t).

Every coefficient comes from the cost model's
:class:`~amp_opt.model.costs.StageCosts` (or, for what does not depend on the
devices, :class:`~amp_opt.model.costs.CandidateTerms`), so the program prices a plan
exactly as the evaluator does (up to the integer resolution of CP-SAT, see
``backends.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ...model.classes import NodeClass, node_classes
from ...model.costs import CandidateTerms, allreduce_factor
from ..grouping import assign_groups
from .model import BIN, INT, TIME, LinearModel, lin

CONST = -1  # key of the constant term in an expression


@dataclass(frozen=True)
class ClassTerms:
    """A node class (eq. M10) at one candidate: its groups, capacity and layer times."""

    node_class: NodeClass
    groups_per_node: int
    capacity: float  # bytes per device
    times: np.ndarray  # seconds per layer for one micro-batch on a group of this class
    per_node: bool  # a whole stage fits in one node: modelled node by node (eq. M11)

    @property
    def index(self) -> int:
        return self.node_class.index

    @property
    def nodes(self) -> tuple[int, ...]:
        return self.node_class.nodes

    @property
    def inter(self) -> float:
        return self.node_class.inter

    @property
    def intra(self) -> float:
        return self.node_class.intra


@dataclass
class Formulation:
    model: LinearModel
    decode: Callable[[dict[int, float]], tuple[tuple[int, ...], tuple]]  # values -> (bounds, stages)
    hint_from: Callable[[tuple[int, ...], tuple], None]  # plan -> sets model.hint
    terms: int  # rounded coefficients on the objective's path (for the integer tolerance)
    extra: dict = field(default_factory=dict)


def build(search, cand, fixed_stages=None) -> Formulation:
    """The program of a candidate: fixed placement (``fixed_stages``) or, without it, free grouping."""
    instance, tables, model = search.instance, search.tables, search.model
    p = cand.pp
    L = instance.num_layers
    free = fixed_stages is None
    terms = CandidateTerms(tables, cand)
    fixed = None if free else model.stage_costs(tables, cand, fixed_stages)
    mdl = LinearModel()
    enforce_memory = model.enforces_memory

    # -- layer assignment (eq. M1-M3) -------------------------------------------
    Y = {}
    for s in range(p - 1):
        for l in range(L):
            lo = 1 if l <= s else 0  # every stage is non-empty, so layer l <= s sits on a stage <= s
            hi = 0 if l >= L - (p - 1 - s) else 1  # leave a layer for each later stage
            Y[s, l] = mdl.var(f"Y[{s},{l}]", lo, hi, BIN)

    def Yx(s, l):
        if s < 0:
            return {}
        if s >= p - 1:
            return {CONST: 1.0}
        return {Y[s, l]: 1.0}

    def z(s, l):
        return lin(Yx(s, l), (-1.0, Yx(s - 1, l)))

    def e(s, l):
        return lin(Yx(s, l), (-1.0, Yx(s, l + 1))) if l < L - 1 else Yx(s, l)

    for s in range(p - 1):
        for l in range(L - 1):
            mdl.add(lin({Y[s, l]: 1}, (-1, {Y[s, l + 1]: 1})), ">=", 0, "count", f"prefix[{s},{l}]")
        if s < p - 2:
            for l in range(L):
                mdl.add(lin({Y[s + 1, l]: 1}, (-1, {Y[s, l]: 1})), ">=", 0, "count", f"order[{s},{l}]")
    for s in range(p):
        mdl.add(lin(*[z(s, l) for l in range(L)]), ">=", 1, "count", f"nonempty[{s}]")

    # -- parameters per stage, tied tensors once (eq. M4) -------------------------
    sums = terms.sums
    ties = sums.ties
    anyv = {}
    for s in range(p):
        for t, (members, shared) in enumerate(ties):
            anyv[s, t] = mdl.var(f"any[{s},{t}]", 0, 1, BIN)
            for l in members:
                mdl.add(lin({anyv[s, t]: 1}, (-1, z(s, int(l)))), ">=", 0, "count", f"tie[{s},{t},{l}]")

    def params(s):
        terms = [(float(sums.params[l]), z(s, l)) for l in range(L)]
        for t, (members, shared) in enumerate(ties):
            terms += [(-shared, z(s, int(l))) for l in members]
            terms.append((shared, {anyv[s, t]: 1}))
        return lin(*terms)

    total_params = float(sums.params.sum())
    vol = terms.volume if free else fixed.p2p_volume()

    # -- compute (eq. M5, M6) --------------------------------------------------
    E = [mdl.var(f"E[{s}]", 0, 0, TIME) for s in range(p)]
    Emax = mdl.var("Emax", 0, 0, TIME)
    P = [mdl.var(f"P[{s}]", 0, 0, TIME) for s in range(p - 1)]
    ARmax = mdl.var("ARmax", 0, 0, TIME)
    ub = {"E": 0.0, "P": 0.0, "AR": 0.0}

    if not free:
        for s in range(p):
            for times in fixed.layer_times(s):
                mdl.add(lin({E[s]: 1}, *[(-float(times[l]), z(s, l)) for l in range(L)]), ">=", 0, "time",
                        f"compute[{s}]")
                ub["E"] = max(ub["E"], float(times.sum()))
            if s < p - 1:
                phi = fixed.p2p_factor(s)
                mdl.add(lin({P[s]: 1}, *[(-float(vol[l] * phi), e(s, l)) for l in range(L)]), ">=", 0, "time",
                        f"p2p[{s}]")
                ub["P"] = max(ub["P"], float(vol.max() * phi))
            a = fixed.allreduce_factor(s)
            mdl.add(lin({ARmax: 1}, (-a, params(s))), ">=", 0, "time", f"allreduce[{s}]")
            ub["AR"] = max(ub["AR"], a * total_params)
            if enforce_memory:
                _memory_row(mdl, terms, s, params(s), z, L, {}, fixed.capacity[s], None, f"memory[{s}]")
        classes: list[ClassTerms] = []
        grouping_vars = {}
    else:
        classes = _class_terms(tables, cand)
        grouping_vars = _grouping(mdl, terms, classes, z, e, params, (E, P, ARmax), vol, ub, enforce_memory)

    for s in range(p):
        mdl.add(lin({Emax: 1}, (-1, {E[s]: 1})), ">=", 0, "time", f"bottleneck[{s}]")
    for v, key in [(Emax, "E"), (ARmax, "AR")] + [(x, "E") for x in E] + [(x, "P") for x in P]:
        mdl.vars[v].ub = ub[key] * (1 + 1e-6) + 1e-12  # slack for float round-off in hints

    # -- objective (eq. M9) ------------------------------------------------------
    w = terms.n_micro - 1
    mdl.objective = lin({Emax: float(w)}, *[{x: 1.0} for x in E], *[{x: 1.0} for x in P], {ARmax: 1.0})

    def bounds_of(values):
        out = [0]
        for s in range(p - 1):
            out.append(int(round(sum(values[Y[s, l]] for l in range(L)))))
        out.append(L)
        return tuple(out)

    def decode(values):
        bounds = bounds_of(values)
        if not free:
            return bounds, fixed_stages
        return bounds, _decode_groups(instance, cand, classes, grouping_vars, values)

    def hint_from(bounds, stages):
        mdl.hint.clear()
        for s in range(p - 1):
            for l in range(L):
                mdl.hint[Y[s, l]] = 1.0 if l < bounds[s + 1] else 0.0
        costs = model.stage_costs(tables, cand, stages)
        for s in range(p):
            k, l = bounds[s], bounds[s + 1]
            mdl.hint[E[s]] = float(costs.compute(s, k, l))
            if s < p - 1:
                mdl.hint[P[s]] = float(costs.p2p(s, l))
            for t, (members, _) in enumerate(ties):
                mdl.hint[anyv[s, t]] = float(any(k <= int(i) < l for i in members))
        mdl.hint[Emax] = max(mdl.hint[E[s]] for s in range(p))
        mdl.hint[ARmax] = max(float(costs.allreduce(s, bounds[s], bounds[s + 1])) for s in range(p))
        if free:
            _hint_groups(instance, cand, classes, grouping_vars, stages, mdl.hint)

    # Rounded coefficients on the objective's path: w * L (Emax), L (sum E), p (P), L (AR).
    return Formulation(mdl, decode, hint_from, (w + 2) * L + p, {"node_classes": len(classes)})


def _memory_row(mdl, terms: CandidateTerms, s: int, params_expr, z, L, guard: dict, capacity: float, big_m, name):
    """Bytes per device of stage s <= capacity (+ big-M slack when guarded) (eq. M8)."""
    act = terms.sums.activation_memory
    inflight = terms.in_flight(s) * terms.micro_batch
    expr = lin((terms.state_bytes_per_param, params_expr), *[(float(inflight * act[l]), z(s, l)) for l in range(L)])
    rhs = capacity - terms.instance.training.memory_reserve
    if guard:
        expr = lin(expr, (big_m, guard))  # + M * has  <=  cap + M
        rhs += big_m
    mdl.add(expr, "<=", rhs, "bytes", name)


def _class_terms(tables, cand) -> list[ClassTerms]:
    """Every node class of the instance at a candidate (eq. M10, M11)."""
    inst = tables.instance
    return [ClassTerms(c, c.groups_per_node(cand.tp), inst.device_types[c.device_type].memory,
                       tables.layer_times(c.device_type, c.intra, cand.tp, cand.micro_batch).seconds,
                       per_node=c.groups_per_node(cand.tp) >= cand.dp)
            for c in node_classes(inst)]


def _grouping(mdl, terms: CandidateTerms, classes: list[ClassTerms], z, e, params, time_vars, vol, ub,
              enforce_memory):
    """Variables and rows of free device grouping (eq. M10-M14)."""
    instance, L = terms.instance, terms.instance.num_layers
    d, p, b = terms.dp, terms.pp, terms.micro_batch
    E, P, ARmax = time_vars
    total_params = float(terms.sums.params.sum())

    x, y, u, loc, sh = {}, {}, {}, {}, {}
    for s in range(p):
        for c in classes:
            u[s, c.index] = mdl.var(f"u[{s},{c.index}]", 0, 1, BIN)
            if c.per_node:
                for j in c.nodes:
                    y[s, j] = mdl.var(f"y[{s},{j}]", 0, min(d, c.groups_per_node), INT)
                    loc[s, j] = mdl.var(f"loc[{s},{j}]", 0, 1, BIN)
                    # u >= y/d; loc = [y == d]: d loc <= y and loc >= y - (d-1)
                    mdl.add({u[s, c.index]: d, y[s, j]: -1}, ">=", 0, "count", f"use[{s},{j}]")
                    mdl.add({y[s, j]: 1, loc[s, j]: -d}, ">=", 0, "count", f"local_lo[{s},{j}]")
                    mdl.add({loc[s, j]: 1, y[s, j]: -1}, ">=", -(d - 1), "count", f"local_hi[{s},{j}]")
            else:
                cap = min(d, c.groups_per_node * len(c.nodes))
                x[s, c.index] = mdl.var(f"x[{s},{c.index}]", 0, cap, INT)
                mdl.add({u[s, c.index]: cap, x[s, c.index]: -1}, ">=", 0, "count", f"use[{s},{c.index}]")
        groups = [{x[s, c.index]: 1} for c in classes if not c.per_node]
        groups += [{y[s, j]: 1} for c in classes if c.per_node for j in c.nodes]
        mdl.add(lin(*groups), "==", d, "count", f"replicas[{s}]")
    for c in classes:
        if c.per_node:
            for j in c.nodes:
                mdl.add(lin(*[{y[s, j]: 1} for s in range(p)]), "==", c.groups_per_node, "count", f"node[{j}]")
        else:
            mdl.add(lin(*[{x[s, c.index]: 1} for s in range(p)]), "==", c.groups_per_node * len(c.nodes), "count",
                    f"class[{c.index}]")
    # Identical nodes modelled one by one: lexicographically non-increasing columns on a prefix of stages.
    for c in classes:
        if c.per_node and len(c.nodes) > 1:
            W = c.groups_per_node + 1
            K = max(1, min(p, int(math.log(1e6) / math.log(W))))
            for j, j2 in zip(c.nodes, c.nodes[1:]):
                mdl.add(lin(*[(float(W ** (K - 1 - s)), {y[s, j]: 1}) for s in range(K)],
                            *[(-float(W ** (K - 1 - s)), {y[s, j2]: 1}) for s in range(K)]),
                        ">=", 0, "count", f"symmetry[{j},{j2}]")
    loc_s = [lin(*[{loc[s, j]: 1} for c in classes if c.per_node for j in c.nodes]) for s in range(p)]
    for s in range(p):
        if loc_s[s]:
            mdl.add(loc_s[s], "<=", 1, "count", f"one_home[{s}]")
    for s in range(p - 1):
        for c in classes:
            if c.per_node:
                for j in c.nodes:
                    sh[s, j] = mdl.var(f"sh[{s},{j}]", 0, 1, BIN)
                    mdl.add({sh[s, j]: 1, loc[s, j]: -1}, "<=", 0, "count", f"share_a[{s},{j}]")
                    mdl.add({sh[s, j]: 1, loc[s + 1, j]: -1}, "<=", 0, "count", f"share_b[{s},{j}]")
                    mdl.add({sh[s, j]: 1, loc[s, j]: -1, loc[s + 1, j]: -1}, ">=", -1, "count", f"share_c[{s},{j}]")
    sh_s = [lin(*[{sh[s, j]: 1} for c in classes if c.per_node for j in c.nodes]) for s in range(p - 1)]

    # Compute: the slowest class present sets the pace (eq. M5 with big-M).
    for s in range(p):
        for c in classes:
            M = 1.001 * float(c.times.sum())  # slack so that rounded coefficients never bind when unused
            mdl.add(lin({E[s]: 1}, *[(-float(c.times[l]), z(s, l)) for l in range(L)], (-M, {u[s, c.index]: 1})),
                    ">=", -M, "time", f"compute[{s},{c.index}]")
            ub["E"] = max(ub["E"], M)
    # p2p over the slowest link the two stages use, or the shared node's intra link (eq. M7).
    vmax = float(vol.max()) if len(vol) else 0.0
    for s in range(p - 1):
        for c in classes:
            M = vmax / c.inter
            for t in (s, s + 1):
                mdl.add(lin({P[s]: 1}, *[(-float(vol[l] / c.inter), e(s, l)) for l in range(L)],
                            (-M, {u[t, c.index]: 1}), (M, sh_s[s])), ">=", -M, "time", f"p2p[{s},{c.index},{t}]")
            ub["P"] = max(ub["P"], M)
            if c.per_node:
                M2 = vmax / c.intra
                for j in c.nodes:
                    mdl.add(lin({P[s]: 1}, *[(-float(vol[l] / c.intra), e(s, l)) for l in range(L)],
                                (-M2, {sh[s, j]: 1})), ">=", -M2, "time", f"p2p_shared[{s},{j}]")
                ub["P"] = max(ub["P"], M2)
    # Allreduce over the ring's slowest link, or the node's intra link when the stage sits in one (eq. M6).
    for s in range(p):
        pe = params(s)
        for c in classes:
            a = allreduce_factor(instance, d, c.inter)
            M = a * total_params
            mdl.add(lin({ARmax: 1}, (-a, pe), (-M, {u[s, c.index]: 1}), (M, loc_s[s])), ">=", -M, "time",
                    f"allreduce[{s},{c.index}]")
            ub["AR"] = max(ub["AR"], M)
            if c.per_node:
                a2 = allreduce_factor(instance, d, c.intra)
                M2 = a2 * total_params
                for j in c.nodes:
                    mdl.add(lin({ARmax: 1}, (-a2, pe), (-M2, {loc[s, j]: 1})), ">=", -M2, "time",
                            f"allreduce_local[{s},{j}]")
                ub["AR"] = max(ub["AR"], M2)
    # Memory: every device type in the stage must hold it (eq. M8).
    if enforce_memory:
        act_total = float(terms.sums.activation_memory.sum())
        for s in range(p):
            worst = total_params * terms.state_bytes_per_param + terms.in_flight(s) * b * act_total
            for c in classes:
                room = c.capacity - instance.training.memory_reserve
                big_m = max(0.0, worst - room)
                if big_m == 0.0 and room >= 0:
                    continue
                _memory_row(mdl, terms, s, params(s), z, L, {u[s, c.index]: 1}, c.capacity, max(big_m, 1.0),
                            f"memory[{s},{c.index}]")
    return {"x": x, "y": y, "u": u, "loc": loc, "sh": sh}


def _decode_groups(instance, cand, classes, gv, values):
    """Device ids per stage and replica from the grouping variables."""
    free = {c.index: {j: c.groups_per_node for j in c.nodes} for c in classes if not c.per_node}
    counts = []
    for s in range(cand.pp):
        stage = []
        for c in classes:
            if c.per_node:
                stage += [(j, int(round(values[gv["y"][s, j]]))) for j in c.nodes]
            else:
                need = int(round(values[gv["x"][s, c.index]]))
                for j in c.nodes:  # fill the class's nodes in order
                    take = min(need, free[c.index][j])
                    stage.append((j, take))
                    free[c.index][j] -= take
                    need -= take
        counts.append([(j, k) for j, k in stage if k])
    return assign_groups(instance, cand.tp, counts)


def _hint_groups(instance, cand, classes, gv, stages, hint):
    node_of = instance.device_node
    d = cand.dp
    counts = [{} for _ in stages]
    for s, stage in enumerate(stages):
        for group in stage:
            j = int(node_of[group[0]])
            counts[s][j] = counts[s].get(j, 0) + 1
    for s in range(len(stages)):
        for c in classes:
            total = sum(counts[s].get(j, 0) for j in c.nodes)
            hint[gv["u"][s, c.index]] = float(total > 0)
            if c.per_node:
                for j in c.nodes:
                    hint[gv["y"][s, j]] = float(counts[s].get(j, 0))
                    hint[gv["loc"][s, j]] = float(counts[s].get(j, 0) == d)
            else:
                hint[gv["x"][s, c.index]] = float(total)
    for (s, j), v in gv["sh"].items():
        hint[v] = float(hint[gv["loc"][s, j]] and hint[gv["loc"][s + 1, j]])
