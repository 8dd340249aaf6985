"""A rank's process groups and its peers across the stage boundaries (:mod:`.pipeline` runs the rank).

Every rank creates every group, in one order (``torch.distributed.new_group`` asks all ranks):
per pipeline its tensor-parallel groups, its stages' data-parallel groups and its tied word
table's; with several pipelines (``formulations/hetero.md`` U6) a group per segment of the
pipelines' joint partition and tensor-parallel rank, and the tied word table's groups over the
first and over the last stages of every pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model.costs.pipelines import segments
from ._torch import require_torch
from .layout import Layout

require_torch()
import torch.distributed as dist  # noqa: E402


@dataclass(frozen=True)
class Peer:
    """One piece that crosses a stage boundary: the other rank and positions [a, b) of this
    rank's own samples (relative to the start of its share)."""

    rank: int
    a: int
    b: int


class Groups:
    """Every process group of the plan (all ranks create all groups, in one order) and this rank's
    peers across the stage boundaries.  With several pipelines (``pipes``, :func:`.layout.pipelines_of`)
    each pipeline has its own groups, and each segment of the pipelines' joint partition a group per
    piece of its finest tensor-parallel sharding over the rank holding that piece in every replica
    that holds the segment (``segments``: this rank's (a, b, group, piece, pieces), its shard cut
    into ``pieces``, of which the group reduces piece ``piece``);
    a tied word table is summed over the first stages' ranks and over the last stages' ranks of
    every pipeline (``word_groups``: this rank's (first, last), None where it is not in one)."""

    def __init__(self, pipes, rank: int, tied: bool):
        self.pipeline = next(i for i, p in enumerate(pipes) if p.base <= rank < p.base + p.lay.world)
        base, lay = pipes[self.pipeline].base, pipes[self.pipeline].lay
        self.stage, self.dp_rank, self.tp_rank = lay.place(rank - base)
        self.tp = self.dp = self.tie = None
        for p in pipes:
            for s in range(p.lay.pp):
                for r in range(p.lay.dp[s]):
                    self.tp = self._group([p.base + p.lay.rank(s, r, j) for j in range(p.lay.tp[s])], rank, self.tp)
        for p in pipes:
            for s in range(p.lay.pp):
                for j in range(p.lay.tp[s]):
                    self.dp = self._group([p.base + p.lay.rank(s, r, j) for r in range(p.lay.dp[s])], rank, self.dp)
        for p in pipes:
            if tied and p.lay.pp > 1:
                self.tie = self._group(_stage_ranks(p, 0) + _stage_ranks(p, p.lay.pp - 1), rank, self.tie, always=True)
        self.segments, self.word_groups = [], (None, None)
        if len(pipes) > 1:
            for a, b, holders in segments([p.plan["partition"] for p in pipes]):
                finest = max(pipes[i].lay.tp[s] for i, s in holders)  # every holder's tp divides it (run.py)
                for j in range(finest):  # piece j of the finest sharding, held by rank j // (finest / tp)
                    ranks = [pipes[i].base + pipes[i].lay.rank(s, r, j // (finest // pipes[i].lay.tp[s]))
                             for i, s in holders for r in range(pipes[i].lay.dp[s])]
                    group = self._group(ranks, rank, None)
                    if rank in ranks:
                        pieces = finest // lay.tp[self.stage]
                        self.segments.append((a, b, group, j % pieces, pieces))
            if tied:
                first = self._group([x for p in pipes for x in _stage_ranks(p, 0)], rank, None, always=True)
                last = self._group([x for p in pipes for x in _stage_ranks(p, p.lay.pp - 1)], rank, None, always=True)
                self.word_groups = (first, last)
        self.prev = self._peers(lay, base, -1) if self.stage > 0 else None
        self.next = self._peers(lay, base, +1) if self.stage < lay.pp - 1 else None

    @staticmethod
    def _group(ranks, rank, mine, always=False):
        group = dist.new_group(ranks) if always or len(ranks) > 1 else None
        return group if rank in ranks else mine

    def _peers(self, lay: Layout, first: int, step: int) -> tuple[list[Peer], list[Peer]]:
        """(forward, backward) peers toward stage s+step of this rank's pipeline (whose ranks start
        at ``first``): from step -1 the pieces received forward and the gradients sent back; toward
        step +1 the pieces sent forward, the gradients received."""
        s, r, j = self.stage, self.dp_rank, self.tp_rank
        t = s + step
        base = lay.samples(s, r)[0]
        forward, backward = [], []
        for q, a, b in lay.overlaps(s, t, r):
            if step < 0:  # q sends from its tensor-parallel rank j mod tp_t; we send gradients back
                forward.append(Peer(first + lay.rank(t, q, j % lay.tp[t]), a - base, b - base))
                backward += [Peer(first + lay.rank(t, q, k), a - base, b - base) for k in range(lay.tp[t])
                             if k % lay.tp[s] == j]
            else:
                forward += [Peer(first + lay.rank(t, q, k), a - base, b - base) for k in range(lay.tp[t])
                            if k % lay.tp[s] == j]
                backward.append(Peer(first + lay.rank(t, q, j % lay.tp[t]), a - base, b - base))
        return forward, backward


def _stage_ranks(pipe, s: int) -> list[int]:
    """Every rank of stage s of a pipeline."""
    lay = pipe.lay
    return [pipe.base + lay.rank(s, r, j) for r in range(lay.dp[s]) for j in range(lay.tp[s])]
