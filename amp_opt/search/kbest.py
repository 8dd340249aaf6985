"""The k best paths of a stage graph, best first: Lawler's partition of the path space.

The stage DP (:func:`~amp_opt.search.partition.optimal_path`) finds the best path exactly.
After a path P = (c_0, ..., c_{p-1}) (stage s's choice c_s: its transition and where its
layer range ends; where it starts follows from c_{s-1}) is taken from a subspace, the rest
of that subspace splits into disjoint subspaces, one per stage j: the paths that agree
with P before j and differ from it at j.  Each is a stage graph of its own (the stages
before j keep only P's choice; at stage j P's choice, and the ones its subspace already
excluded, are masked), so the DP solves it exactly; a heap hands out the subspaces' best
paths in order; a subspace is solved only once its bound (its parent path's value) comes
first.  ``formulations/exactness.md`` ("The k best plans") proves it.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import replace
from typing import Callable, Iterator

import numpy as np

from ..model.ranges import INF
from .partition import Path, StageGraph, optimal_path

Choice = tuple[int, int]  # (transition index, end of the stage's layer range)


def k_best_paths(g: StageGraph, *, limit: Callable[[], float] = lambda: INF,
                 stop: Callable[[], bool] | None = None) -> Iterator[tuple[float, Path]]:
    """Paths of ``g`` by increasing value, each once, while their value is below ``limit()``.

    ``limit`` is asked before each subspace is solved (a caller's k-th best plan may lower it);
    the generator ends when no path below it is left, or when ``stop()`` turns true (then the
    paths it gave are the best ones only up to where it stopped; the caller knows it stopped).

    Examples
    --------
    Three layers of 1, 2 and 3 s on two stages, 4 micro-batches, AMP's closed form (3 x the
    slowest stage + the sum of the stages):

    >>> import numpy as np
    >>> from amp_opt.model.costs.iteration import pipeline_weights
    >>> from amp_opt.search.partition import make_graph
    >>> k, l = np.meshgrid(np.arange(4), np.arange(4), indexing="ij")
    >>> prefix = np.array([0.0, 1.0, 3.0, 6.0])
    >>> compute = np.where(k < l, prefix[l] - prefix[k], np.inf)[None]
    >>> sync = np.where(k < l, 0.0, np.inf)[None]
    >>> g = make_graph(4, compute, sync, np.zeros((2, 1, 4, 4)), True, np.zeros(4), [((0, 0, 0.0, 0),)] * 2,
    ...                pipeline=pipeline_weights(4, 2, 1, "closed"))
    >>> [(float(v), p.boundaries) for v, p in k_best_paths(g)]
    [(15.0, (0, 2, 3)), (21.0, (0, 1, 3))]
    """
    # Heap entries: (key, tie, path, fixed, banned, parent).  A solved subspace has its best path
    # (key: its value); an unsolved one is the parent path's subspace at stage ``fixed`` (key: the
    # parent's value, a lower bound on it), solved only when it comes first: one whose bound
    # reaches the limit by then is never solved.
    heap: list = []
    counter = itertools.count()  # ties break by the order subspaces were made: deterministic

    def solve(sub: StageGraph, fixed: int, banned: frozenset) -> None:
        bound = limit()
        found = optimal_path(sub, cutoff=bound, stop=stop)
        if found is not None and found[0] < bound:
            heapq.heappush(heap, (found[0], next(counter), found[1], fixed, banned, None))

    solve(g, 0, frozenset())
    while heap:
        key, _, path, fixed, banned, parent = heapq.heappop(heap)
        if key >= limit() or (stop is not None and stop()):
            return
        if parent is not None:  # an unsolved subspace: solve it and put its best path back
            solve(_subspace(g, parent, fixed, banned), fixed, banned)
            continue
        yield key, path
        for j in range(fixed, g.stages):
            excluded = (banned if j == fixed else frozenset()) | {(path.transitions[j], path.boundaries[j + 1])}
            heapq.heappush(heap, (key, next(counter), None, j, excluded, path))


def _subspace(g: StageGraph, path: Path, j: int, excluded: frozenset) -> StageGraph:
    """The paths of ``g`` that make ``path``'s choices before stage j and none of ``excluded``
    (choices of stage j).  Transitions left out get an unreachable source state (their indices
    stay, so the sub-graph's paths are paths of ``g``); a transition with excluded ends gets a
    copy of its kind whose tables forbid those ends."""
    feasible = g.feasible.copy()
    transitions = [list(stage) for stage in g.transitions]
    for s in range(j):
        keep = path.transitions[s]
        transitions[s] = [t if i == keep else (-1,) + tuple(t[1:]) for i, t in enumerate(transitions[s])]
        kind = transitions[s][keep][1]
        only = feasible[s, kind, path.boundaries[s], path.boundaries[s + 1]]
        feasible[s] = False
        feasible[s, kind, path.boundaries[s], path.boundaries[s + 1]] = only
    compute, allreduce, ratio, structural = g.compute, g.allreduce, g.memory_ratio, g.structural
    ends: dict[int, list[int]] = {}
    for t, end in excluded:
        ends.setdefault(t, []).append(end)
    if ends:
        start = path.boundaries[j]
        kinds = [transitions[j][t][1] for t in sorted(ends)]
        copies = len(kinds)
        compute = np.concatenate([compute, compute[kinds]])
        allreduce = np.concatenate([allreduce, allreduce[kinds]])
        ratio = np.concatenate([ratio, ratio[:, kinds]], axis=1)
        feasible = np.concatenate([feasible, feasible[:, kinds]], axis=1)
        base = g.compute.shape[0]
        for c, t in enumerate(sorted(ends)):
            src, _, factor, dst = transitions[j][t]
            transitions[j][t] = (src, base + c, factor, dst)
            feasible[j, base + c, start, ends[t]] = False
        assert feasible.shape[1] == base + copies
    return replace(g, compute=compute, allreduce=allreduce, feasible=feasible, memory_ratio=ratio,
                   structural=structural, transitions=tuple(tuple(stage) for stage in transitions))
