"""What ``run`` executes, and how the processes of a plan are laid out and share the batch.

:data:`RUNNABLE` is the one statement of the plan settings ``python -m amp_opt run`` executes
(``profile --runnable`` restricts a search to it, :func:`amp_opt.runtime.run.refuse_unsupported`
refuses anything else).  :class:`Layout` turns a plan (``tp`` and ``dp`` an int or one per stage,
optional ``shares``; read through the record's ``tp_at``, ``dp_at``, ``shares_at``) into per-stage
degrees, ranks and sample ranges; it is pure Python (no torch), shared by the launcher and the
workers.

Rank order: the stages' ranks one after the other; inside stage s, rank = offset_s + tp_rank
+ tp_s * dp_rank (Megatron's order when the plan is uniform).  Samples: pipeline micro-batch
j of an iteration is samples [j*M, (j+1)*M) of the global batch; replica r of stage s takes
positions [sum(shares[s][:r]), sum(shares[s][:r+1])) of it.  A plan of several pipelines
(:func:`pipelines_of`) lays its pipelines one after the other, in ranks and in samples: pipeline
i's ranks start after pipeline i-1's, and its n_i * M_i samples after pipeline i-1's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..errors import InputError
from ..model.plan import Pipelines, Plan, one_pipeline, parse_plan

# The plan settings the runtime executes: a search restricted to these finds runnable plans.
RUNNABLE: dict[str, list] = {"cp": [1], "sequence_parallel": [False, True],
                             "recompute": ["none", "selective", "full"], "zero_stages": [0, 1], "virtual_stages": [1]}
RUNNABLE_HINT = ("for a plan `run` executes, solve with the instance's \"search\" restricted to "
                 + json.dumps(RUNNABLE) + " (`profile --runnable` writes it)")


@dataclass(frozen=True)
class Layout:
    """Per-stage degrees and batch shares of a plan (see the module docstring).

    Examples
    --------
    >>> lay = Layout.of({"tp": [1, 2], "dp": [2, 1], "pp": 2, "shares": [[3, 1], [4]],
    ...                  "partition": [0, 2, 4]}, global_batch=8)
    >>> lay.world, lay.micro, lay.n_micro, lay.place(3), lay.samples(0, 1)
    (4, 4, 2, (1, 0, 1), (3, 4))
    """

    tp: tuple[int, ...]
    dp: tuple[int, ...]
    shares: tuple[tuple[int, ...], ...]
    global_batch: int

    @classmethod
    def of(cls, plan, *, global_batch: int) -> "Layout":
        """The layout of a plan (a :class:`~amp_opt.model.plan.Plan` or its JSON form), whose pipeline
        micro-batch must divide the global batch (InputError naming the field otherwise)."""
        plan = one_pipeline(plan if isinstance(plan, Plan) else parse_plan(plan), "the runtime")
        lay = cls(tuple(plan.tp_at(s) for s in range(plan.pp)), tuple(plan.dp_at(s) for s in range(plan.pp)),
                  tuple(tuple(plan.shares_at(s)) for s in range(plan.pp)), global_batch)
        if global_batch % lay.micro:
            field = "micro_batch" if plan.shares is None else "shares"
            raise InputError(f"plan.{field}", f"the pipeline micro-batch of {lay.micro} samples does not divide "
                                              f"the global batch {global_batch}")
        return lay

    @property
    def pp(self) -> int:
        return len(self.tp)

    @property
    def uniform(self) -> bool:
        """One tp, one dp and equal shares: exactly today's plans."""
        return len(set(self.tp)) == 1 and len(set(self.dp)) == 1 and len({x for r in self.shares for x in r}) == 1

    @property
    def micro(self) -> int:
        """M: samples of one pipeline micro-batch."""
        return sum(self.shares[0])

    @property
    def n_micro(self) -> int:
        """Micro-batches per iteration: global batch / M."""
        return self.global_batch // self.micro

    @property
    def world(self) -> int:
        return sum(t * d for t, d in zip(self.tp, self.dp))

    def offset(self, s: int) -> int:
        """The first rank of stage s."""
        return sum(t * d for t, d in zip(self.tp[:s], self.dp[:s]))

    def rank(self, s: int, r: int, j: int) -> int:
        """The rank of tensor-parallel rank j of replica r of stage s."""
        return self.offset(s) + j + self.tp[s] * r

    def place(self, rank: int) -> tuple[int, int, int]:
        """(stage, replica, tensor-parallel rank) of a rank."""
        for s in range(self.pp):
            local = rank - self.offset(s)
            if 0 <= local < self.tp[s] * self.dp[s]:
                return s, local // self.tp[s], local % self.tp[s]
        raise ValueError(f"rank {rank} is not in a world of {self.world}")

    def samples(self, s: int, r: int) -> tuple[int, int]:
        """Positions [a, b) of a pipeline micro-batch that replica r of stage s processes."""
        a = sum(self.shares[s][:r])
        return a, a + self.shares[s][r]

    def overlaps(self, s: int, t: int, r: int) -> list[tuple[int, int, int]]:
        """(replica q of stage t, a, b): the positions [a, b) replica r of stage s shares with
        each replica of stage t, in position order (what crosses a stage boundary)."""
        a, b = self.samples(s, r)
        out = []
        for q in range(self.dp[t]):
            c, d = self.samples(t, q)
            if max(a, c) < min(b, d):
                out.append((q, max(a, c), min(b, d)))
        return out


@dataclass(frozen=True)
class Pipeline:
    """One pipeline of a run: its layout (on the samples it processes), its first rank, its first
    sample in the iteration's batch, and its plan's JSON."""

    lay: Layout
    base: int
    start: int
    plan: dict


def pipelines_of(plan, *, global_batch: int) -> tuple[Pipeline, ...]:
    """A run's pipelines, ranks and samples one after the other: one for a plan of one pipeline
    (on ``global_batch`` samples); several carry their own samples (``check_plan`` holds their sum
    to the global batch).

    Examples
    --------
    >>> pipes = pipelines_of({"pipelines": [
    ...     {"tp": 1, "dp": 1, "pp": 2, "micro_batch": 1, "partition": [0, 2, 4], "micro_batches": 3},
    ...     {"tp": 2, "dp": 1, "pp": 1, "micro_batch": 1, "partition": [0, 4], "micro_batches": 5}]}, global_batch=8)
    >>> [(p.base, p.start, p.lay.world, p.lay.n_micro) for p in pipes]
    [(0, 0, 2, 3), (2, 3, 2, 5)]
    """
    plan = plan if isinstance(plan, (Plan, Pipelines)) else parse_plan(plan)
    if not isinstance(plan, Pipelines):
        return (Pipeline(Layout.of(plan, global_batch=global_batch), 0, 0, plan.to_json()),)
    out, base, start = [], 0, 0
    for i, p in enumerate(plan.pipelines):
        lay = Layout.of(p, global_batch=plan.samples(i))
        out.append(Pipeline(lay, base, start, p.to_json()))
        base, start = base + lay.world, start + plan.samples(i)
    return tuple(out)


def world_of(pipes) -> int:
    """Processes of a run: every pipeline's."""
    return sum(p.lay.world for p in pipes)
