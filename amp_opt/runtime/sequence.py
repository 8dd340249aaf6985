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
    """All-gather along the sequence"""
    start = time.perf_counter()
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(tp.size)]
    dist.all_gather(parts, x, group=tp.group)
    _timed(tp, start)
    return torch.cat(parts, dim=1)


def _reduce_scatter(x, tp):
    """Reduce-scatter along the sequence"""
    start = time.perf_counter()
    chunks = [c.contiguous() for c in x.chunk(tp.size, dim=1)]
    out = torch.empty_like(chunks[0])
    dist.reduce_scatter(out, chunks, group=tp.group)
    _timed(tp, start)
    return out


def _split(x, tp):
    """Keep this rank's shard"""
    return x.chunk(tp.size, dim=1)[tp.rank].contiguous()


def _function(name: str, forward, backward):
    """An autograd function of (x, tp): ``forward(x, tp)``, and ``backward(grad, tp)`` for x."""

    def fwd(ctx, x, tp):
        ctx.tp = tp
        return forward(x, tp)

    def bwd(ctx, grad):
        return backward(grad, ctx.tp), None

    doc = f"{forward.__doc__} forward, {backward.__doc__} backward (see the module docstring)."
    return type(name, (torch.autograd.Function,), {"__doc__": doc, "forward": staticmethod(fwd),
                                                   "backward": staticmethod(bwd)})


GatherFromSequence = _function("GatherFromSequence", _gather, _reduce_scatter)
ReduceScatterToSequence = _function("ReduceScatterToSequence", _reduce_scatter, _gather)
ScatterToSequence = _function("ScatterToSequence", _split, _gather)
GatherToWhole = _function("GatherToWhole", _gather, _split)
