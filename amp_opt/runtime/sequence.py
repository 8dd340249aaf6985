"""Megatron-LM's sequence parallelism (Korthikanti et al. 2022): the regions of a block outside the
tensor-parallel matmuls (norms, dropout, residual adds) hold 1/tp of the sequence on each rank.

Autograd functions over a tensor-parallel group (``tp``: its ``size``, ``rank``, ``group`` and an
optional ``timer`` that gets the seconds of each collective), the sequence being dimension 1:

* :class:`GatherFromSequence` -- before a column-parallel linear: all-gather the shards, forward;
  reduce-scatter the gradient, backward (Megatron's ``gather_from_sequence_parallel_region``).
* :class:`ReduceScatterToSequence` -- after a row-parallel linear: reduce-scatter the partial sums
  into shards, forward; all-gather the gradient, backward (``reduce_scatter_to_sequence_parallel_region``).
* :class:`ScatterToSequence` -- where the sequence-parallel region starts (a stage's first block):
  each rank keeps its shard of the whole input, forward; all-gather the gradient, backward.
* :class:`GatherToWhole` -- where it ends (after a stage's last block): all-gather, forward; each
  rank keeps its shard of the (whole, identical on every rank) gradient, backward.

The collectives are ``torch.distributed.all_gather`` and ``reduce_scatter`` over lists of
tensors, which gloo runs on CPU.
"""

from __future__ import annotations

import time

from ._torch import require_torch

torch = require_torch()
import torch.distributed as dist  # noqa: E402


def _timed(tp, start: float) -> None:
    if tp.timer is not None:
        tp.timer.add(time.perf_counter() - start)


def _gather(x, tp):
    start = time.perf_counter()
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(tp.size)]
    dist.all_gather(parts, x, group=tp.group)
    _timed(tp, start)
    return torch.cat(parts, dim=1)


def _reduce_scatter(x, tp):
    start = time.perf_counter()
    chunks = [c.contiguous() for c in x.chunk(tp.size, dim=1)]
    out = torch.empty_like(chunks[0])
    dist.reduce_scatter(out, chunks, group=tp.group)
    _timed(tp, start)
    return out


def _split(x, tp):
    return x.chunk(tp.size, dim=1)[tp.rank].contiguous()


class GatherFromSequence(torch.autograd.Function):
    """All-gather forward, reduce-scatter backward."""

    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        return _gather(x, tp)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter(grad, ctx.tp), None


class ReduceScatterToSequence(torch.autograd.Function):
    """Reduce-scatter forward, all-gather backward."""

    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        return _reduce_scatter(x, tp)

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad, ctx.tp), None


class ScatterToSequence(torch.autograd.Function):
    """Keep this rank's shard forward, all-gather backward."""

    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        return _split(x, tp)

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad, ctx.tp), None


class GatherToWhole(torch.autograd.Function):
    """All-gather forward, keep this rank's shard of the gradient backward."""

    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        return _gather(x, tp)

    @staticmethod
    def backward(ctx, grad):
        return _split(grad, ctx.tp), None
