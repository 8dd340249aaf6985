"""Exact stage-by-stage optimisation of the layer partition (and, optionally, the grouping).

The problem (``formulations/partition.md``): walk through p stages; stage s
picks a *transition* (from a state to a state, with a stage *kind*) and a layer
range [k, l) that starts where stage s-1 ended.  A kind fixes the stage's
compute C(k, l) and allreduce A(k, l) tables; a transition also fixes the p2p
factor and latency of the boundary before the stage (a :class:`Hop`).  For AMP's rank order there is one
state and one transition per stage; for free grouping the states are the
groups still unassigned (see :mod:`amp_opt.search.free_grouping`).  Minimise

    f = max_s w_s C_s + max_s A_s + sum_s (C_s + r P_s)

with the cost model's weights (:class:`~amp_opt.model.costs.iteration.Pipeline`): w_s = n - 1
and r = 1 in the closed form H6, w_s by the stage's position and r = 2 under 1F1B (H13).

Two maxima make a plain min-sum DP inexact (AMP's own DP is not exact).  For
thresholds (T, U) let h(T, U) be the least sum over paths whose every stage
has w_s C <= T and A <= U (a min-sum DP).  Then

    min f = min over (T, U) of  T + U + h(T, U)

over the distinct values of w_s C and A.  Pairs whose bound T + U + h(inf, inf)
cannot beat the incumbent are skipped; the rest are solved in numpy batches.
:func:`brute_force` checks the result on small cases.

The module is a little over 400 lines because the exact DP, its stage graphs and the brute
force that checks it belong together: the brute force is the DP's test oracle.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from ..model.costs import StageCosts
from ..model.costs.iteration import Pipeline
from ..model.ranges import INF, backtrack, grid, min_max_step, stage_room, start_row, weighted


class Hop(NamedTuple):
    """The boundary before a stage: P = volume x factor + latency (eq. H3, H19)."""

    factor: float  # seconds per byte of the boundary's volume
    latency: float = 0.0  # seconds per micro-batch whatever the bytes (its messages, H19)

    def seconds(self, volume):
        return volume * self.factor + self.latency


NO_HOP = Hop(0.0)  # before the first stage


@dataclass(frozen=True)
class StageGraph:
    """Everything the DP needs; kinds index the compute/allreduce tables."""

    n_micro: int
    compute: np.ndarray  # (K, L+1, L+1) seconds, inf off the upper triangle
    allreduce: np.ndarray  # (K, L+1, L+1) seconds
    feasible: np.ndarray  # (p, K, L+1, L+1) bool: non-empty, room left, memory fits
    volume: np.ndarray  # (L+1,) p2p seconds x bandwidth of a boundary at position k (0 at k = 0); or (p, L+1),
    # per stage s the boundary before it (a plan whose stages differ, :mod:`amp_opt.search.uneven`)
    transitions: tuple  # per stage: tuple of (from_state, kind, Hop of the boundary before, to_state)
    memory_ratio: np.ndarray  # (p, K, L+1, L+1) per-device memory over capacity
    structural: np.ndarray  # (p, 1, L+1, L+1) bool: non-empty and leaving room
    pipeline: Pipeline  # f's weights: per stage on the bottleneck, 1/v on the sum of C, r on the p2p

    @property
    def weighted(self) -> bool:
        """Whether the bottleneck term is there at all (not with one micro-batch and no interleaving)."""
        return max(self.pipeline.bottleneck) > 0

    @property
    def fill(self) -> float:
        """The weight of each stage's compute in f's sum."""
        return self.pipeline.fill

    @property
    def stages(self) -> int:
        return len(self.transitions)

    @property
    def layers(self) -> int:
        return self.compute.shape[1] - 1


@dataclass(frozen=True)
class Path:
    """A solution: per stage the transition index and the layer range."""

    transitions: tuple[int, ...]
    boundaries: tuple[int, ...]


def range_tables(costs: StageCosts, num_layers: int, stage: int):
    """Compute and allreduce tables of one stage of a StageCosts over all ranges."""
    g = grid(num_layers)
    compute = np.where(g.nonempty, costs.compute(stage, g.start, g.stop), INF)
    allreduce = np.where(g.nonempty, costs.allreduce(stage, g.start, g.stop), INF)
    return compute, allreduce


def memory_ratio(costs: StageCosts, num_layers: int, stage: int) -> np.ndarray:
    """Per-device memory of stage ``stage`` over its capacity, for every range (eq. H5)."""
    g = grid(num_layers)
    return costs.memory(stage, g.start, g.stop) / costs.capacity[stage]


def shared_kinds(tables):
    """Stages' (compute, allreduce) range tables as kinds: one per distinct pair, so that stages
    with equal tables share one.  Returns the kinds' compute and allreduce tables and each stage's kind."""
    kinds: dict[tuple, int] = {}
    compute, allreduce, kind_of = [], [], []
    for c, a in tables:
        key = (c.tobytes(), a.tobytes())
        if key not in kinds:
            kinds[key] = len(kinds)
            compute.append(c)
            allreduce.append(a)
        kind_of.append(kinds[key])
    return compute, allreduce, kind_of


def fixed_placement_graph(costs: StageCosts, num_layers: int, boundaries=None) -> StageGraph:
    """The graph of a fixed placement: one state and one transition per stage (the ranges fixed
    to ``boundaries`` in stage order when given: interleaved chunks).  Stages with the same compute
    and allreduce tables share a kind, so that the tables stay small on long pipelines."""
    p, L = costs.pp, num_layers
    compute, allreduce, kind_of = shared_kinds(range_tables(costs, L, s) for s in range(p))
    ratio = np.zeros((p, len(compute), L + 1, L + 1))
    for s in range(p):
        ratio[s, kind_of[s]] = memory_ratio(costs, L, s)
    volume = np.concatenate([[0.0], costs.p2p_volume()])
    factors = [NO_HOP] + [Hop(costs.p2p_factor(s), costs.p2p_latency(s)) for s in range(p - 1)]
    transitions = tuple(((0, kind_of[s], factors[s], 0),) for s in range(p))
    return make_graph(costs.n_micro, np.stack(compute), np.stack(allreduce), ratio, costs.enforces_memory, volume,
                      transitions, pipeline=costs.pipeline, boundaries=boundaries)


def make_graph(n_micro, compute, allreduce, ratio, enforce_memory: bool, volume, transitions, *, pipeline: Pipeline,
               boundaries=None) -> StageGraph:
    """A stage graph; stage s may take any range leaving room for the others, or only
    [boundaries[s], boundaries[s+1]) when ``boundaries`` fixes the partition.  A transition's hop may be a
    bare p2p factor (no latency)."""
    transitions = [tuple((src, kind, hop if isinstance(hop, Hop) else Hop(float(hop)), dst)
                         for src, kind, hop, dst in stage) for stage in transitions]
    p, L = len(transitions), compute.shape[1] - 1
    if boundaries is None:
        structural = np.stack([stage_room(L, p, s) for s in range(p)])[:, None]
    else:
        structural = np.zeros((p, 1, L + 1, L + 1), dtype=bool)
        for s in range(p):
            structural[s, 0, boundaries[s], boundaries[s + 1]] = True
    feasible = structural & (ratio <= 1.0) if enforce_memory else np.broadcast_to(structural, ratio.shape).copy()
    return StageGraph(n_micro, compute, allreduce, feasible, volume, tuple(transitions), ratio, structural, pipeline)


def path_terms(g: StageGraph, path: Path):
    """Per-stage (compute, p2p after the stage, allreduce) of a path."""
    b = path.boundaries
    kinds = [g.transitions[s][t][1] for s, t in enumerate(path.transitions)]
    compute = [float(g.compute[kinds[s], b[s], b[s + 1]]) for s in range(g.stages)]
    allreduce = [float(g.allreduce[kinds[s], b[s], b[s + 1]]) for s in range(g.stages)]
    p2p = [float(g.transitions[s + 1][path.transitions[s + 1]][2].seconds(boundary_volume(g, s + 1)[b[s + 1]]))
           for s in range(g.stages - 1)]
    return compute, p2p + [0.0], allreduce


def boundary_volume(g: StageGraph, s: int) -> np.ndarray:
    """The p2p volume of the boundary before stage s, per position."""
    return g.volume[s] if g.volume.ndim == 2 else g.volume


def path_value(g: StageGraph, path: Path) -> float:
    """f of a path through the cost model's iteration-time formula."""
    return g.pipeline.time(*path_terms(g, path))


def _sweep(g: StageGraph, T: np.ndarray, U: np.ndarray, pointers: bool = False):
    """Min-sum DP for a batch of thresholds; returns h (batch,) and, if asked, back-pointers.

    Transitions that share (source state, kind, hop) share their work.
    """
    p, L = g.stages, g.layers
    width = L - p + 1
    batch = len(T)
    weights, r = g.pipeline.bottleneck, g.pipeline.p2p
    values = {0: np.tile(start_row(L), (batch, 1))}
    back = []
    for s in range(p):
        ks, ls = slice(s, s + width), slice(s + 1, s + width + 1)
        groups: dict[tuple, list[tuple[int, int]]] = {}
        for t, (src, kind, factor, dst) in enumerate(g.transitions[s]):
            if src in values:
                groups.setdefault((src, kind, factor), []).append((t, dst))
        masked: dict[int, np.ndarray] = {}  # per kind at this stage's weight
        new: dict[int, np.ndarray] = {}
        ptr: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for (src, kind, factor), targets in groups.items():
            if kind not in masked:
                C = g.compute[kind, ks, ls]
                lead = C * weights[s] if weights[s] > 0 else np.zeros_like(C)  # (0 * inf is nan)
                ok = g.feasible[s, kind, ks, ls][None] & (lead[None] <= T[:, None, None])
                ok &= g.allreduce[kind, ks, ls][None] <= U[:, None, None]
                masked[kind] = np.where(ok, C[None] * g.fill, INF)
            start = values[src][:, ks] + factor.seconds(boundary_volume(g, s)[ks]) * r
            cand = start[:, :, None] + masked[kind]
            row = np.full((batch, L + 1), INF)
            row[:, ls] = cand.min(axis=1)
            arg = None
            if pointers:
                arg = np.zeros((batch, L + 1), dtype=int)
                arg[:, ls] = np.argmin(cand, axis=1) + s
            for t, dst in targets:
                _keep_better(new, ptr, dst, row, t, arg)
        values = new
        back.append(ptr)
    final = np.full(batch, INF)
    final_state = np.zeros(batch, dtype=int)
    for state, row in values.items():
        better = row[:, L] < final
        final = np.where(better, row[:, L], final)
        final_state = np.where(better, state, final_state)
    if pointers:
        return final, (back, final_state)
    return final


def _keep_better(new: dict, ptr: dict, dst: int, row: np.ndarray, t: int, arg: np.ndarray | None) -> None:
    """Per end position, keep the better of the best way into state ``dst`` so far and ``row``
    (reached through transition t from the starts in ``arg``; no pointers when ``arg`` is None)."""
    if dst not in new:
        new[dst] = row
        if arg is not None:
            ptr[dst] = (np.full(row.shape, t), arg)
        return
    better = row < new[dst]
    new[dst] = np.where(better, row, new[dst])
    if arg is not None:
        ptr[dst] = (np.where(better, t, ptr[dst][0]), np.where(better, arg, ptr[dst][1]))


def _paths(g: StageGraph, T: np.ndarray, U: np.ndarray) -> tuple[np.ndarray, list[Path | None]]:
    """h for a batch of thresholds, and the path reaching each finite one."""
    h, (back, final_state) = _sweep(g, T, U, pointers=True)
    paths: list[Path | None] = []
    for b in range(len(T)):
        if not np.isfinite(h[b]):
            paths.append(None)
            continue
        paths.append(_walk_back(g, back, int(final_state[b]), (b,)))
    return h, paths


def _walk_back(g: StageGraph, back, state: int, at: tuple = ()) -> Path:
    """The path ending at the last layer in ``state``, from per-stage pointers
    ``back[s][state] = (transition, start)`` arrays indexed ``at + (end,)``."""
    def step(s, state, end):
        t_idx, arg = back[s][state]
        t = int(t_idx[at + (end,)])
        return t, int(arg[at + (end,)]), g.transitions[s][t][0]

    return Path(*backtrack(g.stages, g.layers, state, step))


def min_max_path(g: StageGraph, table: np.ndarray, feasible: np.ndarray | None = None,
                 scale=None) -> tuple[float, Path | None]:
    """min over paths of max over stages of a table (a min-max DP) and a path reaching it.

    ``table`` is indexed [kind, k, l], or [stage, kind, k, l] when it depends on the stage;
    ``scale[s]`` (optional) multiplies stage s's entries (the bottleneck weights).
    """
    p, L = g.stages, g.layers
    feasible = g.feasible if feasible is None else feasible
    values = {0: start_row(L)}
    back = []
    for s in range(p):
        new: dict[int, np.ndarray] = {}
        ptr: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for t, (src, kind, _, dst) in enumerate(g.transitions[s]):
            if src not in values:
                continue
            tab = table[s, kind] if table.ndim == 4 else table[kind]
            if scale is not None:
                tab = weighted(tab, scale[s])
            row, arg = min_max_step(values[src], tab, feasible[s, kind], arg=True)
            _keep_better(new, ptr, dst, row, t, arg)
        values = new
        back.append(ptr)
    if not values:
        return INF, None
    state = min(values, key=lambda st: values[st][L])
    value = float(values[state][L])
    if not np.isfinite(value):
        return INF, None
    return value, _walk_back(g, back, state)


def _bottleneck(g: StageGraph, table: np.ndarray, scale=None) -> float:
    return min_max_path(g, table, scale=scale)[0]


def _weighted_compute(g: StageGraph) -> np.ndarray:
    """The distinct values of w_s C over the ranges some stage can take: the bottleneck thresholds."""
    return np.unique(np.concatenate([g.compute[g.feasible[s]] * w for s, w in enumerate(g.pipeline.bottleneck)]))


def _batch_size(g: StageGraph, limit_bytes: float = 4e8) -> int:
    """Thresholds per sweep so that one stage's DP rows stay under ``limit_bytes``."""
    states = max((len({t[3] for t in trans}) for trans in g.transitions), default=1)
    return int(max(8, min(256, limit_bytes / (8 * states * (g.layers + 1) * 2))))


def optimal_path(g: StageGraph, batch: int | None = None, cutoff: float = INF,
                 stop: Callable[[], bool] | None = None) -> tuple[float, Path] | None:
    """The exact minimum of f over paths and a path reaching it, or None if none is feasible.

    With a ``cutoff`` (a value the caller already has), threshold pairs that cannot beat it
    are skipped: the result is the exact minimum when that is below the cutoff, else some
    path at or above it.  ``stop()`` is asked between batches of thresholds; once it is true
    the best path found so far is returned, which is then not proven optimal (the caller
    knows it stopped).  (About 65 lines: the threshold scan, its pruning and its stop are one loop.)
    """
    p, L = g.stages, g.layers
    batch = batch or _batch_size(g)
    if p > L:
        return None
    has_lead, weights = g.weighted, g.pipeline.bottleneck
    h, paths = _paths(g, np.array([INF]), np.array([INF]))
    h0 = float(h[0])
    if not np.isfinite(h0):
        return None
    best_path = paths[0]
    best = path_value(g, best_path)

    def target():  # what a threshold pair must beat to matter
        return min(best, cutoff)

    # Distinct thresholds in the window where they could still pay off.
    usable = g.feasible.any(axis=0)
    U_lo = _bottleneck(g, g.allreduce)
    T_lo = _bottleneck(g, g.compute, weights) if has_lead else 0.0
    T_all = _weighted_compute(g) if has_lead else np.array([INF])
    if has_lead:
        T_all = T_all[(T_all >= T_lo) & (T_all + U_lo + h0 < target())]
    U_all = np.unique(g.allreduce[usable])
    U_all = U_all[(U_all >= U_lo) & (T_lo + U_all + h0 < target())]
    if not len(T_all) or not len(U_all):
        return best, best_path

    # One-sided sweeps: h(T, inf) and h(inf, U) bound h(T, U) from below, and their
    # paths are good incumbents.
    stopped = (lambda: False) if stop is None else stop
    hT = np.empty(len(T_all))
    for i in range(0, len(T_all), batch):
        if stopped():
            return best, best_path
        hT[i:i + batch], found = _paths(g, T_all[i:i + batch], np.full(len(T_all[i:i + batch]), INF))
        best, best_path = _better(g, best, best_path, found)
    hU = np.empty(len(U_all))
    for i in range(0, len(U_all), batch):
        if stopped():
            return best, best_path
        hU[i:i + batch], found = _paths(g, np.full(len(U_all[i:i + batch]), INF), U_all[i:i + batch])
        best, best_path = _better(g, best, best_path, found)

    lead_T = T_all if has_lead else np.zeros(len(T_all))
    TT, UU = np.meshgrid(np.arange(len(T_all)), np.arange(len(U_all)), indexing="ij")
    TT, UU = TT.ravel(), UU.ravel()
    base = lead_T[TT] + U_all[UU]
    lower = base + np.maximum(hT[TT], hU[UU])
    keep = lower < target()
    order = np.argsort(lower[keep], kind="stable")
    TT, UU, base, lower = TT[keep][order], UU[keep][order], base[keep][order], lower[keep][order]
    pos = 0
    while pos < len(TT) and lower[pos] < target() and not stopped():
        sl = slice(pos, pos + batch)
        best, best_path = _better(g, best, best_path, _paths(g, T_all[TT[sl]], U_all[UU[sl]])[1])
        pos += batch
    return best, best_path


def good_path(g: StageGraph, samples: int = 64) -> tuple[float, Path] | None:
    """A fast, usually optimal path: the min-sum path and the one-sided threshold sweeps
    (``samples`` thresholds each, the smallest first).  Not a proof; seeds the MIPs."""
    p, L = g.stages, g.layers
    if p > L:
        return None
    h, paths = _paths(g, np.array([INF]), np.array([INF]))
    if not np.isfinite(h[0]):
        return None
    best_path = paths[0]
    best = path_value(g, best_path)
    usable = g.feasible.any(axis=0)
    sweeps = []
    if g.weighted:
        T = _weighted_compute(g)
        T = T[T >= _bottleneck(g, g.compute, g.pipeline.bottleneck)][:samples]
        sweeps.append((T, np.full(len(T), INF)))
    U = np.unique(g.allreduce[usable])
    U = U[U >= _bottleneck(g, g.allreduce)][:samples]
    sweeps.append((np.full(len(U), INF), U))
    for T, U in sweeps:
        if len(T):
            best, best_path = _better(g, best, best_path, _paths(g, T, U)[1])
    return best, best_path


def _better(g: StageGraph, best: float, best_path: Path, candidates) -> tuple[float, Path]:
    """The best of the incumbent and the candidate paths (None entries skipped), by f."""
    for path in candidates:
        if path is not None:
            value = path_value(g, path)
            if value < best:
                best, best_path = value, path
    return best, best_path


def every_path(g: StageGraph):
    """Every feasible path of ``g`` with its value, (value, path) pairs in walk order; for tests
    on small cases only."""
    p, L = g.stages, g.layers

    def walks(s, state, chosen):
        if s == p:
            yield tuple(chosen)
            return
        for t, (src, _, _, dst) in enumerate(g.transitions[s]):
            if src == state:
                yield from walks(s + 1, dst, chosen + [t])

    for chosen in walks(0, 0, []):
        kinds = [g.transitions[s][t][1] for s, t in enumerate(chosen)]
        for cuts in itertools.combinations(range(1, L), p - 1):
            boundaries = (0, *cuts, L)
            if all(g.feasible[s, kinds[s], boundaries[s], boundaries[s + 1]] for s in range(p)):
                path = Path(chosen, boundaries)
                yield path_value(g, path), path


def brute_force(g: StageGraph) -> tuple[float, Path] | None:
    """Try every path and partition; for tests on small cases only."""
    best = None
    for value, path in every_path(g):
        if best is None or value < best[0]:
            best = (value, path)
    return best
