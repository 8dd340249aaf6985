"""What ``run`` executes, and how the processes of a plan are laid out and share the batch.

:data:`RUNNABLE` is the one statement of the plan settings ``python -m amp_opt run`` executes
(``profile --runnable`` restricts a search to it, :func:`amp_opt.engine.run.refuse_unsupported`
refuses anything else).  :class:`Layout` reads a plan's JSON form (``docs/plan-format``: ``tp``
and ``dp`` an int or one per stage, optional ``shares``) into per-stage degrees, ranks and
sample ranges; it is pure Python (no torch), shared by the launcher and the workers.

Rank order: the stages' ranks one after the other; inside stage s, rank = offset_s + tp_rank
+ tp_s * dp_rank (Megatron's order when the plan is uniform).  Samples: pipeline micro-batch
j of an iteration is samples [j*M, (j+1)*M) of the global batch; replica r of stage s takes
positions [sum(shares[s][:r]), sum(shares[s][:r+1])) of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import InputError

# The plan settings the engine executes: a search restricted to these finds runnable plans.
RUNNABLE: dict[str, list] = {"cp": [1], "sequence_parallel": [False], "recompute": ["none"], "zero_stages": [0],
                             "virtual_stages": [1]}
RUNNABLE_HINT = ("to get a plan `run` executes, solve with the search restricted to what it runs "
                 "(`profile --runnable` writes that search section: " + ", ".join(
                     f"{k}: {v[0]}" for k, v in RUNNABLE.items()).replace("False", "false") + ")")


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
    def of(cls, plan: Mapping[str, Any], *, global_batch: int) -> "Layout":
        """The layout of a plan's JSON form (``Plan.to_json()``), checked for what the engine needs."""
        pp = plan["pp"]
        tp, dp = (_per_stage(plan[key], pp, key) for key in ("tp", "dp"))
        shares = plan.get("shares")
        if shares is None:
            if len(set(dp)) > 1:
                raise InputError("plan.shares", "required when dp differs between stages")
            shares = [[plan["micro_batch"]] * d for d in dp]
        shares = tuple(tuple(int(x) for x in row) for row in shares)
        if len(shares) != pp or any(len(row) != d for row, d in zip(shares, dp)):
            raise InputError("plan.shares", f"must list dp_s shares for each of the {pp} stages, got {shares}")
        if len({sum(row) for row in shares}) != 1 or global_batch % sum(shares[0]):
            raise InputError("plan.shares", f"every stage's shares must sum to one micro-batch M dividing the global "
                                            f"batch {global_batch}, got {[list(r) for r in shares]}")
        return cls(tp, dp, shares, global_batch)

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


def _per_stage(value, pp: int, key: str) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,) * pp
    if len(value) != pp:
        raise InputError(f"plan.{key}", f"lists {len(value)} degrees, pp is {pp}")
    return tuple(int(v) for v in value)
