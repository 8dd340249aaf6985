"""Custom autograd functions whose saved tensors are exactly what the memory formula counts.

PyTorch's composite versions of RMSNorm and SwiGLU save intermediates that
fused kernels (Apex / Megatron-LM) do not; these save only:

* :class:`RMSNormFunction` -- the input and the fp32 reciprocal RMS per token
  (Megatron's fused RMSNorm saves input and ``invvar`` the same way);
* :class:`SwiGLUFunction` -- the gate and up projections; SiLU is recomputed in
  backward (Megatron's ``bias_swiglu``);
* :class:`RotaryFunction` -- nothing: rotary embedding is an orthogonal linear map,
  its backward is the inverse rotation with the constant cos/sin tables;
* :class:`CopyToTensorParallel` / :class:`ReduceFromTensorParallel` -- Megatron's
  conjugate ``f`` (identity forward, all-reduce backward) and ``g`` (all-reduce
  forward, identity backward) for a tensor-parallel group.

Each keeps an optional timer (``timer.add(seconds)``) for its all-reduce.
"""

from __future__ import annotations

import time

from ._torch import require_torch

torch = require_torch()
import torch.distributed as dist  # noqa: E402


class RMSNormFunction(torch.autograd.Function):
    """y = x / sqrt(mean(x^2) + eps) * weight, computed in fp32, saving x and 1/rms."""

    @staticmethod
    def forward(ctx, x, weight, eps: float):
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        y = (xf * rstd).to(x.dtype) * weight
        ctx.save_for_backward(x, rstd, weight)
        return y

    @staticmethod
    def backward(ctx, grad):
        x, rstd, weight = ctx.saved_tensors
        xhat = x.float() * rstd
        g = grad.float() * weight.float()
        dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        dw = (grad.float() * xhat).reshape(-1, x.shape[-1]).sum(0)
        return dx.to(x.dtype), dw.to(weight.dtype), None


class SwiGLUFunction(torch.autograd.Function):
    """silu(gate) * up, saving gate and up only (SiLU recomputed in backward)."""

    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return torch.nn.functional.silu(gate) * up

    @staticmethod
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        sig = torch.sigmoid(gate)
        silu = gate * sig
        d_up = grad * silu
        d_gate = grad * up * sig * (1 + gate * (1 - sig))
        return d_gate, d_up


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rotate_half_transposed(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x2, -x1), dim=-1)


class RotaryFunction(torch.autograd.Function):
    """Rotary position embedding of x (batch, seq, heads, head_dim); saves no tensor."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.tables = (cos, sin)  # constants (no grad), not activations
        return x * cos + _rotate_half(x) * sin

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.tables
        return grad * cos + _rotate_half_transposed(grad * sin), None, None


def rotary_tables(seq_len: int, head_dim: int, dtype, device, base: float = 10000.0):
    """(cos, sin) of shape (seq_len, 1, head_dim), broadcasting over batch and heads."""
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32, device=device), inv)
    angles = torch.cat((angles, angles), dim=-1)[:, None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _all_reduce(tensor, group, timer) -> None:
    start = time.perf_counter()
    dist.all_reduce(tensor, group=group)
    if timer is not None:
        timer.add(time.perf_counter() - start)


class CopyToTensorParallel(torch.autograd.Function):
    """Megatron's f: identity forward, all-reduce of the gradient in backward."""

    @staticmethod
    def forward(ctx, x, group, timer):
        ctx.group, ctx.timer = group, timer
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        _all_reduce(grad, ctx.group, ctx.timer)
        return grad, None, None


class ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron's g: all-reduce forward (sum of partial row-parallel outputs), identity backward."""

    @staticmethod
    def forward(ctx, x, group, timer):
        out = x.contiguous().clone()
        _all_reduce(out, group, timer)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None
