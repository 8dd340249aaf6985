"""Pipeline schedules: the order each stage runs its forward and backward passes, and an event
simulation of one iteration from the cost model's stage terms.

``pipeline_order`` is Megatron-LM's: non-interleaved 1F1B (``forward_backward_pipelining_
without_interleaving``: min(p-s-1, n) warm-up forwards, then one forward and one backward in
turn, then the remaining backwards) and, with v virtual stages, the interleaved 1F1B
(``forward_backward_pipelining_with_interleaving`` in ``megatron/core/pipeline_parallel/
schedules.py``: 2(p-s-1) + (v-1)p warm-up forwards, then in turn; the k-th pass runs chunk
(k mod pv) div p, counted from the last chunk for backwards, of micro-batch
(k div pv) p + k mod p).  The engine (:mod:`amp_opt.runtime.pipeline`) runs it, ``plot`` draws it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .costs.iteration import FORWARD_SHARE, pipeline_weights
from .evaluate import stage_costs


def pipeline_order(stage: int, pp: int, n: int, v: int = 1) -> list[tuple[str, int, int]]:
    """The passes of ``stage`` in the order it runs them: (kind "F" or "B", micro-batch, chunk).

    Examples
    --------
    >>> pipeline_order(0, 2, 3)
    [('F', 0, 0), ('F', 1, 0), ('B', 0, 0), ('F', 2, 0), ('B', 1, 0), ('B', 2, 0)]
    >>> [k + str(m) + str(c) for k, m, c in pipeline_order(1, 2, 2, 2)]
    ['F00', 'F10', 'F01', 'B01', 'F11', 'B11', 'B00', 'B10']
    """
    if v == 1:
        warm = min(pp - stage - 1, n)
        order = [("F", i, 0) for i in range(warm)]
        for i in range(n - warm):
            order += [("F", warm + i, 0), ("B", i, 0)]
        return order + [("B", i, 0) for i in range(n - warm, n)]
    total = n * v
    warm = min(2 * (pp - stage - 1) + (v - 1) * pp, total)

    def step(kind: str, k: int) -> tuple[str, int, int]:
        chunk = (k % (pp * v)) // pp
        return kind, (k // (pp * v)) * pp + k % pp, chunk if kind == "F" else v - 1 - chunk

    order = [step("F", k) for k in range(warm)]
    for i in range(total - warm):
        order += [step("F", warm + i), step("B", i)]
    return order + [step("B", i) for i in range(total - warm, total)]


@dataclass(frozen=True)
class Op:
    """One interval of the simulated schedule."""

    kind: str  # "F", "B", "p2pF"/"p2pB" (activation/gradient arriving at `stage`), "allreduce"
    stage: int
    micro: int  # micro-batch index (-1 for allreduce)
    start: float
    end: float
    after: tuple | None  # the key of the op whose end fixed this start
    chunk: int = 0

    @property
    def key(self) -> tuple[str, int, int, int]:
        return (self.kind, self.stage, self.micro, self.chunk)


@dataclass(frozen=True)
class Schedule:
    ops: tuple[Op, ...]
    makespan: float
    critical: frozenset  # keys of the ops on the critical path


def simulate(chunk_compute, p2p, allreduce, n: int) -> Schedule:
    """Simulate one iteration from per-stage terms: ``chunk_compute[s][c]`` seconds of one
    micro-batch through chunk c of stage s (one chunk without interleaving), ``p2p[s]`` seconds of
    one transfer from stage s to the next (the last entry: from the last stage back to the first,
    between chunks), ``allreduce[s]`` seconds of stage s's gradient synchronisation.

    F of chunk c on stage s needs F of the virtual stage before it plus one transfer; B needs B of
    the virtual stage after it (the last one's own F); each stage runs :func:`pipeline_order` one
    pass at a time (:class:`_Simulation`), then its allreduce.

    Examples
    --------
    >>> round(simulate([[3.0], [3.0]], [0.0, 0.0], [0.0, 0.0], 4).makespan, 6)  # (n-1) max E + sum E
    15.0
    """
    sim = _Simulation(chunk_compute, p2p, n)
    sim.run()
    for s in range(sim.pp):
        sim.add(Op("allreduce", s, -1, sim.free[s], sim.free[s] + allreduce[s], sim.last[s]))
    ops = tuple(sim.done.values())
    end = max(ops, key=lambda o: o.end)
    return Schedule(ops, end.end, _critical_path(sim.done, ("allreduce", end.stage, -1, 0)))


class _Simulation:
    """The state of :func:`simulate` while the passes run: per stage its next pass (``pos``), when
    it is free and its last op; every op so far by key (``done``, in the order they were added)."""

    def __init__(self, chunk_compute, p2p, n: int):
        self.compute, self.p2p = chunk_compute, p2p
        self.pp, self.v = len(chunk_compute), len(chunk_compute[0])
        self.orders = [pipeline_order(s, self.pp, n, self.v) for s in range(self.pp)]
        self.pos, self.free, self.last = [0] * self.pp, [0.0] * self.pp, [None] * self.pp
        self.done: dict[tuple, Op] = {}

    def add(self, op: Op) -> Op:
        self.done[op.key] = op
        return op

    def run(self) -> None:
        """Every stage's passes, sweeping the stages while any of them can go on."""
        while any([self.advance(s) for s in range(self.pp)]):
            pass
        if any(self.pos[s] < len(self.orders[s]) for s in range(self.pp)):
            raise RuntimeError("pipeline simulation deadlocked")  # cannot happen for Megatron's orders

    def advance(self, s: int) -> bool:
        """Run stage ``s``'s passes in its order until one waits for an input; whether any ran."""
        ran = False
        while self.pos[s] < len(self.orders[s]):
            kind, i, c = self.orders[s][self.pos[s]]
            got = self.inputs(kind, s, i, c)
            if got is None:
                break
            t_in, via = got
            start = max(self.free[s], t_in)
            dur = self.compute[s][c] * (FORWARD_SHARE if kind == "F" else 1 - FORWARD_SHARE)
            op = self.add(Op(kind, s, i, start, start + dur, via if t_in >= self.free[s] else self.last[s], c))
            self.free[s], self.last[s] = op.end, op.key
            self.pos[s] += 1
            ran = True
        return ran

    def source(self, kind: str, s: int, c: int):
        """(stage, chunk) whose pass feeds this one and the link it crosses, or None for the start."""
        pp, p2p = self.pp, self.p2p
        if kind == "F":
            if s > 0:
                return s - 1, c, p2p[s - 1]
            return (pp - 1, c - 1, p2p[pp - 1]) if c > 0 else None
        if s < pp - 1:
            return s + 1, c, p2p[s]
        return (0, c + 1, p2p[pp - 1]) if c < self.v - 1 else None

    def inputs(self, kind: str, s: int, i: int, c: int):
        """(arrival time, key of the op that delivers the input), or None if that op has not run yet."""
        src = self.source(kind, s, c)
        if src is None:
            if kind == "F":
                return 0.0, None
            own = self.done.get(("F", s, i, c))
            return None if own is None else (own.end, own.key)
        t, tc, link = src
        got = self.done.get((kind, t, i, tc))
        if got is None:
            return None
        arrival = self.add(Op("p2p" + kind, s, i, got.end, got.end + link, got.key, c))
        return arrival.end, arrival.key


def _pipelines_schedule(evaluation) -> Schedule:
    """Several pipelines (eq. U6): each pipeline's passes simulated on lanes of its own (pipeline 0's
    stages first), then every stage's end (its rings and optimizer step), which starts once the
    slowest pipeline's passes are done, since a ring joins replicas of every pipeline."""
    ops, lane, runs = [], 0, []
    for ev in evaluation.pipelines:
        stages = ev.stages
        sched = simulate([[r.compute] for r in stages], [r.p2p for r in stages[:-1]] + [0.0], [0.0] * len(stages),
                         ev.n_micro)

        def moved(key, at=lane):
            return None if key is None else (key[0], key[1] + at, *key[2:])

        ops += [replace(op, stage=op.stage + lane, after=moved(op.after)) for op in sched.ops if op.kind != "allreduce"]
        runs.append((sched.makespan, {moved(k) for k in sched.critical if k[0] != "allreduce"}))
        lane += len(stages)
    body, path = max(runs, key=lambda run: run[0])
    last = max((op for op in ops if op.key in path), key=lambda op: op.end).key
    ends = [Op("allreduce", g, -1, body, body + r.allreduce, last) for g, r in enumerate(evaluation.stages)]
    slowest = max(ends, key=lambda op: op.end)
    return Schedule(tuple(ops + ends), slowest.end, frozenset(path | {slowest.key}))


def _critical_path(done: dict, key) -> frozenset:
    """The keys of the ops on the path that ends at ``key``, following each op's ``after``."""
    critical = set()
    while key is not None:
        critical.add(key)
        key = done[key].after
    return frozenset(critical)


def path_bound(compute, p2p, n: int) -> float:
    """A lower bound on the non-interleaved 1F1B makespan, linear in the stage times: the longest
    of two families of paths through the schedule's dependency graph (``formulations/hetero.md``,
    "The 1F1B schedule's paths").  ``compute[s]`` is E_s (forward+backward seconds of one micro-batch),
    ``p2p[s]`` one transfer from stage s to s+1 (the last entry is unused), as in
    :func:`simulate`; allreduce is left out.

    Family a, for each stage s: the first micro-batch's forward through the stages before s, all of
    s's passes, the last backward back through them.  Family b: the first micro-batch forward
    through every stage and backward to s, then every pass s runs from its first backward on, then
    the last backward back to stage 0.  The largest b is eq. H13 without the allreduce, which the
    hetero model's searches optimise; family a binds only when a stage outweighs every later
    stage together about threefold.

    Examples
    --------
    >>> path_bound([3.0, 1.0], [0.0, 0.0], 2)  # the slow first stage keeps busy: 2 E_0
    6.0
    >>> round(simulate([[3.0], [1.0]], [0.0, 0.0], [0.0, 0.0], 2).makespan, 6)
    6.0
    """
    pp = len(compute)
    # Family b is eq. H13 without the allreduce: the round trip plus the stage's weighted passes.
    weights = pipeline_weights(n, pp, 1, "1f1b")
    b = weights.time(compute, p2p[:pp - 1], [0.0])
    best, before = b, 0.0
    for s in range(pp):
        best = max(best, before + n * compute[s])
        if s < pp - 1:
            before += compute[s] + 2 * p2p[s]
    return float(best)


def schedule_of(instance, evaluation) -> Schedule:
    """The simulated schedule of an evaluation: each stage's E_s split over its chunks in
    proportion to their layers' times (the stage's first compute class), each boundary's
    P_s over the v times it is crossed; the transfer from the last stage back to the first
    (between chunks) takes the slowest of those."""
    if evaluation.pipelines:
        return _pipelines_schedule(evaluation)
    stages, v = evaluation.stages, evaluation.plan.virtual_stages
    p2p = [r.p2p / v for r in stages[:-1]]
    p2p.append(max(p2p, default=0.0))
    if v == 1:
        compute = [[r.compute] for r in stages]
    else:
        costs = stage_costs(instance, evaluation.plan, evaluation.cost_model)
        compute, at = [], 0
        for s, r in enumerate(stages):
            times = costs.layer_times(s)[0]
            sizes = [l - k for k, l in r.chunks]
            edges = np.concatenate([[0], np.cumsum(sizes)])
            start = at
            weights = [float(times[start + a:start + b].sum()) for a, b in zip(edges, edges[1:])]
            at += int(edges[-1])
            total = sum(weights) or 1.0
            compute.append([r.compute * w / total for w in weights])
    return simulate(compute, p2p, [r.allreduce for r in stages], evaluation.n_micro)
