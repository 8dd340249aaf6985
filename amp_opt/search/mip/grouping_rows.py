"""Free device grouping in the programs (``formulations/mip.md`` eq. M5-M8 free, M10-M12).

Node classes (identical nodes, eq. M10) give groups by count; a class whose nodes can
hold a whole stage (g_c >= d) is modelled node by node (M11), so that the program knows
when a stage or a boundary stays inside one node and uses its intra-node link.  Every
max over the classes a stage uses is a family of big-M rows, one per class.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...model.classes import NodeClass, node_classes
from ...model.costs.terms import memory_bandwidth, overlap_share
from ..free_grouping import assign_groups
from .linear import BIN, INT, TIME, lin


@dataclass(frozen=True)
class ClassTerms:
    """A node class (eq. M10) at one candidate: its groups, capacity and layer times."""

    node_class: NodeClass
    groups_per_node: int
    capacity: float  # bytes per device
    times: np.ndarray  # seconds per layer for one micro-batch on a group of this class
    per_node: bool  # a whole stage fits in one node: modelled node by node (eq. M11)
    step: float = 0.0  # seconds per micro-batch a stage of this class spends beyond its layers (calibration C3)
    extra: np.ndarray | None = None  # seconds a layer adds when the program has it recompute (M15, M16)

    @property
    def index(self) -> int:
        return self.node_class.index

    @property
    def nodes(self) -> tuple[int, ...]:
        return self.node_class.nodes


def class_terms(terms) -> list[ClassTerms]:
    """Every node class of the instance at a candidate (eq. M10, M11), with its effective layer
    times (eq. H8: the candidate's recomputation and context parallelism; under the block method
    or a per-stage choice, without recomputation and what a recomputed layer adds, M15, M16)."""
    inst, cand = terms.instance, terms.cand
    out = []
    for c in node_classes(inst):
        base = terms.layer_seconds(c.device_type, c.intra, terms.base_mode(0), c.intra_latency)
        varies = terms.base_mode(0) != cand.recompute  # the program decides which layers recompute
        extra = terms.layer_seconds(c.device_type, c.intra, cand.recompute, c.intra_latency) - base if varies else None
        out.append(ClassTerms(c, c.groups_per_node(cand.tp), inst.device_types[c.device_type].capacity, base,
                              per_node=c.groups_per_node(cand.tp) >= cand.replicas,
                              step=inst.device_types[c.device_type].step_overhead, extra=extra))
    return out


class FreeGrouping:
    """The grouping variables and rows of one program; ``prog`` is its :class:`~.formulation.Program`."""

    def __init__(self, prog, classes: list[ClassTerms]):
        self.prog, self.classes = prog, classes
        self.x, self.y, self.u, self.loc, self.sh = {}, {}, {}, {}, {}
        self._groups()
        if prog.search.options.symmetry:  # off in the -nosym ablation
            self._symmetry()
        self._locality()
        self._ring()
        self._compute()
        self._p2p()
        self._allreduce()
        if prog.enforce_memory:
            self._memory()

    def _per_node(self):
        """(class, node) of every node modelled one by one."""
        return [(c, j) for c in self.classes if c.per_node for j in c.nodes]

    def _groups(self) -> None:
        """(M10) groups per stage and class (or node); u[s,c] marks the classes a stage uses;
        (M11) loc[s,j] = [stage s takes all its groups from node j]."""
        mdl, d, p = self.prog.mdl, self.prog.cand.replicas, self.prog.cand.pp
        x, y, u, loc = self.x, self.y, self.u, self.loc
        for s in range(p):
            for c in self.classes:
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
            groups = [{x[s, c.index]: 1} for c in self.classes if not c.per_node]
            groups += [{y[s, j]: 1} for _, j in self._per_node()]
            mdl.add(lin(*groups), "==", d, "count", f"replicas[{s}]")
        for c in self.classes:
            if c.per_node:
                for j in c.nodes:
                    mdl.add(lin(*[{y[s, j]: 1} for s in range(p)]), "==", c.groups_per_node, "count", f"node[{j}]")
            else:
                mdl.add(lin(*[{x[s, c.index]: 1} for s in range(p)]), "==", c.groups_per_node * len(c.nodes),
                        "count", f"class[{c.index}]")

    def _symmetry(self) -> None:
        """(M12) identical nodes modelled one by one: lexicographically non-increasing columns on
        a prefix of stages (weights (g+1)^(K-1-s), K keeping them below 1e6)."""
        mdl, p, y = self.prog.mdl, self.prog.cand.pp, self.y
        for c in self.classes:
            if c.per_node and len(c.nodes) > 1:
                W = c.groups_per_node + 1
                K = max(1, min(p, int(math.log(1e6) / math.log(W))))
                for j, j2 in zip(c.nodes, c.nodes[1:]):
                    mdl.add(lin(*[(float(W ** (K - 1 - s)), {y[s, j]: 1}) for s in range(K)],
                                *[(-float(W ** (K - 1 - s)), {y[s, j2]: 1}) for s in range(K)]),
                            ">=", 0, "count", f"symmetry[{j},{j2}]")

    def _locality(self) -> None:
        """(M11) a stage sits in at most one node; sh[s,j] = [stages s and s+1 both sit in node j]."""
        mdl, p, loc, sh = self.prog.mdl, self.prog.cand.pp, self.loc, self.sh
        self.loc_s = [lin(*[{loc[s, j]: 1} for _, j in self._per_node()]) for s in range(p)]
        for s in range(p):
            if self.loc_s[s]:
                mdl.add(self.loc_s[s], "<=", 1, "count", f"one_home[{s}]")
        for s in range(p - 1):
            for _, j in self._per_node():
                sh[s, j] = mdl.var(f"sh[{s},{j}]", 0, 1, BIN)
                mdl.add({sh[s, j]: 1, loc[s, j]: -1}, "<=", 0, "count", f"share_a[{s},{j}]")
                mdl.add({sh[s, j]: 1, loc[s + 1, j]: -1}, "<=", 0, "count", f"share_b[{s},{j}]")
                mdl.add({sh[s, j]: 1, loc[s, j]: -1, loc[s + 1, j]: -1}, ">=", -1, "count", f"share_c[{s},{j}]")
        self.sh_s = [lin(*[{sh[s, j]: 1} for _, j in self._per_node()]) for s in range(p - 1)]

    def _ring(self) -> None:
        """(H10 in M6's form) X[s]: stage s's ring traffic per micro-batch over its slowest link, or
        the node's intra link when the stage sits in one, and its messages at the largest latency
        (H19); only when there is such traffic."""
        prog = self.prog
        self.X = {}
        for s in range(prog.cand.pp):
            traffic = prog.comm_bytes(s)
            if not traffic:
                continue
            msgs = prog.comm_messages(s)
            worst, count = sum(abs(c) for c in traffic.values()), sum(abs(c) for c in msgs.values())
            top = max(max(c.node_class.inter_latency, c.node_class.intra_latency) for c in self.classes)
            self.X[s] = prog.mdl.var(f"X[{s}]", 0, worst / min(self._inter(c) for c in self.classes) + top * count, TIME)
            self._link_rows(s, self.X[s], traffic, worst, f"ring[{s}", (msgs, count))

    def _link_rows(self, s: int, var: int, expr: dict, worst: float, name: str, messages=({}, 0.0)) -> None:
        """var >= expr / link of stage s (+ messages x latency, H19): one row per class (its inter-node
        link, off when the stage sits in one node) and larger-latency class, and one per node that can
        hold the stage (its intra-node link and latency)."""
        prog = self.prog
        msgs, count = messages
        for c in self.classes:
            a = 1.0 / self._inter(c)
            for c4 in self.classes:  # the latency's class: c's own, or one with a larger one
                if c4 is not c and c4.node_class.inter_latency <= c.node_class.inter_latency:
                    continue
                lat = c4.node_class.inter_latency
                M = a * worst + lat * count
                uses = [(-M, {u: 1}) for u in dict.fromkeys([self.u[s, c.index], self.u[s, c4.index]])]
                prog.mdl.add(lin({var: 1}, (-a, expr), (-lat, msgs), *uses, (M, self.loc_s[s])),
                             ">=", -M * len(uses), "time", f"{name},{c.index},{c4.index}]")
            if c.per_node:
                a2, lat2 = 1.0 / c.node_class.intra, c.node_class.intra_latency
                M2 = a2 * worst + lat2 * count
                for j in c.nodes:
                    prog.mdl.add(lin({var: 1}, (-a2, expr), (-lat2, msgs), (-M2, {self.loc[s, j]: 1})), ">=", -M2,
                                 "time", f"{name}_local,{j}]")

    def _compute(self) -> None:
        """(M5) the slowest class present sets the pace: one big-M row per class (plus the ring, H10)."""
        prog = self.prog
        for s in range(prog.cand.pp):
            ring = {self.X[s]: 1.0} if s in self.X else {}
            for c in self.classes:
                work = float(c.times.sum()) + (0.0 if c.extra is None else float(c.extra.sum()))
                M = 1.001 * (work + c.step)  # slack so that rounded coefficients never bind when unused
                prog.mdl.add(lin({prog.E[s]: 1}, (-1.0, prog.stage_sum(s, c.times, c.extra)),
                                 (-M, {self.u[s, c.index]: 1}), (-1.0, ring)), ">=", c.step - M, "time",
                             f"compute[{s},{c.index}]")
                prog.ub["E"] = max(prog.ub["E"], M + (prog.mdl.vars[self.X[s]].ub if ring else 0.0))

    def _p2p(self) -> None:
        """(M7) p2p over the slowest link the two stages use, or the shared node's intra link, plus
        the largest latency of the classes they use (H19): a row per pair of classes (one for the
        bandwidth, one for the latency), only where the second's latency is the larger."""
        prog = self.prog
        v = prog.cand.virtual_stages
        vol = prog.vol * v  # an interleaved boundary is crossed v times (H11)
        vmax = float(vol.max()) if len(vol) else 0.0
        lat = {c.index: v * c.node_class.inter_latency for c in self.classes}
        for s in range(prog.cand.pp - 1):
            for c in self.classes:
                inter, intra = c.node_class.inter, c.node_class.intra
                for c2 in self.classes:
                    if c2 is not c and lat[c2.index] <= lat[c.index]:
                        continue  # the row of c alone is as strong
                    M = vmax / inter + lat[c2.index]
                    for t in (s, s + 1):
                        for t2 in ((t,) if c2 is c else (s, s + 1)):
                            uses = dict.fromkeys([self.u[t, c.index], self.u[t2, c2.index]])
                            prog.mdl.add(lin({prog.P[s]: 1}, *[(-float(vol[l] / inter), prog.layers.e(s, l))
                                                               for l in range(prog.L)],
                                             *[(-M, {u: 1}) for u in uses], (M, self.sh_s[s])),
                                         ">=", lat[c2.index] - M * len(uses), "time",
                                         f"p2p[{s},{c.index},{t},{c2.index},{t2}]")
                    prog.ub["P"] = max(prog.ub["P"], M)
                if c.per_node:
                    own = v * c.node_class.intra_latency
                    M2 = vmax / intra + own
                    for j in c.nodes:
                        prog.mdl.add(lin({prog.P[s]: 1}, *[(-float(vol[l] / intra), prog.layers.e(s, l))
                                                           for l in range(prog.L)],
                                         (-M2, {self.sh[s, j]: 1})), ">=", own - M2, "time", f"p2p_shared[{s},{j}]")
                    prog.ub["P"] = max(prog.ub["P"], M2)

    def _allreduce(self) -> None:
        """(M6) allreduce over the ring's slowest link, or the node's intra link when the stage sits in
        one; then (H15) the optimizer step at the slowest device memory of the stage: a row per pair
        of classes the stage uses (the slowest link and the slowest memory may be in different ones).
        (H18) Where the reduction overlaps the backward pass, each row less the window of every
        class the stage uses (the window is its fastest class's), and a row for the step alone."""
        prog = self.prog
        sync, total = prog.terms.allreduce_bytes_per_param(), prog.total_params
        step = {c.index: prog.terms.optimizer_bytes_per_param() / memory_bandwidth(prog.instance, (c.node_class.device_type,))
                for c in self.classes}
        kappa = overlap_share(prog.instance)
        steps = prog.terms.allreduce_messages()  # H19: the ring's steps at the largest latency of its classes
        lat = {c.index: steps * c.node_class.inter_latency for c in self.classes}
        for s in range(prog.cand.pp):
            pe = prog.layers.params(s)
            windows = [(c3, prog.stage_sum(s, c3.times, c3.extra)) for c3 in self.classes] if kappa else [(None, {})]
            for c in self.classes:
                for c2 in self.classes:
                    if c2 is not c and step[c2.index] <= step[c.index]:
                        continue  # the row of c alone, or of a pair with a slower memory, is as strong
                    a = sync / self._inter(c) + step[c2.index]
                    base = c2 if lat[c2.index] > lat[c.index] else c
                    for c4 in self.classes:  # the latency's class: the larger of c's and c2's, or a larger one
                        if c4 is not base and lat[c4.index] <= lat[base.index]:
                            continue
                        M = a * total + lat[c4.index]
                        for c3, window in windows:
                            classes = {c.index, c2.index, c4.index} | ({c3.index} if c3 is not None else set())
                            uses = [(-M, {self.u[s, i]: 1}) for i in sorted(classes)]
                            prog.mdl.add(lin({prog.ARmax: 1}, (-a, pe), (kappa, window), *uses, (M, self.loc_s[s])),
                                         ">=", lat[c4.index] - M * len(uses), "time",
                                         f"allreduce[{s},{c.index},{c2.index},{c3.index if c3 is not None else '-'},"
                                         f"{c4.index}]")
                        prog.ub["AR"] = max(prog.ub["AR"], M)
                if kappa and step[c.index]:
                    M = step[c.index] * total
                    prog.mdl.add(lin({prog.ARmax: 1}, (-step[c.index], pe), (-M, {self.u[s, c.index]: 1})), ">=", -M,
                                 "time", f"step[{s},{c.index}]")
                if c.per_node:
                    a2 = sync / c.node_class.intra + step[c.index]
                    own_lat = steps * c.node_class.intra_latency
                    M2 = a2 * total + own_lat
                    own = prog.stage_sum(s, c.times, c.extra) if kappa else {}
                    for j in c.nodes:
                        prog.mdl.add(lin({prog.ARmax: 1}, (-a2, pe), (kappa, own), (-M2, {self.loc[s, j]: 1})), ">=",
                                     own_lat - M2, "time", f"allreduce_local[{s},{j}]")
                    prog.ub["AR"] = max(prog.ub["AR"], M2)

    def _inter(self, c) -> float:
        """Bytes/s one data-parallel ring of a stage gets leaving a node of class c (H4, H17)."""
        return c.node_class.ring_inter(self.prog.cand.tp)

    def _memory(self) -> None:
        """(M8) every device type in the stage must hold it; rows that can never bind are left out."""
        prog, terms = self.prog, self.prog.terms
        for s in range(prog.cand.pp):
            buffers = prog._peak(s)
            worst = terms.allocator_scale * (prog.total_params * terms.state_bytes_per_param
                                             + terms.in_flight(s) * terms.micro_batch * float(terms.layer_bytes(s).sum())
                                             + sum(prog.mdl.vars[v].ub for v in buffers))
            for c in self.classes:
                room = c.capacity - terms.framework_bytes
                big_m = max(0.0, worst - room)
                if big_m == 0.0 and room >= 0:
                    continue
                prog.memory_row(s, c.capacity, {self.u[s, c.index]: 1}, max(big_m, 1.0), f"memory[{s},{c.index}]")

    def decode(self, values: dict):
        """Device ids per stage and replica from the grouping variables."""
        cand = self.prog.cand
        free = {c.index: {j: c.groups_per_node for j in c.nodes} for c in self.classes if not c.per_node}
        counts = []
        for s in range(cand.pp):
            stage = []
            for c in self.classes:
                if c.per_node:
                    stage += [(j, int(round(values[self.y[s, j]]))) for j in c.nodes]
                else:
                    need = int(round(values[self.x[s, c.index]]))
                    for j in c.nodes:  # fill the class's nodes in order
                        take = min(need, free[c.index][j])
                        stage.append((j, take))
                        free[c.index][j] -= take
                        need -= take
            counts.append([(j, k) for j, k in stage if k])
        return assign_groups(self.prog.instance, cand.tp, counts)

    def hint(self, stages, hint: dict) -> None:
        """The grouping variables' values for a plan's device groups."""
        node_of, d = self.prog.instance.device_node, self.prog.cand.replicas
        counts = [{} for _ in stages]
        for s, stage in enumerate(stages):
            for group in stage:
                j = int(node_of[group[0]])
                counts[s][j] = counts[s].get(j, 0) + 1
        for s in range(len(stages)):
            for c in self.classes:
                total = sum(counts[s].get(j, 0) for j in c.nodes)
                hint[self.u[s, c.index]] = float(total > 0)
                if c.per_node:
                    for j in c.nodes:
                        hint[self.y[s, j]] = float(counts[s].get(j, 0))
                        hint[self.loc[s, j]] = float(counts[s].get(j, 0) == d)
                else:
                    hint[self.x[s, c.index]] = float(total)
        for (s, j), v in self.sh.items():
            hint[v] = float(hint[self.loc[s, j]] and hint[self.loc[s + 1, j]])
