"""Build the instance's model as real ``torch.nn.Module`` s, one per amp_opt layer.

The layers come in the order and with the names of :func:`amp_opt.model.presets.build_layers`:
``embedding``, ``layer_0`` ... ``layer_{L-1}``, ``head``.

* ``embedding``: word table (+ learned positions for gpt with
  ``position_embeddings``), dropout (p = 0.1) if the model has dropout.
  ``forward(tokens) -> hidden``.
* ``layer_i``: a pre-norm transformer block.  gpt: LayerNorm, fused QKV with bias,
  causal attention, output projection with bias, tanh-GeLU MLP with biases;
  rotary positions when ``position_embeddings`` is false (GPT-NeoX).  llama:
  RMSNorm, GQA attention with rotary positions (q/k/v biases if ``qkv_bias``),
  SwiGLU MLP, no other biases.  ``forward(hidden) -> hidden``.
* ``head``: final norm, projection to the vocabulary (the word table itself when
  embeddings are tied and the embedding is built alongside; otherwise a copy
  initialised identically, whose gradient the runner all-reduces with the
  embedding's, as Megatron-LM does), fp32 cross-entropy.
  ``forward(hidden, targets) -> mean loss over tokens``.

Attention kernels: ``"eager"`` computes softmax(Q K^T / sqrt(d)) V explicitly and
keeps the s x s probabilities for backward; ``"flash"`` calls
``torch.nn.functional.scaled_dot_product_attention`` (no s^2 tensor kept).  The
eager kernel reads the shared K/V heads of GQA without repeating them (queries of
a group are stacked along the sequence axis).

Tensor parallelism (Megatron-LM, Shoeybi et al. 2019): with ``TensorParallel(size
> 1)`` a block holds 1/size of every matrix -- column-parallel QKV / fc1 (gate,
up), row-parallel output / fc2 (down) -- with Megatron's f before each
column-parallel part and g after each row-parallel one.  Norms and row-parallel
biases are replicated.  With ``sequence_parallel`` (Megatron's, :mod:`.sequence`) the norms,
dropout and residual adds of a block hold 1/size of the sequence: f becomes an all-gather and g a
reduce-scatter along the sequence, and :func:`run_layers` scatters a stage's input to its first
block and gathers its last block's output.  Embedding and head are NOT vocab-parallel: under tp > 1
every rank holds and computes them whole (replicated).

Activation recomputation (:func:`set_recompute`; ``torch.utils.checkpoint``, reentrant, as
Megatron-LM's own checkpoint function): ``"full"`` keeps a block's input and runs the whole block
again during backward; ``"selective"`` keeps Q, K and V and runs the attention core (Q K^T, softmax,
dropout, x V) again, freeing its s x s tensors -- what ``formulations/hetero.md`` (H7, H8) prices.

Weights are drawn from a generator seeded per layer (``seed``, layer index), full
size, and each tensor-parallel rank keeps its slice: any stage split or tp degree
builds the same model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from ..model.presets import ModelShape

from ._torch import require_torch
from .shape import DTYPES, layer_names, model_shape, torch_dtype  # noqa: F401 - the runtime's entry points

torch = require_torch()
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

from .functions import (  # noqa: E402
    CopyToTensorParallel, ReduceFromTensorParallel, RMSNormFunction, RotaryFunction, SwiGLUFunction, rotary_tables,
)
from .sequence import GatherFromSequence, GatherToWhole, ReduceScatterToSequence, ScatterToSequence  # noqa: E402

ATTENTION_KERNELS = ("eager", "flash")
DROPOUT_P = 0.1
INIT_STD = 0.02


@dataclass(frozen=True)
class TensorParallel:
    """This rank's place in its tensor-parallel group; ``timer.add(s)`` gets all-reduce seconds;
    ``sequence_parallel``: the blocks' norms and dropout hold 1/size of the sequence (:mod:`.sequence`)."""

    size: int = 1
    rank: int = 0
    group: Any = None
    timer: Any = None
    sequence_parallel: bool = False

    @property
    def sharded(self) -> bool:
        """Whether blocks run sequence parallel (a degree above 1 and sequence parallelism)."""
        return self.sequence_parallel and self.size > 1


# ---------------------------------------------------------------- building blocks

def _generator(seed: int, index: int):
    return torch.Generator().manual_seed(seed * 1_000_003 + index)


def _normal(gen, *size, std=INIT_STD):
    return torch.randn(*size, generator=gen) * std


class ParallelLinear(nn.Module):
    """y = x W^T + b; ``mode`` "column" keeps rows of W (per segment), "row" columns of W.

    Row-parallel: the partial products are summed over the group (g) before the
    replicated bias is added.  At tp size 1 both are a plain linear layer.
    """

    def __init__(self, in_f, out_f, *, bias, gen, tp, mode, dtype, device, segments=None):
        super().__init__()
        full_w = _normal(gen, out_f, in_f)
        full_b = torch.zeros(out_f) if bias else None
        self.mode, self.tp = mode, tp
        n, r = tp.size, tp.rank
        self.segments = tuple(segments or (out_f,)) if mode == "column" else (in_f,)  # sharded dim's parts
        if mode == "column" and n > 1:
            pieces = torch.arange(out_f).split(list(segments or (out_f,)))
            rows = torch.cat([p.tensor_split(n)[r] for p in pieces])
            full_w = full_w[rows]
            full_b = full_b[rows] if bias else None
        elif mode == "row" and n > 1:
            full_w = full_w.tensor_split(n, dim=1)[r]
        self.weight = nn.Parameter(full_w.to(dtype=dtype, device=device).contiguous())
        self.bias = nn.Parameter(full_b.to(dtype=dtype, device=device)) if bias else None

    def pieces(self, piece: int, pieces: int) -> list[tuple[torch.Tensor, int, torch.Tensor]]:
        """(parameter, dimension, indices) of this rank's shard cut into ``pieces`` along the
        sharded dimension (each part of a fused weight alike): piece ``piece`` is the piece a rank
        at ``pieces`` times this tp holds whole (the biases of a row-parallel layer are replicated)."""
        dim = 0 if self.mode == "column" else 1
        index, offset = [], 0
        for part in self.segments:
            local = part // self.tp.size
            size = local // pieces
            index.append(torch.arange(offset + piece * size, offset + (piece + 1) * size))
            offset += local
        index = torch.cat(index).to(self.weight.device)
        out = [(self.weight, dim, index)]
        if self.bias is not None and self.mode == "column":
            out.append((self.bias, 0, index))
        return out

    def forward(self, x):
        if self.mode == "column":
            return F.linear(x, self.weight, self.bias)
        y = F.linear(x, self.weight)
        if self.tp.sharded:
            y = ReduceScatterToSequence.apply(y, self.tp)
        elif self.tp.size > 1:
            y = ReduceFromTensorParallel.apply(y, self.tp.group, self.tp.timer)
        return y if self.bias is None else y + self.bias


class RMSNorm(nn.Module):
    def __init__(self, h, *, dtype, device, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h, dtype=dtype, device=device))
        self.eps = eps

    def forward(self, x):
        return RMSNormFunction.apply(x, self.weight, self.eps)


def _norm(shape: ModelShape, dtype, device):
    if shape.preset == "gpt":
        return nn.LayerNorm(shape.hidden, eps=1e-5, dtype=dtype, device=device)
    return RMSNorm(shape.hidden, dtype=dtype, device=device)


class Attention(nn.Module):
    """Causal self-attention over this rank's heads; input already through f."""

    def __init__(self, shape: ModelShape, *, gen, tp, kernel, dtype, device):
        super().__init__()
        h, g, d = shape.hidden, shape.kv_dim, shape.head_dim
        self.heads, self.kv_heads, self.head_dim = shape.heads // tp.size, shape.kv_heads // tp.size, d
        self.kernel = kernel
        self.rotary = not (shape.preset == "gpt" and shape.position_embeddings)
        self.dropout_p = DROPOUT_P if shape.dropout else 0.0
        common = dict(gen=gen, tp=tp, dtype=dtype, device=device)
        if shape.preset == "gpt":
            self.qkv = ParallelLinear(h, h + 2 * g, bias=True, mode="column", segments=(h, g, g), **common)
        else:
            self.q = ParallelLinear(h, h, bias=shape.qkv_bias, mode="column", **common)
            self.k = ParallelLinear(h, g, bias=shape.qkv_bias, mode="column", **common)
            self.v = ParallelLinear(h, g, bias=shape.qkv_bias, mode="column", **common)
        self.out = ParallelLinear(h, h, bias=shape.preset == "gpt", mode="row", **common)
        self._tables: dict = {}
        self.recompute_core = False  # selective recomputation (set by :func:`set_recompute`)

    def _cached(self, key, make):
        if key not in self._tables:
            self._tables[key] = make()
        return self._tables[key]

    def forward(self, x):
        batch, s, _ = x.shape
        a, k, d = self.heads, self.kv_heads, self.head_dim
        if hasattr(self, "qkv"):
            q, kk, v = self.qkv(x).split([a * d, k * d, k * d], dim=-1)
        else:
            q, kk, v = self.q(x), self.k(x), self.v(x)
        q, kk, v = q.view(batch, s, a, d), kk.view(batch, s, k, d), v.view(batch, s, k, d)
        if hasattr(self, "qkv"):
            # Own storages, so what attention saves is Q, K and V, not views pinning the whole QKV output.
            q, kk, v = q.contiguous(), kk.contiguous(), v.contiguous()
        if self.rotary:
            cos, sin = self._cached(("rope", s, x.dtype, x.device),
                                    lambda: rotary_tables(s, d, x.dtype, x.device))
            q, kk = RotaryFunction.apply(q, cos, sin), RotaryFunction.apply(kk, cos, sin)
        if self.recompute_core and torch.is_grad_enabled():  # selective recomputation: Q, K, V kept
            return self.out(checkpoint(self._core, q, kk, v, use_reentrant=True))
        return self.out(self._core(q, kk, v))

    def _core(self, q, kk, v):
        """The attention core, softmax(Q K^T / sqrt(d)) V: what selective recomputation runs again."""
        batch, s, a, d = q.shape
        k = kk.shape[2]
        dropout = self.dropout_p if self.training else 0.0
        if self.kernel == "flash":
            y = F.scaled_dot_product_attention(q.transpose(1, 2), kk.transpose(1, 2), v.transpose(1, 2),
                                               dropout_p=dropout, is_causal=True, enable_gqa=a != k)
            y = y.transpose(1, 2).reshape(batch, s, a * d)
        else:
            rep = a // k
            # Queries of one K/V group stacked along the sequence: (batch, k, rep*s, d).
            qg = q.view(batch, s, k, rep, d).permute(0, 2, 3, 1, 4).reshape(batch, k, rep * s, d)
            scores = torch.matmul(qg, kk.transpose(1, 2).transpose(-1, -2)) * (1.0 / math.sqrt(d))
            mask = self._cached(("mask", s, rep, q.dtype, q.device), lambda: torch.full(
                (s, s), float("-inf"), dtype=q.dtype, device=q.device).triu(1).repeat(rep, 1))
            probs = torch.softmax(scores + mask, dim=-1)
            if dropout:
                probs = F.dropout(probs, dropout)
            y = torch.matmul(probs, v.transpose(1, 2))  # (batch, k, rep*s, d)
            y = y.view(batch, k, rep, s, d).permute(0, 3, 1, 2, 4).reshape(batch, s, a * d)
        return y


class MLP(nn.Module):
    def __init__(self, shape: ModelShape, *, gen, tp, dtype, device):
        super().__init__()
        h, f = shape.hidden, shape.ffn
        common = dict(gen=gen, tp=tp, dtype=dtype, device=device)
        self.gated = shape.gated_mlp
        if self.gated:
            self.gate = ParallelLinear(h, f, bias=False, mode="column", **common)
            self.up = ParallelLinear(h, f, bias=False, mode="column", **common)
            self.down = ParallelLinear(f, h, bias=False, mode="row", **common)
        else:
            self.fc1 = ParallelLinear(h, f, bias=True, mode="column", **common)
            self.fc2 = ParallelLinear(f, h, bias=True, mode="row", **common)

    def forward(self, x):
        if self.gated:
            return self.down(SwiGLUFunction.apply(self.gate(x), self.up(x)))
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attn(norm1(x)), then + mlp(norm2(.)); Megatron f/g under tp > 1."""

    def __init__(self, shape: ModelShape, *, gen, tp, kernel, dtype, device):
        super().__init__()
        for what, count in (("heads", shape.heads), ("kv_heads", shape.kv_heads), ("ffn", shape.ffn)):
            if count % tp.size:
                raise InputError("tp", f"tensor-parallel degree {tp.size} must divide model.{what} ({count})")
        self.tp = tp
        self.norm1 = _norm(shape, dtype, device)
        self.attn = Attention(shape, gen=gen, tp=tp, kernel=kernel, dtype=dtype, device=device)
        self.norm2 = _norm(shape, dtype, device)
        self.mlp = MLP(shape, gen=gen, tp=tp, dtype=dtype, device=device)
        self.drop = nn.Dropout(DROPOUT_P) if shape.dropout else nn.Identity()
        self.recompute = False  # full recomputation (set by :func:`set_recompute`)
        if tp.sharded:  # replicated, but each rank sees its part of the sequence: gradients summed over tp
            for p in [*self.norm1.parameters(), *self.norm2.parameters(), *(
                    m.bias for m in self.modules() if isinstance(m, ParallelLinear) and m.mode == "row" and m.bias
                    is not None)]:
                p.sequence_parallel = True

    def _f(self, x):
        if self.tp.size == 1:
            return x
        if self.tp.sharded:
            return GatherFromSequence.apply(x, self.tp)
        return CopyToTensorParallel.apply(x, self.tp.group, self.tp.timer)

    def forward(self, x):
        if self.recompute and torch.is_grad_enabled():  # full recomputation: the input kept
            return checkpoint(self._forward, x, use_reentrant=True)
        return self._forward(x)

    def _forward(self, x):
        x = x + self.drop(self.attn(self._f(self.norm1(x))))
        return x + self.drop(self.mlp(self._f(self.norm2(x))))


class Embedding(nn.Module):
    def __init__(self, shape: ModelShape, *, gen, dtype, device):
        super().__init__()
        self.word = nn.Parameter(_normal(gen, shape.vocab, shape.hidden).to(dtype=dtype, device=device))
        self.position = (nn.Parameter(_normal(gen, shape.max_positions, shape.hidden).to(dtype=dtype, device=device))
                         if shape.position_embeddings else None)
        self.drop = nn.Dropout(DROPOUT_P) if shape.dropout else nn.Identity()

    def forward(self, tokens):
        x = F.embedding(tokens, self.word)
        if self.position is not None:
            x = x + F.embedding(torch.arange(tokens.shape[1], device=tokens.device), self.position)
        return self.drop(x)


class Head(nn.Module):
    """Final norm, projection to the vocabulary (no bias), mean fp32 cross-entropy."""

    def __init__(self, shape: ModelShape, *, gen, word, dtype, device):
        super().__init__()
        self.norm = _norm(shape, dtype, device)
        if word is None:
            word = nn.Parameter(_normal(gen, shape.vocab, shape.hidden).to(dtype=dtype, device=device))
        self.weight = word

    def forward(self, x, targets):
        logits = F.linear(self.norm(x), self.weight)
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


# ---------------------------------------------------------------- assembly

def build_layer(shape: ModelShape, index: int, *, attention: str = "eager", dtype=None, device="cpu",
                seed: int = 0, tp: TensorParallel | None = None, word=None):
    """The module of amp_opt layer ``index`` (0 = embedding, last = head).

    ``word`` is the embedding's word table for a tied head built alongside it;
    a tied head built without it gets an identically initialised copy.

    Examples
    --------
    >>> shape = model_shape({"preset": "llama", "hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2,
    ...                      "seq_len": 16, "vocab": 100, "ffn": 128})
    >>> block = build_layer(shape, 1, attention="flash")
    """
    if attention not in ATTENTION_KERNELS:
        raise InputError("attention", f"must be one of {', '.join(ATTENTION_KERNELS)}, got {attention!r}")
    n = shape.layers + 2
    if not 0 <= index < n:
        raise InputError("layer", f"index {index} is outside 0..{n - 1}")
    dtype = torch_dtype(dtype, shape)
    tp = tp or TensorParallel()
    if index == 0:
        return Embedding(shape, gen=_generator(seed, 0), dtype=dtype, device=device)
    if index == n - 1:
        # A tied copy is drawn exactly as the embedding draws its word table (first, same seed).
        gen = _generator(seed, 0) if shape.tied_embeddings and word is None else _generator(seed, index)
        if shape.tied_embeddings and word is None:
            word = nn.Parameter(_normal(gen, shape.vocab, shape.hidden).to(dtype=dtype, device=device))
        return Head(shape, gen=gen, word=word, dtype=dtype, device=device)
    return TransformerBlock(shape, gen=_generator(seed, index), tp=tp, kernel=attention, dtype=dtype, device=device)


def build_model(shape: ModelShape, *, layers: range | None = None, attention: str = "eager", dtype=None,
                device="cpu", seed: int = 0, tp: TensorParallel | None = None):
    """The layers ``layers`` (default: all) as an ordered ``nn.ModuleDict`` keyed by amp_opt name.

    A tied head shares the embedding's word table when both are built.

    Examples
    --------
    >>> shape = model_shape({"preset": "gpt", "hidden": 64, "layers": 2, "heads": 4, "seq_len": 16, "vocab": 100})
    >>> list(build_model(shape))
    ['embedding', 'layer_0', 'layer_1', 'head']
    """
    names = layer_names(shape)
    layers = range(len(names)) if layers is None else layers
    out = nn.ModuleDict()
    for i in layers:
        word = out["embedding"].word if (i == len(names) - 1 and shape.tied_embeddings and "embedding" in out) else None
        out[names[i]] = build_layer(shape, i, attention=attention, dtype=dtype, device=device, seed=seed, tp=tp,
                                    word=word)
    return out


def set_recompute(layers, mode: str, *, first: int = 0) -> list[str]:
    """Make the transformer blocks of ``layers`` recompute in ``mode`` ("none", "selective": the
    attention core, "full": the whole block) on backward, the first ``first`` blocks only when it
    is > 0 with "full" (Megatron's block method); embedding and head never recompute.  Returns the
    names of the blocks that recompute."""
    blocks = [name for name, module in layers.items() if isinstance(module, TransformerBlock)]
    chosen = blocks[:first] if mode == "full" and first > 0 else blocks if mode != "none" else []
    for name in blocks:
        layers[name].recompute = mode == "full" and name in chosen
        layers[name].attn.recompute_core = mode == "selective"
    return chosen


def run_layers(layers, x, targets=None):
    """Run an ordered slice of layers; the head (if present) consumes ``targets`` and returns the loss.
    Sequence-parallel blocks get their shard of the sequence, and the whole is gathered after them."""
    sharded = None
    for module in layers.values():
        tp = module.tp if isinstance(module, TransformerBlock) and module.tp.sharded else None
        if tp is not None and sharded is None:
            x, sharded = ScatterToSequence.apply(x, tp), tp
        elif tp is None and sharded is not None:
            x, sharded = GatherToWhole.apply(x, sharded), None
        x = module(x, targets) if isinstance(module, Head) else module(x)
    return x if sharded is None else GatherToWhole.apply(x, sharded)


def parameter_count(module) -> int:
    """Distinct parameters (elements) of a module; a shared tensor counts once."""
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())
