"""One program over many stage graphs: which graph, and per stage which transition and layer range
(``formulations/uneven-search.md``, S5, rows G1-G4).

The uneven search lists its configurations (each stage's tp, its replicas' nodes and shares, the
micro-batch M) and settings; each is one :class:`~amp_opt.search.partition.StageGraph`, whose range
tables price every stage's layer ranges exactly as the evaluator does.  Under a MIP solver one program
chooses among all of them at once: a binary per (graph, stage, transition, feasible range), a path
through one graph by flow rows, and the objective of :mod:`.partition` (two maxima and a sum) by rows
per graph.  The size is the sum of the graphs' feasible ranges, so it is built only where the uneven
space is listed whole (S2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..clock import Clock
from ..partition import Path, StageGraph, boundary_volume
from .backends import Outcome, Program, Settings, resolution_for, run_backend
from .linear import BIN, TIME, LinearModel, above


@dataclass(frozen=True)
class Columns:
    """One graph's part of the program, all the program reads of it (memory in proportion to its
    binaries): per binary (stage, transition, from state, to state, start, stop) and its three
    coefficients in objective units: w_s C (the bottleneck's), A (the allreduce's), fill C + r P (the
    sum's; P the boundary before the stage at its start)."""

    stages: int
    ranges: tuple  # (s, t, src, dst, k, l) per binary
    lead: tuple  # w_s C per binary (0 where w_s = 0)
    reduce: tuple
    summed: tuple

    @property
    def binaries(self) -> int:
        return len(self.ranges)


def columns(graph: StageGraph, scale: float = 1.0) -> Columns:
    """The program's columns of ``graph``, its seconds times ``scale`` (1, or USD per second)."""
    p, L = graph.stages, graph.layers
    w, fill, r = graph.pipeline.bottleneck, graph.pipeline.fill, graph.pipeline.p2p
    ranges, lead, reduce, summed = [], [], [], []
    for s in range(p):
        hops = boundary_volume(graph, s)
        for t, (src, kind, hop, dst) in enumerate(graph.transitions[s]):
            if s == 0 and src != 0:  # the path starts in state 0 (the DP's start row)
                continue
            ks, ls = np.nonzero(graph.feasible[s, kind])
            for k, l in zip(ks.tolist(), ls.tolist()):
                if (s == 0 and k != 0) or (s == p - 1 and l != L):
                    continue
                C, A = float(graph.compute[kind, k, l]), float(graph.allreduce[kind, k, l])
                ranges.append((s, t, src, dst, k, l))
                lead.append(scale * w[s] * C if w[s] > 0 else 0.0)
                reduce.append(scale * A)
                summed.append(scale * (fill * C + (r * hop.seconds(hops[k]) if s > 0 else 0.0)))
    return Columns(p, tuple(ranges), tuple(lead), tuple(reduce), tuple(summed))


@dataclass
class GraphProgram:
    """The program of :func:`build` and how to read a solution back."""

    model: LinearModel
    choices: dict  # variable -> (graph, stage, transition, start, stop)
    terms: int  # time coefficients a path's objective sums at most (CP-SAT's rounding, cpsat.py)
    scale: float  # objective units: a lower bound of the program's optimum, positive
    cutoff: float | None = None  # objective units: the solve's limit, its rounding allowance included

    def proven(self, out: Outcome, tol: float = 0.0) -> float:
        """What a solve proved below every solution (objective units; 0 without a bound): its bound
        less the rounding ``tol``, at most the cutoff (under a cutoff the program bounds only the
        solutions at most that good)."""
        if out.status == "INFEASIBLE":
            return np.inf if self.cutoff is None else self.cutoff
        if out.bound is None:
            return 0.0
        return max(0.0, min(out.bound - tol, np.inf if self.cutoff is None else self.cutoff))

    def decode(self, values: dict) -> tuple[int, Path]:
        """The graph a solution takes and its path through it."""
        taken = sorted(self.choices[v] for v, x in values.items() if v in self.choices and x > 0.5)
        graph = taken[0][0]
        steps = [c for c in taken if c[0] == graph]
        return graph, Path(tuple(c[2] for c in steps), (0, *(c[4] for c in steps)))


def build(parts: list[Columns], excluded: frozenset = frozenset()) -> GraphProgram:
    """The program choosing one graph of ``parts`` (not one of ``excluded``) and a path through it."""
    mdl, choices = LinearModel(), {}
    first, terms, lower = [], 0, np.inf
    for g, part in enumerate(parts):
        if g in excluded or not part.binaries:
            continue
        p = part.stages
        xs = []
        ends: dict = {}  # (stage, state, position) -> the variables of stage s ending there in that state
        starts: dict = {}  # (stage, state, position) -> the variables of stage s starting there from that state
        least = [np.inf] * p
        for (s, t, src, dst, k, l), c in zip(part.ranges, part.summed):
            v = mdl.var(f"x[{g},{s},{t},{k},{l}]", 0, 1, BIN)
            xs.append(v)
            choices[v] = (g, s, t, k, l)
            starts.setdefault((s, src, k), []).append(v)
            ends.setdefault((s, dst, l), []).append(v)
            least[s] = min(least[s], c)
            if s == 0:
                first.append(v)
        lower = min(lower, sum(least))
        # (G2) a path: what stage s ends at position j in state σ, stage s+1 starts there from σ
        for (s, state, j), into in ends.items():
            if s < p - 1:
                out = starts.get((s + 1, state, j), [])
                mdl.add({**{v: 1.0 for v in into}, **{v: -1.0 for v in out}}, "==", 0, "count",
                        f"flow[{g},{s},{state},{j}]")
        for (s, state, j), out in starts.items():
            if s > 0 and (s - 1, state, j) not in ends:  # nothing leads there
                mdl.add({v: 1.0 for v in out}, "==", 0, "count", f"flow[{g},{s - 1},{state},{j}]")
        # (G3) the bottleneck and the allreduce maxima, per stage; (G4) the sum: 0 where graph g is not taken
        for name, coef in (("T", part.lead), ("U", part.reduce)):
            if max(coef) > 0:
                y = mdl.var(f"{name}[{g}]", 0.0, above(max(coef)), TIME)
                mdl.objective[y] = 1.0
                for s in range(p):
                    row = {v: -c for v, c, rg in zip(xs, coef, part.ranges) if rg[0] == s and c > 0}
                    if row:
                        mdl.add({y: 1.0, **row}, ">=", 0, "time", f"{name}[{g},{s}]")
        total = mdl.var(f"S[{g}]", 0.0, above(sum(part.summed)), TIME)
        mdl.objective[total] = 1.0
        mdl.add({total: 1.0, **{v: -c for v, c in zip(xs, part.summed)}}, ">=", 0, "time", f"S[{g}]")
        terms = max(terms, 3 * p)
    # (G1) one graph, one first stage
    mdl.add({v: 1.0 for v in first}, "==", 1, "count", "one")
    return GraphProgram(mdl, choices, terms, lower if np.isfinite(lower) and lower > 0 else 1.0)


def solve_graphs(parts: list[Columns], *, backend: str, clock: Clock, settings: Settings,
                 cutoff: float | None = None, excluded: frozenset = frozenset()
                 ) -> tuple[Outcome, tuple[int, Path] | None, GraphProgram]:
    """Solve the program of ``parts`` with ``backend`` by ``clock``: the outcome, the graph and path of
    its solution (None without one) and the program.  ``cutoff`` (objective units): only solutions at
    most that good.  The outcome's ``bound`` is what the solve proved (:meth:`GraphProgram.proven`).

    Examples
    --------
    >>> import numpy as np
    >>> from amp_opt.model.costs.iteration import pipeline_weights
    >>> from amp_opt.search.clock import Clock
    >>> from amp_opt.search.partition import make_graph
    >>> t = np.array([[[np.inf, 1, 3], [np.inf, np.inf, 2], [np.inf] * 3]])  # two layers: 1 s and 2 s
    >>> z = np.zeros_like(t)
    >>> g = make_graph(4, t, z, z, True, np.zeros(3), [((0, 0, 0.0, 0),), ((0, 0, 0.0, 0),)],
    ...                pipeline=pipeline_weights(4, 2))
    >>> out, (graph, path), _ = solve_graphs([columns(g)], backend="highs", clock=Clock.of(None),
    ...                                      settings=Settings())
    >>> out.status, path.boundaries, round(out.objective, 6)
    ('OPTIMAL', (0, 1, 2), 9.0)
    """
    form = build(parts, excluded)
    if not any(stage == 0 for _, stage, _, _, _ in form.choices.values()):  # no graph left with a first stage
        return Outcome("INFEASIBLE", None, None, np.inf, 0.0), None, form
    delta = resolution_for(form.scale, form.model)
    tol = form.terms * delta + 1e-9 * form.scale
    form.cutoff = cutoff * (1 + 1e-9) + tol if cutoff is not None and np.isfinite(cutoff) else None
    out = run_backend(backend, Program(form.model, form.scale, delta, form.cutoff), clock, settings)
    out.bound = form.proven(out, tol)
    return out, (form.decode(out.values) if out.values is not None else None), form
