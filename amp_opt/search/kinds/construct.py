"""Plans from stage kinds (``formulations/mip.md`` eq. K5, K6).

A kind multiset (how many stages of each kind) comes from a known plan
(:func:`multiset_of`) or from a relaxed path of the kind bound, repaired to fit the
supply of groups (:func:`repair`, a small CP-SAT model).  The multiset DP
(:func:`multiset_paths`, eq. K6) lays it out exactly: which stage runs which kind on
which layers.  The groups are then realised per class by a maximum flow
(:func:`transport`, eq. K5) and every plan is scored by the evaluator.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ...model.costs import plan_of
from ...model.evaluate import evaluate
from ...model.ranges import INF, backtrack, band_min_sum_step
from ..free_grouping import assign_groups
from ..result import Incumbent
from .bound import Cell
from ...model.ranges import weighted as _weighted
from ..tuning import POLISH_RATE, POLISH_WORK
from .lagrangian import KindModel, KindPath, band_layout


@dataclass
class Pace:
    """How fast the multiset DP runs here, measured from its own runs: a budget in seconds
    becomes one in array operations at this rate (POLISH_RATE until a run has been timed).
    Measured on a 2-core AMD EPYC, the DP ran at 0.6-2.7e8 operations per second, so the
    assumed rate let a polish take 2-8 times the seconds it was given."""

    operations: float = 0.0
    seconds: float = 0.0

    def rate(self) -> float:
        return self.operations / self.seconds if self.seconds > 0.05 else POLISH_RATE

    def record(self, operations: float, seconds: float) -> None:
        self.operations += operations
        self.seconds += seconds


def transport(model: KindModel, kinds) -> np.ndarray | None:
    """Groups per (stage, class) realising a kind sequence, or None if the supply cannot (eq. K5).

    Every stage takes one group of each class of its kind; the remaining d - |S| groups
    come from its kind's classes, and every class gives all its groups: a transport
    problem, solved as a maximum flow.
    """
    import networkx as nx  # heavy (70 ms): imported when a plan is realised from kinds

    d, C = model.cand.replicas, len(model.classes)
    x = np.zeros((len(kinds), C), dtype=int)
    for s, i in enumerate(kinds):
        x[s, list(model.kinds[i])] = 1
    left = model.supply.astype(int) - x.sum(axis=0)
    if (left < 0).any():
        return None
    g = nx.DiGraph()
    for s, i in enumerate(kinds):
        g.add_edge("source", ("stage", s), capacity=d - len(model.kinds[i]))
        for c in model.kinds[i]:
            g.add_edge(("stage", s), ("class", c), capacity=int(left[c]))
    for c in range(C):
        g.add_edge(("class", c), "sink", capacity=int(left[c]))
    need = sum(d - len(model.kinds[i]) for i in kinds)
    flow, paths = nx.maximum_flow(g, "source", "sink")
    if flow < need:
        return None
    for s, i in enumerate(kinds):
        for c in model.kinds[i]:
            x[s, c] += paths[("stage", s)].get(("class", c), 0)
    return x


def realise(model: KindModel, counts: np.ndarray):
    """Device groups per stage from groups per (stage, class): each class hands out its
    nodes' groups in node order."""
    m = model.cand.tp
    pools = [[j for j in c.nodes for _ in range(c.devices // m)] for c in model.classes]  # a node per group
    taken = [0] * len(model.classes)
    per_stage = []
    for row in counts:
        use: dict[int, int] = {}
        for c, n in enumerate(row):
            for j in pools[c][taken[c]:taken[c] + int(n)]:
                use[j] = use.get(j, 0) + 1
            taken[c] += int(n)
        per_stage.append(sorted(use.items()))
    return assign_groups(model.instance, m, per_stage)


def multiset_of(model: KindModel, stages) -> dict[int, int] | None:
    """Kind -> number of stages of a placement (None if a stage's kind is not in the model)."""
    cls = {j: c for c, nc in enumerate(model.classes) for j in nc.nodes}
    index: dict[tuple, int] = {}
    for i, S in enumerate(model.kinds):
        index.setdefault(S, i)  # the first of the set's kinds: the multiset DP tries each mode
    node_of = model.instance.device_node
    out: dict[int, int] = {}
    for stage in stages:
        S = tuple(sorted({cls[int(node_of[group[0]])] for group in stage}))
        if S not in index:
            return None
        out[index[S]] = out.get(index[S], 0) + 1
    return out


def polish(model: KindModel, stages, thresholds, work: float = POLISH_WORK, pace: Pace | None = None) -> Incumbent | None:
    """Re-order and re-partition a plan's stages keeping how many stages of each kind it has
    (eq. K6), once per threshold pair (T, U) in ``thresholds`` (as many as ``work`` array
    operations allow; ``pace``, if given, learns from the run how fast they went).  Returns the
    best plan found, scored by the evaluator, or None."""
    multiset = multiset_of(model, stages)
    return None if multiset is None else _lay_out(model, multiset, thresholds, work, pace)


def _lay_out(model: KindModel, multiset: dict[int, int], thresholds, work: float,
             pace: Pace | None = None) -> Incumbent | None:
    """The multiset DP at as many threshold pairs as ``work`` array operations allow; each path
    realised and scored by the evaluator.  Kinds that behave the same are merged for the DP and
    handed back to its stages afterwards.  Returns the best as an Incumbent, or None."""
    merged: dict[int, int] = {}
    members: dict[int, list[int]] = {}
    for k, count in sorted(multiset.items()):
        k = int(model.canonical[k])  # the stage's mode is the DP's choice (siblings)
        rep = int(model.representative[k])
        merged[rep] = merged.get(rep, 0) + count
        members.setdefault(rep, []).extend([k] * count)
    states = int(np.prod([n + 1 for n in merged.values()]))
    window = model.L - model.cand.pp + 1
    kept, spent, budgeted = [], 0.0, 0.0
    least = min(model.weight.values())  # thresholds are on the weighted compute (:class:`KindModel`)
    for T, U in thresholds:
        for k in merged:
            usable = np.any([(_weighted(model.compute[j], least) <= T) & (model.allreduce[j] <= U) & model.fitting[j]
                             for j in model.siblings[k]], axis=0)
            first, last = np.nonzero(usable)
            spent += states * len(model.links) * window * (int((last - first).max()) if len(first) else 1)
        if spent > work:
            break
        kept.append((T, U))
        budgeted = spent
    if not kept:
        return None
    T, U = (np.array(v, dtype=float) for v in zip(*kept))
    best = None
    c = model.cand
    began = time.perf_counter()
    paths = multiset_paths(model, merged, T, U)
    if pace is not None:
        pace.record(budgeted, time.perf_counter() - began)
    for found in paths:
        if found is None:
            continue
        handed = {rep: iter(kinds) for rep, kinds in members.items()}
        kinds = [next(handed[k]) for k in found[1].kinds]
        counts = transport(model, kinds)
        if counts is None:
            continue
        placed = realise(model, counts)
        partition = model.chunks or found[1].boundaries
        plan = plan_of(model.cost_model, model.tables, c, partition, placed, chunks=model.chunks)
        ev = evaluate(model.tables.instance, plan, model.cost_model, tables=model.tables)
        if ev.feasible and (best is None or ev.predicted_time < best.value):
            best = Incumbent.of_plan(ev.predicted_time, c, plan)
    return best


def _multiset_states(need: np.ndarray):
    """The states of the multiset DP: vectors of stages of each kind used so far (mixed radix
    with digit a in 0..need[a]); per state its digits, level (stages placed) and row among
    the states of its level."""
    stride = np.concatenate([[1], np.cumprod(need[:-1] + 1)]).astype(int)
    total = int(np.prod(need + 1))
    used = (np.arange(total)[:, None] // stride[None, :]) % (need + 1)[None, :]
    level = used.sum(axis=1)
    row_of = np.zeros(total, dtype=int)
    for s in range(int(need.sum()) + 1):
        members = np.flatnonzero(level == s)
        row_of[members] = np.arange(len(members))
    return stride, used, level, row_of


def _kind_arcs(model: KindModel, kinds, T: np.ndarray, U: np.ndarray):
    """Per kind of the multiset and micro-batches in flight: its compute on every usable range
    under each threshold pair, stored by (end l, length - 1) up to the longest it can use; the
    least over the kind's siblings (a per-stage recomputation mode: the faster that fits)."""
    pos = np.arange(model.L + 1)
    tables = {}
    for a, k in enumerate(kinds):
        ok = {(f, j): (model.fit_rank[j] >= model.flight_rank[f])[None]
              & (_weighted(model.compute[j], model.weight[f])[None] <= T[:, None, None])
              & (model.allreduce[j][None] <= U[:, None, None]) for f in model.flights for j in model.siblings[k]}
        starts, valid = band_layout(np.any([x.any(axis=0) for x in ok.values()], axis=0))
        for f in model.flights:
            tables[f, a] = np.min([np.where(ok[f, j][:, starts, pos[:, None]] & valid,
                                            model.compute[j][starts, pos[:, None]][None] * model.fill, INF)
                                   for j in model.siblings[k]], axis=0)
    return tables


def _least_link(values: np.ndarray, hop: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Over the link level of the previous stage (axis 1 of ``values``, a few levels), the least
    of ``values + hop`` and the first level reaching it, as an argmin would give, in one pass."""
    best = values[:, 0] + hop[0]
    level = np.zeros(best.shape, dtype=np.int8)
    for q in range(1, values.shape[1]):
        cand = values[:, q] + hop[q]
        better = cand < best
        np.copyto(best, cand, where=better)
        level[better] = q
    return best, level


def multiset_paths(model: KindModel, multiset: dict[int, int], T: np.ndarray, U: np.ndarray):
    """For each threshold pair (T[j], U[j]): the least-sum path using exactly ``multiset``
    (kind -> number of stages) with every stage's weighted compute <= T[j] and allreduce <= U[j] (eq. K6).

    A DP over (stages of each kind used so far, link level of the previous stage, layer
    position); p2p is charged at the slower link of the two stages, as in the relaxation.
    Returns a list of (sum of E + P, KindPath) or None per pair.  (About 65 lines: one vectorised
    DP over the multiset's states, level by level.)
    """
    p, L = model.cand.pp, model.L
    kinds = sorted(multiset)
    r, batch, B = len(kinds), len(T), len(model.links)
    need = np.array([multiset[k] for k in kinds])
    if need.sum() != p:
        return [None] * batch
    stride, used, level, row_of = _multiset_states(need)
    total = len(level)
    pos = np.arange(L + 1)
    tables = _kind_arcs(model, kinds, T, U)
    links = [int(model.link_of[k]) for k in kinds]
    values = np.full((1, B, batch, L + 1), INF)
    values[0, 0, :, 0] = 0.0
    back = []  # per stage: kind, range length - 1 and previous link level per (state row, link, pair, end)
    for s in range(p):
        f = model.in_flight[s]
        ls = slice(s + 1, L - p + s + 2)  # ends stage s can have
        here = np.flatnonzero(level == s)
        size = int((level == s + 1).sum())
        new = np.full((size, B, batch, L + 1), INF)
        kind = np.full((size, B, batch, L + 1), -1, dtype=np.int8)
        span = np.zeros((size, B, batch, L + 1), dtype=np.int16)
        came = np.zeros((size, B, batch, L + 1), dtype=np.int8)
        # Stage s starts where stage s-1 ended: only those positions hold finite values.
        prior = slice(s, L - p + s + 1)
        for a in range(r):
            b = links[a]
            src = here[used[here, a] < need[a]]
            hop = model.volume[prior] * model.p2p_factor[:, b][:, None, None]  # (previous link, batch, start)
            chunk = max(1, int(2e6 // (batch * (L + 1) * B)))  # rows per block (16 MB of entries)
            for i in range(0, len(src), chunk):
                part = src[i:i + chunk]
                gathered = values[row_of[part], :, :, prior]  # (n, previous link, batch, start)
                entry, prev = _least_link(gathered, hop)
                row, width = band_min_sum_step(entry, tables[f, a], ls, origin=s)  # (n, batch, end)
                dst = row_of[part + stride[a]]  # distinct: one destination per source for a fixed kind
                better = row < new[dst, b, :, ls]
                start = pos[ls] - 1 - width  # where the chosen range begins
                for out, value in ((new, row), (kind, a), (span, width),
                                   (came, np.take_along_axis(prev, start - s, axis=2))):
                    out[dst, b, :, ls] = np.where(better, value, out[dst, b, :, ls])
        back.append((kind, span, came))
        values = new
    out = []
    final = total - 1  # every kind used up
    for j in range(batch):
        b = int(np.argmin(values[0, :, j, L]))
        value = float(values[0, b, j, L])
        if not np.isfinite(value):
            out.append(None)
            continue

        def step(s, state, end, j=j):
            sid, b = state
            kind, span, came = back[s]
            a, width, before = (int(x[row_of[sid], b, j, end]) for x in (kind, span, came))
            return kinds[a], end - 1 - width, (sid - stride[a], before)

        out.append((value, KindPath(*backtrack(p, L, (final, b), step))))
    return out


def repair(model: KindModel, kinds, seconds: float = 5.0) -> dict[int, int] | None:
    """The supply-feasible kind multiset closest (in stages changed) to a relaxed path's kinds.

    A small integer program: n_K stages of kind K and x[K, c] groups of class c among them, with
    x[K, c] >= n_K for c in K, sum_c x[K, c] = d n_K and sum_K x[K, c] = G_c (eq. K5 summed over
    the stages of a kind, which is exact); minimise sum_K |n_K - (stages of kind K in the path)|,
    ties broken towards kinds of fewer classes.
    """
    from ortools.sat.python import cp_model  # heavy: imported when a repair runs

    d, p = model.cand.replicas, model.cand.pp
    want = np.bincount(np.asarray(kinds, dtype=int), minlength=len(model.kinds))
    m = cp_model.CpModel()
    n = [m.NewIntVar(0, p, f"n{k}") for k in range(len(model.kinds))]
    x = {(k, c): m.NewIntVar(0, int(model.supply[c]), f"x{k}_{c}") for k, S in enumerate(model.kinds) for c in S}
    off = [m.NewIntVar(0, p, f"off{k}") for k in range(len(model.kinds))]
    m.Add(sum(n) == p)
    for k, S in enumerate(model.kinds):
        for c in S:
            m.Add(x[k, c] >= n[k])
        m.Add(sum(x[k, c] for c in S) == d * n[k])
        m.Add(off[k] >= n[k] - int(want[k]))
        m.Add(off[k] >= int(want[k]) - n[k])
    for c in range(len(model.classes)):
        m.Add(sum(x[k, c] for k, S in enumerate(model.kinds) if c in S) == int(model.supply[c]))
    # Ties go to kinds of fewer classes: a class spread over fewer stages leaves the others
    # free of its speed and memory limits.
    m.Minimize(100 * sum(off) + sum((len(S) - 1) * n[k] for k, S in enumerate(model.kinds)))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    solver.parameters.max_time_in_seconds = max(0.01, seconds)
    # CP-SAT's own SIGINT handler leaves SIGINT at its default (kill) when it is done; the
    # signals are amp_opt's to handle (amp_opt.search.stop).
    solver.parameters.catch_sigint_signal = False
    if solver.Solve(m) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return {k: int(solver.Value(n[k])) for k in range(len(model.kinds)) if solver.Value(n[k]) > 0}


def construct(model: KindModel, cells: list[Cell], work: float = POLISH_WORK, seconds: float = 5.0,
              pace: Pace | None = None) -> Incumbent | None:
    """Plans from the relaxation (eq. K6): each cell's relaxed path, its kinds repaired to a
    multiset the supply can give, laid out by the multiset DP at the cell's thresholds and at
    none.  Returns the best, scored by the evaluator, or None."""
    best = None
    for cell in cells:
        if cell.path is None:
            continue
        multiset = repair(model, cell.path.kinds, seconds / max(1, len(cells)))
        if multiset is None:
            continue
        found = _lay_out(model, multiset, [(cell.T_hi, cell.U_hi), (INF, INF)], work / max(1, len(cells)), pace)
        if found is not None and (best is None or found.value < best.value):
            best = found
    return best
