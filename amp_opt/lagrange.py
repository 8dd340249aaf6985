"""Stage kinds and their Lagrangian DP: a bound and plans for large free-grouping candidates.

``formulations/mip.md`` (eq. B4, K1-K4) states the method.  Under the hetero
model a stage's cost depends on its groups only through the set S of node
classes it uses (its *kind*): compute is the slowest class's range time,
memory the smallest capacity, the ring and p2p links the slowest inter-node
link (or, for a kind of one class whose node can hold a whole stage, possibly
the intra-node link).  What couples the stages is the supply of groups per
class.  Pricing that supply with multipliers lambda_c (a Lagrangian
relaxation) leaves a shortest-path DP over layer positions; the two maxima of
the objective are handled by thresholds (T on compute, U on allreduce):

    time >= w * T_lo + U_lo + h_lambda(T, U) - lambda . G

for every plan whose largest stage compute lies in (T_lo, T] and whose largest
allreduce lies in (U_lo, U].  Rounded supply rows (at most floor(G_B / d)
stages inside a class set B, eq. K7) are priced the same way, and a bound that
reaches ``KindModel.ceiling`` proves the candidate has no plan.  Plans come
from kind multisets (a relaxed path's kinds repaired to fit the supply, or a
known plan's kinds) laid out by an exact DP over the stages of each kind used
so far (eq. K5, K6).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from .cost import LayerSums, StageCosts, allreduce_factor
from .profiles import layer_times

INF = np.inf
MAX_KINDS = 63  # 6 node classes; more and the bound falls back to eq. B2/B3
LP_MS = 2000  # milliseconds one dual step's LP may take (a guard; it takes about one)
WAVE = 8  # threshold cells whose duals are raised together, in one batched DP sweep
POLISH_WORK = 2e9  # array operations one polish may spend by default (a few seconds)
POLISH_RATE = 5e8  # array operations per second the multiset DP runs at, roughly


@dataclass(frozen=True)
class NodeClass:
    """Interchangeable nodes: same device type, count and links."""

    device_type: str
    devices: int
    intra: float
    inter: float
    nodes: tuple[int, ...]
    groups: int  # tensor-parallel groups the class offers (G_c)


@dataclass(frozen=True)
class KindPath:
    """A DP solution: the kind and layer range of every stage."""

    kinds: tuple[int, ...]
    bounds: tuple[int, ...]


def node_classes(instance, tp: int) -> list[NodeClass]:
    """The node classes of an instance (``grouping.node_classes``) at tensor-parallel degree ``tp``."""
    from .grouping import node_classes as class_of_node

    members: dict[int, list[int]] = {}
    for j, c in enumerate(class_of_node(instance)):
        members.setdefault(c, []).append(j)
    out = []
    for c in sorted(members):
        node = instance.nodes[members[c][0]]
        out.append(NodeClass(node.device_type, node.devices, node.intra_bandwidth, node.inter_bandwidth,
                             tuple(members[c]), len(members[c]) * (node.devices // tp)))
    return out


def band_layout(usable: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ranges stored by (end l, length - 1) up to the longest one ``usable`` ((L+1, L+1) bool,
    [k, l]) allows: the start of each (l, j) cell, clipped to 0, and whether it is a real range."""
    first, last = np.nonzero(usable)
    band = max(1, int((last - first).max())) if len(first) else 1
    starts = np.arange(usable.shape[1])[:, None] - 1 - np.arange(band)[None, :]
    valid = starts >= 0
    return np.where(valid, starts, 0), valid


class KindModel:
    """Per-kind range tables of one candidate (eq. K1-K3), and the Lagrangian DP over them (K4)."""

    def __init__(self, instance, cand):
        self.instance, self.cand = instance, cand
        m, d, p, b = cand.tp, cand.dp, cand.pp, cand.micro_batch
        self.w = cand.n_micro(instance) - 1
        self.classes = node_classes(instance, m)
        C, L = len(self.classes), instance.num_layers
        self.L = L
        self.supply = np.array([c.groups for c in self.classes], dtype=float)
        kinds = [S for r in range(1, min(C, d) + 1) for S in itertools.combinations(range(C), r)
                 if sum(self.classes[c].groups for c in S) >= d]
        self.kinds = kinds
        k, l = np.meshgrid(np.arange(L + 1), np.arange(L + 1), indexing="ij")
        self.nonempty = k < l
        kk, ll = np.where(self.nonempty, k, 0), np.where(self.nonempty, l, 1)
        sums = LayerSums.of(instance, m)
        ranges = []
        for c in self.classes:
            t = layer_times(instance, c.device_type, c.intra, m, b).seconds
            prefix = np.concatenate([[0.0], np.cumsum(t)])
            ranges.append(prefix[ll] - prefix[kk])
        params = sums.params_in(kk, ll)
        volume = b * np.concatenate([[0.0], sums.activation_bytes[:-1], [0.0]])  # boundary at position k
        K = len(kinds)
        self.compute = np.full((K, L + 1, L + 1), INF)
        self.allreduce = np.full((K, L + 1, L + 1), INF)
        self.capacity = np.zeros(K)
        for i, S in enumerate(kinds):
            E = np.max([ranges[c] for c in S], axis=0)
            self.compute[i] = np.where(self.nonempty, E, INF)
            self.allreduce[i] = np.where(self.nonempty, params * allreduce_factor(instance, d, self.ring(S)), INF)
            self.capacity[i] = min(instance.device_types[self.classes[c].device_type].memory for c in S)
        # Memory (H5, from StageCosts.memory) by micro-batches in flight, the only way the stage
        # index enters; the devices of the placeholder stages do not change it.
        first = instance.node_first_device[0]
        stage = (tuple(range(first, first + m)),) * d
        base = StageCosts(instance, "hetero", m, d, p, b, (stage,) * p)
        self.in_flight = [base.in_flight(s) for s in range(p)]
        self.fits = {}
        for s in range(p):
            if self.in_flight[s] not in self.fits:
                need = base.memory(s, kk, ll)
                self.fits[self.in_flight[s]] = self.nonempty[None] & (need[None] <= self.capacity[:, None, None])
        # Kinds that behave the same (tables, capacity, link) share a representative: the
        # multiset DP only needs to tell behaviours apart.
        seen: dict[tuple, int] = {}
        self.representative = np.array([
            seen.setdefault((self.compute[i].tobytes(), self.allreduce[i].tobytes(), self.capacity[i], self.ring(S)), i)
            for i, S in enumerate(kinds)])
        self.fitting = np.any(list(self.fits.values()), axis=0)  # (K, k, l): fits at some stage
        usable = self.fitting.any(axis=0)
        # A cost above every plan's: each term at its largest over ranges that fit, links at the
        # slowest the cluster has.  A bound reaching it proves the candidate has no plan.
        slow = min(min(c.inter, c.intra) for c in self.classes)
        if usable.any():
            crude = ((self.w + p) * float(self.compute[self.fitting].max())
                     + (p - 1) * float(volume.max()) / slow
                     + float(params[usable].max()) * allreduce_factor(instance, d, slow))
            self.ceiling = 2.0 * crude
        else:
            self.ceiling = 0.0  # nothing fits anywhere
        # K3: a boundary at position k costs volume[k] over the slower of its two stages' links,
        # so the DP remembers the link level of the previous stage.
        self.volume = volume
        self.links = np.array(sorted({self.ring(S) for S in kinds}))
        self.link_of = np.array([int(np.searchsorted(self.links, self.ring(S))) for S in kinds])
        self.p2p_factor = 1.0 / np.minimum(self.links[:, None], self.links[None, :])  # [previous, next]
        # K7: at most floor(G_B / d) stages have kinds inside a class set B.  The supply allows
        # G_B / d of them in the relaxation; only the rounding cuts, so only sets where d does
        # not divide G_B are kept.  Each cut gets a multiplier mu_B >= 0 beside lambda.
        totals = {B: sum(self.classes[c].groups for c in B) for r in range(1, C) for B in itertools.combinations(range(C), r)}
        sets = [B for B, G in totals.items() if G >= d and G % d]
        self.cut_sets = sets
        self.cut_rhs = np.array([totals[B] // d for B in sets], dtype=float)
        self.inside = np.array([[set(S) <= set(B) for B in sets] for S in kinds], dtype=float).reshape(len(kinds), len(sets))
        self.dims = C + len(sets)  # multipliers: lambda (one per class), then mu (one per cut)

    def ring(self, S) -> float:
        """The fastest link a stage of kind S can reduce over and send on (eq. K1)."""
        d = self.cand.dp
        if len(S) == 1:
            c = self.classes[S[0]]
            if c.devices // self.cand.tp >= d:
                return max(c.inter, c.intra)
        return min(self.classes[c].inter for c in S)

    def prices(self, y: np.ndarray) -> np.ndarray:
        """What a stage of each kind pays under multipliers y = (lambda, mu): its cheapest groups
        (``compositions``) plus mu_B for every cut set B (eq. K7) that holds the kind; (K,)."""
        C = len(self.classes)
        return self.compositions(y[:C])[0] + self.inside @ y[C:]

    def subgradient(self, path: KindPath, y: np.ndarray) -> np.ndarray:
        """The relaxed constraints' excess at a path: groups taken minus the supply (lambda),
        stages inside each cut set minus its limit (mu)."""
        C = len(self.classes)
        inside = self.inside[list(path.kinds)].sum(axis=0)
        return np.concatenate([self.usage(path, y[:C]) - self.supply, inside - self.cut_rhs])

    def constant(self, y: np.ndarray) -> float:
        """The multipliers' constant term: lambda . G + mu . floor(G_B / d)."""
        C = len(self.classes)
        return float(y[:C] @ self.supply + y[C:] @ self.cut_rhs)

    def compositions(self, lam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per kind, the cheapest groups per class under prices ``lam`` (one of each class of
        the kind, the rest from the cheapest ones up to their supply): prices (K,), counts (K, C)."""
        d = self.cand.dp
        counts = np.zeros((len(self.kinds), len(self.classes)))
        for i, S in enumerate(self.kinds):
            left = d - len(S)
            for c in S:
                counts[i, c] = 1
            for c in sorted(S, key=lambda c: (lam[c], c)):
                take = min(left, self.classes[c].groups - 1)
                counts[i, c] += take
                left -= take
        return counts @ lam, counts

    def sweep(self, y: np.ndarray, T: np.ndarray, U: np.ndarray, paths: bool = False):
        """h(T, U) under multipliers y for a batch of thresholds (eq. K4, K7) and, if asked, a
        minimising path each.

        h is the least sum over p stages of E + P + price(kind) with every stage's compute <= T,
        allreduce <= U and memory within its kind's capacity.  States: (link level of the
        previous stage, layer position).  Ranges are stored by (end l, length - 1) up to the
        longest usable one.
        """
        p, L = self.cand.pp, self.L
        batch, B = len(T), len(self.links)
        y = np.broadcast_to(y, (batch, self.dims))
        prices = np.array([self.prices(row) for row in y])  # (batch, K)
        usable = {f: fits[None] & (self.compute[None] <= T[:, None, None, None])
                  & (self.allreduce[None] <= U[:, None, None, None]) for f, fits in self.fits.items()}  # (batch, K, k, l)
        pos = np.arange(L + 1)
        # Per link level b: ranges stored by (end l, length - 1) up to the longest usable one.
        layout = [band_layout(np.any([u[:, self.link_of == b].any(axis=(0, 1)) for u in usable.values()], axis=0))
                  for b in range(B)]
        arcs, which = {}, {}  # [f, b]: the cheapest kind of link level b per (batch, end, length - 1)
        for f in self.fits:
            for b, (starts, valid) in enumerate(layout):
                best = np.full((batch, L + 1, starts.shape[1]), INF)
                arg = np.zeros(best.shape, dtype=np.int16)
                for i in np.flatnonzero(self.link_of == b):
                    ok = usable[f][:, i][:, starts, pos[:, None]] & valid
                    cost = np.where(ok, self.compute[i][starts, pos[:, None]][None] + prices[:, i, None, None], INF)
                    better = cost < best
                    best = np.where(better, cost, best)
                    arg = np.where(better, i, arg)
                arcs[f, b] = best if np.isfinite(best).any() else None
                which[f, b] = arg
        hop = self.volume[None, None, None, :] * self.p2p_factor[None, :, :, None]  # [batch, prev, next, k]
        values = np.full((batch, B, L + 1), INF)
        values[:, 0, 0] = 0.0
        back = []
        for s in range(p):
            f = self.in_flight[s]
            ls = slice(s + 1, L - p + s + 2)  # ends stage s can have
            entry = values[:, :, None, :] + hop  # (batch, prev, next, L+1)
            came = entry.argmin(axis=1)  # (batch, B, L+1)
            entry = entry.min(axis=1)
            new = np.full((batch, B, L + 1), INF)
            span = np.zeros((batch, B, L + 1), dtype=np.int16)
            for b, (starts, valid) in enumerate(layout):
                if arcs[f, b] is not None:
                    stay = entry[:, b][..., starts[ls]] + arcs[f, b][:, ls]  # (batch, window, band_b)
                    span[:, b, ls] = stay.argmin(axis=2)
                    new[:, b, ls] = stay.min(axis=2)
            if paths:
                back.append((span, came))
            values = new
        ends = values[:, :, L]
        h = ends.min(axis=1)
        if not paths:
            return h, None
        found = []
        for j in range(batch):
            if not np.isfinite(h[j]):
                found.append(None)
                continue
            b, end = int(np.argmin(ends[j])), L
            bounds, kinds = [L], []
            for s in range(p - 1, -1, -1):
                span, came = back[s]
                width = int(span[j, b, end])
                kinds.append(int(which[self.in_flight[s], b][j, end, width]))
                start = end - 1 - width
                bounds.append(start)
                b, end = int(came[j, b, start]), start
            found.append(KindPath(tuple(reversed(kinds)), tuple(reversed(bounds))))
        return h, found

    def usage(self, path: KindPath, lam: np.ndarray) -> np.ndarray:
        """Groups per class the relaxed path takes (the subgradient is this minus the supply)."""
        _, counts = self.compositions(lam)
        return counts[list(path.kinds)].sum(axis=0)


def transport(model: KindModel, kinds) -> np.ndarray | None:
    """Groups per (stage, class) realising a kind sequence, or None if the supply cannot (eq. K5).

    Every stage takes one group of each class of its kind; the remaining d - |S| groups
    come from its kind's classes, and every class gives all its groups: a transport
    problem, solved as a maximum flow.
    """
    import networkx as nx

    d, C = model.cand.dp, len(model.classes)
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
    from .grouping import assign_groups

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


def min_max(model: KindModel, table: np.ndarray) -> float:
    """The least possible largest value of ``table`` (indexed [kind, k, l]) over p-stage paths
    that fit in memory, supply ignored: no plan's maximum is smaller."""
    L = model.L
    best_kind = {f: np.where(fits, table, INF).min(axis=0) for f, fits in model.fits.items()}
    values = np.full(L + 1, INF)
    values[0] = 0.0
    for s in range(model.cand.pp):
        values = np.maximum(values[:, None], best_kind[model.in_flight[s]]).min(axis=0)
    return float(values[L])


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

    def record(self, value: float, g: np.ndarray, path: KindPath) -> None:
        """Take the dual value, subgradient and DP path at ``self.lam``; choose the next lambda
        or finish."""
        from ortools.linear_solver import pywraplp

        cell = self.cell
        # The cut theta <= value + g . (y - lam), as theta - g . y <= value - g . lam
        self.rows.append((float(value - g @ self.lam), g.copy()))
        if value > cell.bound or cell.path is None:
            cell.path = path
        if value > cell.bound:
            cell.bound, cell.lam, self.center = value, self.lam.copy(), self.lam.copy()
            if self.boxed:
                self.radius *= 2
        elif len(self.rows) > 1:
            self.radius *= 0.5
        C = self.classes
        # A path meeting the supply and the cuts with complementary slackness: the dual is solved.
        solved = not g[:C].any() and (g[C:] <= 0).all() and not (self.lam[C:] * g[C:]).any()
        if cell.bound >= self.target or solved:
            self.done = cell.settled = True
            return
        for _ in range(20):  # widenings of the box; flat directions (a cut met exactly) end it
            # A fresh LP per step, rows set coefficient by coefficient (GLOP's expression API is
            # slow at this size, and re-solving one kept model from its last basis could stall).
            lp = pywraplp.Solver.CreateSolver("GLOP")
            lp.SetTimeLimit(LP_MS)
            theta = lp.NumVar(-lp.infinity(), lp.infinity(), "theta")
            # The box: lambda_0 fixed, the rest within the radius; mu >= 0 (K7 rows are inequalities).
            reach = np.full(len(self.center), self.radius)
            reach[0] = 0.0
            low = self.center - reach
            low[C:] = np.maximum(0.0, low[C:])
            y = [lp.NumVar(float(lo), float(hi), f"y{c}") for c, (lo, hi) in enumerate(zip(low, self.center + reach))]
            for rhs, g_row in self.rows:
                row = lp.Constraint(-lp.infinity(), rhs)
                row.SetCoefficient(theta, 1.0)
                for c in np.flatnonzero(g_row):
                    row.SetCoefficient(y[c], -float(g_row[c]))
            objective = lp.Objective()
            objective.SetCoefficient(theta, 1.0)
            objective.SetMaximization()
            if lp.Solve() != pywraplp.Solver.OPTIMAL:
                self.done = True
                return
            self.lam = np.array([var.solution_value() for var in y])
            self.boxed = bool(np.abs(self.lam - self.center).max() >= self.radius * (1 - 1e-6))
            if theta.solution_value() - cell.bound > 1e-4 * self.target:
                return
            if not self.boxed:
                break
            self.radius *= 4
        self.done = cell.settled = True  # no price in reach gains more


def ascend(model: KindModel, cells: list[Cell], target: float, iterations: int) -> int:
    """Raise the bounds of ``cells`` together (one batched DP sweep per round) for at most
    ``iterations`` rounds; marks each cell settled when its dual has converged.  Returns the
    number of DP paths computed."""
    w = model.w
    for cell in cells:
        # A cell's cuts stay valid for it; a new target only changes when to stop.
        if cell.ascent is None:
            cell.ascent = Ascent(cell, target, len(model.classes))
        cell.ascent.target, cell.ascent.done, cell.settled = target, False, False
    ascents = [cell.ascent for cell in cells]
    paths_seen = 0
    for _ in range(iterations):
        live = [a for a in ascents if not a.done]
        if not live:
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
            a.record(a.cell.lead(w) + float(value) - model.constant(a.lam), g, path)
    for cell in cells:
        cell.tries += 1
    return paths_seen


def multiset_paths(model: KindModel, multiset: dict[int, int], T: np.ndarray, U: np.ndarray):
    """For each threshold pair (T[j], U[j]): the least-sum path using exactly ``multiset``
    (kind -> number of stages) with every stage's compute <= T[j] and allreduce <= U[j] (eq. K6).

    A DP over (stages of each kind used so far, link level of the previous stage, layer
    position); p2p is charged at the slower link of the two stages, as in the relaxation.
    Returns a list of (sum of E + P, KindPath) or None per pair.
    """
    p, L = model.cand.pp, model.L
    kinds = sorted(multiset)
    r, batch, B = len(kinds), len(T), len(model.links)
    need = np.array([multiset[k] for k in kinds])
    if need.sum() != p:
        return [None] * batch
    stride = np.concatenate([[1], np.cumprod(need[:-1] + 1)]).astype(int)
    total = int(np.prod(need + 1))
    used = (np.arange(total)[:, None] // stride[None, :]) % (need + 1)[None, :]
    level = used.sum(axis=1)
    row_of = np.zeros(total, dtype=int)  # a state's row among the states of its level
    for s in range(p + 1):
        members = np.flatnonzero(level == s)
        row_of[members] = np.arange(len(members))
    pos = np.arange(L + 1)
    tables, layout = {}, []
    for a, k in enumerate(kinds):
        # Kind a's ranges stored by (end l, length - 1) up to the longest it can use.
        ok = {f: fits[k][None] & (model.compute[k][None] <= T[:, None, None]) & (model.allreduce[k][None] <= U[:, None, None])
              for f, fits in model.fits.items()}
        starts, valid = band_layout(np.any([x.any(axis=0) for x in ok.values()], axis=0))
        layout.append(starts)
        for f in model.fits:
            tables[f, a] = np.where(ok[f][:, starts, pos[:, None]] & valid, model.compute[k][starts, pos[:, None]][None], INF)
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
        for a in range(r):
            b = links[a]
            src = here[used[here, a] < need[a]]
            hop = model.volume[None, None, None, :] * model.p2p_factor[:, b][None, :, None, None]
            starts = layout[a]
            chunk = max(1, int(2e7 // (batch * (L + 1) * starts.shape[1] * B)))  # rows per block
            for i in range(0, len(src), chunk):
                part = src[i:i + chunk]
                entry = values[row_of[part]] + hop  # (n, previous link, batch, L+1)
                prev = entry.argmin(axis=1)
                entry = entry.min(axis=1)
                cand = entry[..., starts[ls]] + tables[f, a][None, :, ls]  # (n, batch, window, band)
                width = cand.argmin(axis=3)
                row = cand.min(axis=3)
                dst = row_of[part + stride[a]]  # distinct: one destination per source for a fixed kind
                better = row < new[dst, b][..., ls]
                for out, value in ((new, row), (kind, a), (span, width),
                                   (came, np.take_along_axis(prev, starts[pos[ls], width], axis=2))):
                    block = out[dst, b]
                    block[..., ls] = np.where(better, value, block[..., ls])
                    out[dst, b] = block
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
        bounds, chosen, end, sid = [L], [], L, final
        for s in range(p - 1, -1, -1):
            kind, span, came = back[s]
            a, width, before = (int(x[row_of[sid], b, j, end]) for x in (kind, span, came))
            chosen.append(kinds[a])
            start = end - 1 - width
            bounds.append(start)
            sid, b, end = sid - stride[a], before, start
        out.append((value, KindPath(tuple(reversed(chosen)), tuple(reversed(bounds)))))
    return out


def kind_model(instance, cand) -> KindModel | None:
    """The candidate's kind model, remembered per instance; None when there are too many kinds."""
    key = ("kind_model", cand)
    if key not in instance.memo:
        from .grouping import node_classes as class_of_node

        classes = len(set(class_of_node(instance)))
        instance.memo[key] = KindModel(instance, cand) if 2 ** classes - 1 <= MAX_KINDS else None
    return instance.memo[key]


class KindSearch:
    """Eq. B4 for one candidate, kept between calls: best-first over threshold cells.

    The cells with the smallest bounds get dual steps until their duals are settled, then
    are split in two along the term (w*T or U) whose range is wider; a wave of up to WAVE
    cells is worked on at once.  The lowest cells also say where good plans may lie
    (``promising``).
    """

    def __init__(self, model: KindModel, target: float):
        w = model.w
        self.model, self.sweeps, self.pushed = model, 0, 0
        self.heap: list = []
        self.floor = INF
        T0 = min_max(model, model.compute) if w > 0 else 0.0
        U0 = min_max(model, model.allreduce)
        if not (np.isfinite(T0) and np.isfinite(U0)):
            return
        # Plans with w*max E + max AR above the first target cannot be of interest.
        T_hi = max(T0, (target - U0) / w) if w > 0 else INF
        U_hi = max(U0, target - w * T0)
        self._work([Cell(T0, T_hi, U0, U_hi, np.zeros(model.dims))], target, 40)

    @property
    def bound(self) -> float:
        return float(min([self.floor] + [b for b, _, _ in self.heap]))

    def _work(self, cells: list[Cell], target: float, iterations: int) -> None:
        import heapq

        self.sweeps += ascend(self.model, cells, target, iterations)
        for cell in cells:
            self.pushed += 1
            heapq.heappush(self.heap, (cell.bound, self.pushed, cell))

    def raise_to(self, target: float, sweeps: int, deadline: float | None = None) -> float:
        """Refine until the bound reaches ``target`` or ``sweeps`` more DP paths are spent.

        Returns v with every plan of the candidate costing at least v; v <= target (the cells
        only cover plans below the first target, and targets only decrease).
        """
        import heapq
        import time

        w, stop = self.model.w, self.sweeps + sweeps
        while self.heap and self.sweeps < stop and not (deadline is not None and time.perf_counter() >= deadline):
            wave = []
            while self.heap and self.heap[0][0] < target and len(wave) < WAVE:
                cell = heapq.heappop(self.heap)[2]
                T_hi = min(cell.T_hi, max(cell.T_lo, (target - cell.U_lo) / w)) if w > 0 else cell.T_hi
                U_hi = min(cell.U_hi, max(cell.U_lo, target - w * cell.T_lo))
                if np.isfinite(target) and (_halved(cell.T_lo, cell.T_hi, T_hi) or _halved(cell.U_lo, cell.U_hi, U_hi)):
                    # Started with a much higher target (or none): plans above the target are of
                    # no interest (the bound is reported as at most it), so the cell shrinks, and
                    # its dual starts afresh (cuts at the wider thresholds would undershoot).
                    cell.T_hi, cell.U_hi = T_hi, U_hi
                    cell.settled, cell.ascent = False, None
                if not cell.settled and cell.tries < 2:
                    wave.append(cell)
                    continue
                wide_T = w * (cell.T_hi - cell.T_lo) if w > 0 else 0.0
                wide_U = cell.U_hi - cell.U_lo
                if not np.isfinite(max(wide_T, wide_U)):
                    heapq.heappush(self.heap, (cell.bound, self.pushed, cell))  # no target to split at yet
                    break
                if max(wide_T, wide_U) <= 1e-6 * target:
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
                    wave.append(child)
            if not wave:
                break
            self._work(wave, target, 15)
        return min(self.bound, target)

    def promising(self, count: int) -> list[Cell]:
        """The ``count`` cells with the smallest bounds."""
        import heapq

        return [cell for _, _, cell in heapq.nsmallest(count, self.heap, key=lambda e: e[:2])]


def _halved(lo: float, hi: float, new_hi: float) -> bool:
    """Whether clipping (lo, hi] at new_hi removes at least half of it (or all of an open end)."""
    return new_hi < hi and (not np.isfinite(hi) or new_hi - lo <= 0.5 * (hi - lo))


def kind_bound(model: KindModel, target: float, sweeps: int = 1500, deadline: float | None = None) -> float:
    """Eq. B4: a lower bound on every plan of the candidate, raised until it reaches ``target``
    or ``sweeps`` DP sweeps (or the deadline) are spent."""
    return KindSearch(model, target).raise_to(target, sweeps, deadline)


def multiset_of(model: KindModel, stages) -> dict[int, int] | None:
    """Kind -> number of stages of a placement (None if a stage's kind is not in the model)."""
    cls = {j: c for c, nc in enumerate(model.classes) for j in nc.nodes}
    index = {S: i for i, S in enumerate(model.kinds)}
    node_of = model.instance.device_node
    out: dict[int, int] = {}
    for stage in stages:
        S = tuple(sorted({cls[int(node_of[group[0]])] for group in stage}))
        if S not in index:
            return None
        out[index[S]] = out.get(index[S], 0) + 1
    return out


def polish(model: KindModel, stages, thresholds, work: float = POLISH_WORK) -> tuple | None:
    """Re-order and re-partition a plan's stages keeping how many stages of each kind it has
    (eq. K6), once per threshold pair (T, U) in ``thresholds``.  Returns (seconds, bounds,
    stages) of the best plan found, scored by the evaluator, or None."""
    multiset = multiset_of(model, stages)
    return None if multiset is None else _lay_out(model, multiset, thresholds, work)


def _lay_out(model: KindModel, multiset: dict[int, int], thresholds, work: float) -> tuple | None:
    """The multiset DP at as many threshold pairs as ``work`` array operations allow; each path
    realised and scored by the evaluator.  Kinds that behave the same are merged for the DP and
    handed back to its stages afterwards.  Returns (seconds, bounds, stages) of the best or None."""
    from .cost import evaluate
    from .plan import Plan

    merged: dict[int, int] = {}
    members: dict[int, list[int]] = {}
    for k, count in sorted(multiset.items()):
        rep = int(model.representative[k])
        merged[rep] = merged.get(rep, 0) + count
        members.setdefault(rep, []).extend([k] * count)
    states = int(np.prod([n + 1 for n in merged.values()]))
    window = model.L - model.cand.pp + 1
    kept, spent = [], 0.0
    for T, U in thresholds:
        for k in merged:
            usable = (model.compute[k] <= T) & (model.allreduce[k] <= U) & model.fitting[k]
            first, last = np.nonzero(usable)
            spent += states * len(model.links) * window * (int((last - first).max()) if len(first) else 1)
        if spent > work:
            break
        kept.append((T, U))
    if not kept:
        return None
    T, U = (np.array(v, dtype=float) for v in zip(*kept))
    best = None
    c = model.cand
    for found in multiset_paths(model, merged, T, U):
        if found is None:
            continue
        handed = {rep: iter(kinds) for rep, kinds in members.items()}
        kinds = [next(handed[k]) for k in found[1].kinds]
        counts = transport(model, kinds)
        if counts is None:
            continue
        placed = realise(model, counts)
        ev = evaluate(model.instance, Plan(c.tp, c.dp, c.pp, c.micro_batch, found[1].bounds, placed))
        if ev.feasible and (best is None or ev.predicted_time < best[0]):
            best = (ev.predicted_time, found[1].bounds, placed)
    return best


def repair(model: KindModel, kinds, seconds: float = 5.0) -> dict[int, int] | None:
    """The supply-feasible kind multiset closest (in stages changed) to a relaxed path's kinds.

    A small integer program: n_K stages of kind K and x[K, c] groups of class c among them, with
    x[K, c] >= n_K for c in K, sum_c x[K, c] = d n_K and sum_K x[K, c] = G_c (eq. K5 summed over
    the stages of a kind, which is exact); minimise sum_K |n_K - (stages of kind K in the path)|,
    ties broken towards kinds of fewer classes.
    """
    from ortools.sat.python import cp_model

    d, p = model.cand.dp, model.cand.pp
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
    if solver.Solve(m) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return {k: int(solver.Value(n[k])) for k in range(len(model.kinds)) if solver.Value(n[k]) > 0}


def construct(model: KindModel, cells: list[Cell], work: float = POLISH_WORK, seconds: float = 5.0) -> tuple | None:
    """Plans from the relaxation (eq. K6): each cell's relaxed path, its kinds repaired to a
    multiset the supply can give, laid out by the multiset DP at the cell's thresholds and at
    none.  Returns (seconds, bounds, stages) of the best, scored by the evaluator, or None."""
    best = None
    for cell in cells:
        if cell.path is None:
            continue
        multiset = repair(model, cell.path.kinds, seconds / max(1, len(cells)))
        if multiset is None:
            continue
        found = _lay_out(model, multiset, [(cell.T_hi, cell.U_hi), (INF, INF)], work / max(1, len(cells)))
        if found is not None and (best is None or found[0] < best[0]):
            best = found
    return best
