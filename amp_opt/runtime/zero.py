"""A rank's gradient reduction and optimizer step: replicated Adam (ZeRO stage 0) or Megatron's
distributed optimizer (ZeRO stage 1).

Stage 0 (:class:`ReplicatedAdam`): the gradients are copied into one flat buffer, all-reduced over
the stage's R replicas, copied back, and every rank steps Adam on all of its parameters.

Stage 1 (:class:`ShardedAdam`; Rajbhandari et al. 2020, Megatron-LM's distributed optimizer): the
parameters live in one flat buffer, padded to a multiple of R and cut into R equal shards; rank r
of the replicas owns shard r.  The gradients, copied into a flat buffer of that size, are
reduce-scattered in place (rank r's shard of the buffer receives the sum over the replicas of
shard r), each rank steps Adam on its shard alone (its two moments are 1/R of the stage's), and
the shards are all-gathered in place, each from its part of the flat parameter buffer into the
whole of it.  Adam is elementwise, so this is stage 0's step, element for element.  The shard
steps in place on the flat parameter buffer: there is no separate master copy (the runtime trains
in the model's dtype), and no buffer besides the flat gradients (Megatron-LM does the same).

Collectives: ``torch.distributed.reduce_scatter_single`` and ``all_gather_single``
(``reduce_scatter_tensor`` / ``all_gather_into_tensor`` in torch before 2.13), which gloo runs
on CPU, in place as NCCL does (``tests/test_runtime_run.py`` checks the reduced gradients and
the losses against one process), so no fallback is needed.

Memory (bytes, as the run record's ``memory`` parts): parameters (the flat buffer, padding
included, under stage 1), gradients, optimizer (two Adam moments, of the shard under stage 1),
communication_buffers (the flat gradient buffer when R > 1).
"""

from __future__ import annotations

import time

from ._torch import require_torch
from .memory import tensor_bytes

torch = require_torch()
import torch.distributed as dist  # noqa: E402

_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _flat_grads(params, size: int):
    """The parameters' gradients one after the other in a flat buffer of ``size`` elements (zeros after)."""
    flat = torch.zeros(size, dtype=params[0].dtype, device=params[0].device)
    offset = 0
    for p in params:
        flat[offset: offset + p.numel()].copy_(p.grad.reshape(-1))
        offset += p.numel()
    return flat


def sum_gradients(params: list, group) -> None:
    """All-reduce (sum) the gradients of ``params`` over ``group``, as one flat buffer."""
    flat = _flat_grads(params, sum(p.numel() for p in params))
    dist.all_reduce(flat, group=group)
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset: offset + p.numel()].view_as(p.grad))
        offset += p.numel()


class ReplicatedAdam:
    """ZeRO stage 0: all-reduce the flat gradients over the replicas, Adam on every parameter."""

    def __init__(self, params: list, *, replicas: int, group, lr: float):
        self.params, self.replicas, self.group = params, replicas, group
        self.adam = torch.optim.Adam(params, lr=lr)
        state = sum(tensor_bytes(p) for p in params)
        self.memory = {"parameters": state, "gradients": state, "optimizer": 2 * state,
                       "communication_buffers": state if replicas > 1 else 0}

    def reduce(self, clock) -> None:
        """Sum the gradients over the replicas (time into ``clock`` as "allreduce")."""
        if self.replicas == 1:
            return
        t0 = time.perf_counter()
        sum_gradients(self.params, self.group)
        clock.add("allreduce", time.perf_counter() - t0)

    def reduced_grads(self) -> dict:
        """id(parameter) -> its reduced gradient (after :meth:`reduce`)."""
        return {id(p): p.grad for p in self.params}

    def step(self, clock) -> None:
        t0 = time.perf_counter()
        self.adam.step()
        self.adam.zero_grad(set_to_none=True)
        clock.add("optimizer", time.perf_counter() - t0)


class ShardedAdam:
    """ZeRO stage 1 over the ``replicas`` ranks of ``group`` (this one is ``index``), see the module
    docstring; the parameters are moved into one flat buffer when it is built."""

    def __init__(self, params: list, *, replicas: int, index: int, group, lr: float):
        self.params, self.replicas, self.index, self.group = params, replicas, index, group
        numel = sum(p.numel() for p in params)
        self.shard = -(-numel // replicas)  # elements per shard
        self.flat = torch.zeros(self.shard * replicas, dtype=params[0].dtype, device=params[0].device)
        offset = 0
        for p in params:
            self.flat[offset: offset + p.numel()].copy_(p.data.reshape(-1))
            p.data = self.flat[offset: offset + p.numel()].view_as(p)
            offset += p.numel()
        self.mine = self.flat[index * self.shard: (index + 1) * self.shard]  # a view: Adam steps in place
        self.adam = torch.optim.Adam([self.mine], lr=lr)
        self.buffer = None
        element = self.flat.element_size()
        self.memory = {"parameters": tensor_bytes(self.flat), "gradients": sum(tensor_bytes(p) for p in params),
                       "optimizer": 2 * self.shard * element, "communication_buffers": tensor_bytes(self.flat)}

    def reduce(self, clock) -> None:
        """Reduce-scatter the flat gradients: this rank's shard of their sum (time as "allreduce")."""
        t0 = time.perf_counter()
        self.buffer = _flat_grads(self.params, self.flat.numel())
        for p in self.params:
            p.grad = None  # what remains of the gradients is the buffer
        self.mine.grad = self.buffer[self.index * self.shard: (self.index + 1) * self.shard]
        _reduce_scatter(self.mine.grad, self.buffer, group=self.group)
        clock.add("allreduce", time.perf_counter() - t0)

    def reduced_grads(self) -> dict:
        """id(parameter) -> its reduced gradient, all-gathered from the shards (a test hook)."""
        whole = torch.empty_like(self.flat)
        _all_gather(whole, self.mine.grad, group=self.group)
        out, offset = {}, 0
        for p in self.params:
            out[id(p)] = whole[offset: offset + p.numel()].view_as(p)
            offset += p.numel()
        return out

    def step(self, clock) -> None:
        """Adam on this rank's shard ("optimizer"), then every shard to every rank ("allreduce")."""
        t0 = time.perf_counter()
        self.adam.step()
        self.mine.grad = None
        t1 = time.perf_counter()
        clock.add("optimizer", t1 - t0)
        self.buffer = None
        _all_gather(self.flat, self.mine, group=self.group)
        clock.add("allreduce", time.perf_counter() - t1)


def make_optimizer(params: list, *, zero_stage: int, replicas: int, index: int, group, lr: float):
    """The optimizer of a stage's rank: :class:`ShardedAdam` from ZeRO stage 1 on with replicas,
    else :class:`ReplicatedAdam` (one replica shards nothing)."""
    if zero_stage >= 1 and replicas > 1:
        return ShardedAdam(params, replicas=replicas, index=index, group=group, lr=lr)
    return ReplicatedAdam(params, replicas=replicas, group=group, lr=lr)
