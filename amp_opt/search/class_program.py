"""S7's program and the pieces of it that the class-stage bounds and the walk's key share.

Pure functions over numbers (``formulations/uneven-search.md``): :func:`balanced` solves S7's
program (with S16's total), :func:`with_end` S10's, :func:`positions` and :func:`positioned` give
S16's rooms, :func:`bottleneck` S7's least E, :func:`heaviest` the most reference seconds n
layers hold, :func:`spread` and :func:`ending` S8's end of the iteration.
:class:`.class_bounds.Bounds` applies them to one configuration; :mod:`.class_walk` relaxes them
over the configurations a heap entry leads to.
"""

from __future__ import annotations

import numpy as np

from ..model.ranges import INF


def bottleneck(seconds: np.ndarray, limits) -> float:
    """The least E such that every layer sits on a block (``seconds``: a row per block, its seconds
    per layer with its step seconds) within E, block b taking at most ``limits[b]`` layers: a
    bipartite b-matching, decided by Hall's condition over every set of blocks (a set S must be
    able to take the layers no block outside S can run within E), by bisection over the seconds.
    The stage holding a layer has at least that layer's seconds on its block, so the slowest stage
    has at least E.  Blocks beyond 12 fall back to the largest of each layer's least seconds.

    Examples
    --------
    Two layers, a fast block that holds one and a slow one: the slow block runs one of them.

    >>> bottleneck(np.array([[1.0, 2.0], [3.0, 5.0]]), [1, 2])
    3.0
    """
    C, L = seconds.shape
    if C > 12:
        return float(seconds.min(axis=0).max())
    sets = np.arange(1 << C)
    caps = np.array([sum(limits[b] for b in range(C) if S >> b & 1) for S in sets])
    weights = (1 << np.arange(C))[:, None]

    def fits(E: float) -> bool:
        within = np.bincount(((seconds <= E) * weights).sum(axis=0), minlength=1 << C)
        for b in range(C):  # within[S]: layers whose blocks within E are all in S
            has = (sets >> b & 1) == 1
            within[has] += within[sets[has] ^ (1 << b)]
        return bool((within <= caps).all())

    values = np.unique(seconds)
    lo, hi = int(np.searchsorted(values, seconds.min(axis=0).max())), len(values) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(values[mid]):
            hi = mid
        else:
            lo = mid + 1
    return float(values[lo])


def heaviest(ref: np.ndarray) -> np.ndarray:
    """tops[n]: the sum of the n largest entries of ``ref`` (the most reference seconds n layers
    hold; a block of k stages among p holds at most L - p + k layers, every other stage one), and
    INF from n = L on (all of them: no limit)."""
    tops = np.concatenate([[0.0], np.cumsum(np.sort(ref)[::-1])])
    tops[len(ref):] = INF
    return tops


def spread(instance, tables) -> float:
    """S8's W_X: the least, over the tp degrees of ``search.tp``, of tp * parameters per rank per
    layer, summed, less each tie group's shared tensor for all members but one at the most it holds
    at any of those degrees (times tp): a bound on sum_s tp_s * (parameters per rank of stage s)."""
    sums = [(m, tables.layer_sums(m)) for m in instance.search.tp]
    total = float(np.min([m * s.params for m, s in sums], axis=0).sum())
    for i, (members, _) in enumerate(sums[0][1].ties):
        total -= (len(members) - 1) * max(m * s.ties[i][1] for m, s in sums)
    return max(total, 0.0)


def ending(spread: float, capacity: float) -> float:
    """S8: the least max_s (c_s / tp_s) y_s over y_s >= 0 summing to ``spread`` (``capacity``: the
    sum of tp_s / c_s over the stages), a bound on the slowest stage's end of the iteration.

    Examples
    --------
    >>> ending(6.0, 3.0), ending(6.0, float("inf"))
    (2.0, 0.0)
    """
    return spread / capacity if capacity > 0 else INF


def with_end(least: float, fill: float, work: float, groups, floor: float, slowest: float, j: int,
             gamma: float, zeta: float) -> float:
    """S10: S7's program with the end of the iteration of group ``j`` priced in: at least
    gamma * (R_j - zeta), which raises group j's alpha by gamma / fill (``groups`` as for
    :func:`balanced`); 0 where gamma is 0.

    Examples
    --------
    One stage holding 3 s of work, 4 micro-batches, its end 0.5 s per reference second:
    :func:`balanced`'s 12 s and 1.5 s more.

    >>> with_end(3.0, 1.0, 3.0, [(1.0, 1.0, 0.0, 0.0)], 0.0, 0.0, 0, 0.5, 0.0)
    13.5
    """
    if gamma <= 0 or fill <= 0:
        return 0.0
    raised = list(groups)
    raised[j] = (groups[j][0] + gamma / fill, *groups[j][1:])
    return balanced(least, fill, work, raised, floor, slowest) - gamma * zeta


def positions(pipe) -> np.ndarray | None:
    """S16: per stage count k (0 to p), least times the sum of 1/w over the k smallest bottleneck
    weights of ``pipe``: the most seconds of E (the slowest stage at the least weight) that k
    stages of one block can take between them in any order; entry p bounds every stage at once.
    None where the least weight is 0 (no bottleneck term: S7's form as it is).

    Examples
    --------
    >>> from amp_opt.model.costs.iteration import pipeline_weights
    >>> positions(pipeline_weights(4, 2, 1, "1f1b")).round(4).tolist()  # weights 8/3 and 3
    [0.0, 1.0, 1.8889]
    """
    least = pipe.least
    if least <= 0:
        return None
    shares = np.sort(least / np.asarray(pipe.bottleneck, dtype=float))[::-1]  # least / least is exactly 1
    return np.concatenate([[0.0], np.cumsum(shares)])


def positioned(group: tuple, stages: int, room: float) -> tuple:
    """A group of S7 whose k = ``stages`` stages take at most ``room`` (:func:`positions`' entry
    for k) seconds of E between them: capacity room / alpha and step seconds k sigma / room, so that
    capacity * (E - sigma) is room * E - k sigma (its fixed seconds and limit as they are)."""
    alpha, capacity, sigma, *rest = group
    if room >= stages or alpha <= 0:
        return group
    return (alpha, room / alpha, sigma * stages / room, *rest)


def balanced(least: float, fill: float, work: float, groups, floor: float, slowest: float = 0.0,
             total: float = INF) -> float:
    """S7's program: min over E >= every sigma and >= ``slowest`` of least * E + fill * max(g(E),
    floor), where g(E) is the fixed seconds plus the least sum of alpha * R over shares R of
    ``work``, each group holding at most capacity * (E - sigma) and at most its limit (``groups``:
    (alpha, capacity, sigma, fixed[, limit]) each, no limit when left out), and (S16) max(g(E),
    floor) at most ``total`` * E.  g is convex, piecewise linear and non-increasing in E, so the
    least is at a kink of g (a group reaching its limit, or the first j groups holding the work
    exactly), where g meets the floor, or where max(g, floor) meets total * E.

    Examples
    --------
    One stage holding 3 s of work, 4 micro-batches (least 3, fill 1): 3 * 3 + 3; with the stages'
    sum at most half of E, E is at least 6.

    >>> balanced(3.0, 1.0, 3.0, [(1.0, 1.0, 0.0, 0.0)], 0.0)
    12.0
    >>> balanced(3.0, 1.0, 3.0, [(1.0, 1.0, 0.0, 0.0)], 0.0, total=0.5)
    21.0
    """
    # (alpha, capacity, sigma, fixed, the E at which the group reaches its limit)
    groups = sorted((*g[:4], g[2] + g[4] / g[1] if len(g) > 4 and g[4] < INF and g[1] > 0 else INF) for g in groups)
    fixed = sum(g[3] for g in groups)
    base = max(max(g[2] for g in groups), slowest)
    saturate = sorted({full for *_, full in groups if full < INF})

    def held(E: float, upto: int) -> float:
        return sum(cap * (min(E, full) - sigma) for _, cap, sigma, _, full in groups[:upto])

    def holds_all(upto: int) -> float:
        """The least E >= base at which the first ``upto`` groups hold the work (INF: never):
        held is piecewise linear, with kinks where groups reach their limits."""
        lo = base
        for hi in [e for e in saturate if e > base] + [INF]:
            h_lo = held(lo, upto)
            if h_lo >= work * (1 - 1e-12):
                return lo
            rate = sum(cap for _, cap, _, _, full in groups[:upto] if full > lo)
            if rate > 0 and lo + (work - h_lo) / rate <= hi:
                return lo + (work - h_lo) / rate
            lo = hi
        return INF

    def g(E: float) -> float:
        left, cost = work, fixed
        for alpha, cap, sigma, _, full in groups:
            take = min(left, cap * (min(E, full) - sigma))
            cost, left = cost + alpha * take, left - take
        return cost

    ends = [holds_all(j) for j in range(1, len(groups) + 1)]
    low = ends[-1]  # below it the groups cannot hold the work
    if low == INF:
        return INF
    points = sorted({low, *(e for e in ends + saturate if low < e < INF)})
    values = [g(e) for e in points]
    for (a, ga), (b, gb) in zip(zip(points, values), zip(points[1:], values[1:])):
        if ga >= floor >= gb and ga > gb:  # g meets the floor on this piece, where it is linear
            points.append(a + (b - a) * (ga - floor) / (ga - gb))
            values.append(floor)
    pieces = sorted(zip(points, (max(v, floor) for v in values)))
    if total < INF:  # S16: the stages' sum is at most total * E, so E is at least where they meet
        pieces = _at_least(pieces, total)
        if not pieces:
            return INF
    return min(least * e + fill * v for e, v in pieces)


def _at_least(pieces: list, total: float) -> list:
    """The points (E, h) of a non-increasing piecewise linear h at E >= the least E with
    h(E) <= total * E (that E first), or none where the last point is still below it (h is
    constant past it, so the least E is then h / total).

    Examples
    --------
    >>> _at_least([(1.0, 4.0), (3.0, 2.0)], 1.0)  # h = 5 - E meets E at 2.5
    [(2.5, 2.5), (3.0, 2.0)]
    >>> _at_least([(1.0, 4.0)], 1.0)
    [(4.0, 4.0)]
    """
    for i, (e, h) in enumerate(pieces):
        if h <= total * e:
            if i == 0:
                return pieces
            (a, ha), (b, hb) = pieces[i - 1], pieces[i]
            # h is linear on [a, b]: ha + (x - a) (hb - ha) / (b - a) = total x
            slope = (hb - ha) / (b - a)
            x = (ha - slope * a) / (total - slope)
            return [(x, ha + (x - a) * slope)] + pieces[i:]
    e, h = pieces[-1]
    return [(h / total, h)] if total > 0 else []
