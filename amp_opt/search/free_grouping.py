"""Free device grouping: which nodes' tensor-parallel groups serve which stage.

Node j offers g_j = devices_j / tp groups (tp consecutive devices of one
node).  A grouping gives every stage dp groups and uses every group once.
Under the hetero model a stage's cost depends only on the set of nodes it
uses, and a boundary's on the two stages' node sets, so the exact search walks
the stages in order with the state

    (groups left on each node, whether the node hosts the previous stage)

(``formulations/partition.md``, free grouping).  Identical nodes (same device
type, size and bandwidths) are interchangeable: states are kept in a canonical
order, and tied nodes take groups in non-increasing amounts, so symmetric
groupings are explored once.  :func:`groupings` lists whole grouping matrices
instead; tests use it as an independent check on small instances.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterator

import numpy as np

from ..errors import SearchTooLarge
from ..model.classes import class_of_node
from ..model.costs import HETERO, CostModel, StageCosts, hetero_link, plan_of
from ..model.costs.link_rules import link_latency, ring_link
from ..model.costs.terms import stage_order
from ..model.engines import PER_STAGE_MODES
from ..model.plan import Candidate, Plan, Stages, rank_order_stages
from .partition import NO_HOP, Hop, Path, StageGraph, fixed_placement_graph, make_graph, memory_ratio, range_tables
from .tuning import MAX_TRANSITIONS, STOP_EVERY


class Stopped(Exception):
    """The walk was stopped (time limit or interrupt) before the graph was complete."""


def node_groups(instance, tp: int, node: int, start: int, count: int) -> list[tuple[int, ...]]:
    """Groups start..start+count-1 of a node: tp consecutive device ids each."""
    first = instance.node_first_device[node]
    return [tuple(range(first + (start + q) * tp, first + (start + q + 1) * tp)) for q in range(count)]


def assign_groups(instance, tp: int, counts_per_stage) -> Stages:
    """Device ids per stage from group counts: stage s takes the next ``count`` unused
    groups of each ``(node, count)`` in ``counts_per_stage[s]``."""
    used: dict[int, int] = {}
    stages = []
    for counts in counts_per_stage:
        replicas = []
        for node, count in counts:
            replicas += node_groups(instance, tp, node, used.get(node, 0), count)
            used[node] = used.get(node, 0) + count
        stages.append(tuple(sorted(replicas)))
    return tuple(stages)


def _canonical(entries: tuple, classes: list[list[int]]) -> tuple[tuple, list[int]]:
    """Sort the entries of each class of identical nodes; return them and the permutation.

    ``perm[i]`` is the old position whose entry lands at position i.
    """
    perm = list(range(len(entries)))
    for members in classes:
        ordered = sorted(members, key=lambda j: entries[j], reverse=True)
        for pos, j in zip(members, ordered):
            perm[pos] = j
    return tuple(entries[perm[i]] for i in range(len(entries))), perm


def _moves(entries: tuple, d: int, tied_with_prev: list[bool]) -> Iterator[tuple[int, ...]]:
    """Vectors y with sum d, y_j <= groups left, non-increasing across tied nodes."""
    n = len(entries)
    left_after = [0] * (n + 1)
    for j in range(n - 1, -1, -1):
        left_after[j] = left_after[j + 1] + entries[j][0]
    y = [0] * n

    def rec(j: int, need: int):
        if j == n:
            if need == 0:
                yield tuple(y)
            return
        hi = min(entries[j][0], need)
        if j > 0 and tied_with_prev[j] and entries[j] == entries[j - 1]:
            hi = min(hi, y[j - 1])
        lo = max(0, need - left_after[j + 1])
        for v in range(hi, lo - 1, -1):
            y[j] = v
            yield from rec(j + 1, need - v)
        y[j] = 0

    yield from rec(0, d)


@dataclass(frozen=True)
class FreeGraph:
    graph: StageGraph
    moves: tuple  # per stage, per transition: y in the canonical labels of the source state
    perms: tuple  # per stage, per transition: canonicalisation permutation of the target state
    node_order: tuple[int, ...]  # canonical position -> node index at the start


def candidate_graph(tables, cand: Candidate, model, placement: str, chunks=None,
                    stop: Callable[[], bool] | None = None,
                    max_transitions: int = MAX_TRANSITIONS) -> tuple[StageGraph, Callable[[Path], Plan]]:
    """The stage graph of a candidate under a placement (with interleaving, its ``chunks`` fixed),
    and a function from a path to the plan.

    Raises Stopped when ``stop()`` turns true while the free-grouping graph is built, and
    SearchTooLarge past ``max_transitions`` (:func:`free_graph`)."""
    if placement == "rank-order":
        stages = rank_order_stages(cand.tp, cand.dp, cand.pp, cand.cp)
        costs = model.stage_costs(tables, cand, stages, chunks=chunks)
        graph = fixed_placement_graph(costs, tables.instance.num_layers, _stage_boundaries(cand, chunks))
        return graph, lambda path: plan_of(model, tables, cand, chunks or path.boundaries, stages, chunks=chunks)
    fg = free_graph(tables, cand, chunks, max_transitions, stop=stop, model=model)
    return fg.graph, lambda path: plan_of(model, tables, cand, chunks or path.boundaries,
                                          stages_of_path(tables.instance, cand, fg, path.transitions), chunks=chunks)


def _stage_boundaries(cand: Candidate, chunks):
    return None if chunks is None else stage_order(chunks, cand.pp)[1]


def free_graph(tables, cand: Candidate, chunks=None, max_transitions: int = MAX_TRANSITIONS,
               stop: Callable[[], bool] | None = None, model: CostModel = HETERO) -> FreeGraph:
    """The stage graph of every free grouping of a candidate (a hetero cost model: ``hetero`` or
    ``hetero-closed``); with interleaving its ``chunks`` are fixed.

    Raises SearchTooLarge once the graph has more than ``max_transitions`` transitions, and
    Stopped when ``stop()`` turns true (it is asked every STOP_EVERY transitions).
    """
    walk = _StateWalk(tables, cand, chunks, model)
    # A state: (groups left and "hosts the previous stage" per node in canonical order,
    # min inter-node bandwidth of the previous stage when it spans several nodes).  The
    # next boundary's link depends on a multi-node previous stage only through that
    # minimum, so such states merge; ``prev_of`` keeps one representative node set.
    start = (tuple((g, False) for g in walk.groups), None)
    layer, prev_of = {start: 0}, {start: ()}
    transitions, moves, perms = [], [], []
    for s in range(cand.pp):
        left = max_transitions - sum(map(len, transitions))
        layer, prev_of, step = walk.expand(s, layer, prev_of, left, stop)
        if step is None:
            raise SearchTooLarge(
                "--placement",
                f"free grouping of tp={cand.tp} cp={cand.cp} dp={cand.dp} pp={cand.pp} has more than {max_transitions} stage "
                "transitions: too large for the enumerator; use --solver cpsat or --placement rank-order",
            )
        transitions.append(tuple(t for t, _, _ in step))
        moves.append(tuple(y for _, y, _ in step))
        perms.append(tuple(perm for _, _, perm in step))
    L = tables.instance.num_layers
    ranges = [range_tables(c, L, 0) for c in walk.kind_costs]
    ratio = np.stack([np.stack([memory_ratio(c, L, s) for c in walk.kind_costs]) for s in range(cand.pp)])
    volume = np.concatenate([[0.0], walk.kind_costs[0].p2p_volume()])
    graph = make_graph(cand.n_micro(tables.instance), np.stack([t[0] for t in ranges]), np.stack([t[1] for t in ranges]),
                       ratio, True, volume, transitions, pipeline=walk.kind_costs[0].pipeline,
                       boundaries=_stage_boundaries(cand, chunks))
    return FreeGraph(graph, tuple(moves), tuple(perms), tuple(walk.order))


class _StateWalk:
    """The free-grouping states of one candidate, expanded stage by stage; identical nodes are
    kept in a canonical order, and each distinct stage kind gets its StageCosts once.  For a
    ``per_stage`` candidate a kind is a set of devices and a recomputation mode (none or full):
    every move comes once per mode, and the DP takes each stage's faster mode that fits."""

    def __init__(self, tables, cand: Candidate, chunks=None, model: CostModel = HETERO):
        # The instance as the model prices it (its candidate_terms, terms.py): the boundary links
        # and the ties between nodes below are its, so a model's slower link is seen here too.
        instance = model.candidate_terms(tables, cand, chunks=chunks).instance
        self.tables, self.cand, self.instance, self.chunks = tables, cand, instance, chunks
        self.model = model
        cls = class_of_node(instance)
        self.order = sorted(range(len(instance.nodes)), key=lambda j: (cls[j], j))
        class_of = [cls[j] for j in self.order]
        self.groups = [instance.nodes[j].devices // cand.tp for j in self.order]
        self.class_members: list[list[int]] = []
        for pos, c in enumerate(class_of):
            if pos == 0 or c != class_of[pos - 1]:
                self.class_members.append([])
            self.class_members[-1].append(pos)
        self.tied_with_prev = [pos > 0 and class_of[pos] == class_of[pos - 1] for pos in range(len(self.order))]
        self.kinds: dict[tuple, int] = {}
        self.kind_costs: list[StageCosts] = []
        self.modes = [replace(cand, recompute=m, per_stage=False) for m in PER_STAGE_MODES] if cand.per_stage else [cand]

    def expand(self, s: int, layer: dict, prev_of: dict, limit: int, stop: Callable[[], bool] | None = None):
        """Every transition of stage s from the states in ``layer``: the next states, their
        representative previous-stage nodes, and per transition (transition, y, permutation);
        the transitions are None as soon as there are more than ``limit``."""
        order, nodes = self.order, self.instance.nodes
        nxt: dict[tuple, int] = {}
        nxt_prev: dict[tuple, tuple] = {}
        step = []
        for state, sid in layer.items():
            entries = state[0]
            prev = tuple(order[pos] for pos in prev_of[state])
            for y in _moves(entries, self.cand.replicas, self.tied_with_prev):
                positions = [pos for pos in range(len(y)) if y[pos]]
                used = tuple(order[pos] for pos in positions)
                key = _kind_key(self.instance, used, self.cand.tp)
                if key not in self.kinds:
                    self.kinds[key] = len(self.kind_costs)
                    self.kind_costs += [_kind_costs(self.model, self.tables, mode, y, order, self.chunks) for mode in self.modes]
                # H3 and its latency H19 (H11: an interleaved boundary is crossed v times)
                v = self.cand.virtual_stages
                factor = (Hop(v / hetero_link(self.instance, prev + used), v * link_latency(self.instance, prev + used))
                          if s > 0 else NO_HOP)
                single = len(positions) == 1
                raw = tuple((entries[pos][0] - y[pos], single and y[pos] > 0) for pos in range(len(y)))
                canon, perm = _canonical(raw, self.class_members)
                target = (canon, None if single else (min(nodes[j].inter_bandwidth for j in used),
                                                      max(nodes[j].inter_latency for j in used)))
                if target not in nxt:
                    nxt[target] = len(nxt)
                    where = {old: new for new, old in enumerate(perm)}
                    nxt_prev[target] = tuple(sorted(where[pos] for pos in positions))
                for m in range(len(self.modes)):
                    step.append(((sid, self.kinds[key] + m, factor, nxt[target]), y, tuple(perm)))
                if len(step) > limit:
                    return nxt, nxt_prev, None
                if stop is not None and len(step) % STOP_EVERY == 0 and stop():
                    raise Stopped
        return nxt, nxt_prev, step


def _kind_key(instance, used: tuple[int, ...], tp: int):
    """What a stage's own cost depends on: its compute classes (device type and tp link, H2, H19) and
    its ring link (H4, H17, H19)."""
    nodes = instance.nodes
    classes = frozenset(nodes[j].compute_key for j in used)
    return classes, ring_link(instance, used, tp), link_latency(instance, used), len(set(used)) == 1


def _kind_costs(model: CostModel, tables, cand, y, order, chunks) -> StageCosts:
    """A StageCosts whose every stage has this kind's devices (to tabulate its terms)."""
    groups = []
    for pos, count in enumerate(y):
        first = tables.instance.node_first_device[order[pos]]
        groups += [tuple(range(first, first + cand.tp))] * count
    return model.stage_costs(tables, cand, (tuple(groups),) * cand.pp, chunks=chunks)


def stages_of_path(instance, cand, fg: FreeGraph, transitions: tuple[int, ...]) -> Stages:
    """Device ids per stage and replica for a path through the free graph."""
    label = list(fg.node_order)  # canonical position -> node index
    counts = []
    for s, t in enumerate(transitions):
        counts.append([(label[pos], count) for pos, count in enumerate(fg.moves[s][t]) if count])
        perm = fg.perms[s][t]
        label = [label[perm[i]] for i in range(len(label))]
    return assign_groups(instance, cand.tp, counts)


def groupings(instance, cand) -> Iterator[Stages]:
    """Every grouping matrix (canonical up to identical nodes) as device ids; for tests."""
    cls = class_of_node(instance)
    order = sorted(range(len(instance.nodes)), key=lambda j: (cls[j], j))
    counts = [instance.nodes[j].devices // cand.tp for j in order]
    p, d = cand.pp, cand.replicas
    remaining = [d] * p
    cols: list[tuple[int, ...]] = []

    def columns(total, upper):
        def rec(s, left, prefix, tight):
            if s == p:
                if left == 0:
                    yield tuple(prefix)
                return
            hi = min(remaining[s], left)
            if tight:
                hi = min(hi, upper[s])
            for v in range(hi, -1, -1):
                prefix.append(v)
                yield from rec(s + 1, left - v, prefix, tight and v == upper[s])
                prefix.pop()

        yield from rec(0, total, [], upper is not None)

    def rec(i):
        if i == len(order):
            if not any(remaining):
                yield tuple(cols)
            return
        upper = cols[i - 1] if i > 0 and cls[order[i]] == cls[order[i - 1]] else None
        for col in columns(counts[i], upper):
            for s in range(p):
                remaining[s] -= col[s]
            cols.append(col)
            yield from rec(i + 1)
            cols.pop()
            for s in range(p):
                remaining[s] += col[s]

    for columns_ in rec(0):
        yield assign_groups(instance, cand.tp, [[(j, col[s]) for j, col in zip(order, columns_) if col[s]]
                                                for s in range(p)])
