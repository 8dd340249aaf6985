"""Expand a model preset ("gpt" or "llama") into the instance's per-layer list.

Every quantity is per SAMPLE (one sequence of ``s`` tokens) and is split into a
part each tensor-parallel rank holds whole ("replicated") and a part Megatron-LM
splits evenly over the ``t`` ranks ("sharded"): per rank = replicated + sharded / t.
Symbols: s seq_len, h hidden, a heads, d = h / a head dim, k kv_heads,
g = k*d the K (and V) width, f ffn, v vocab, b dtype_bytes (2 for fp16/bf16).

Parameters (counts)
-------------------
gpt layer (GPT-2 / Megatron, with biases): QKV h*3h + 3h, attention output
h*h + h, fc1 h*f + f, fc2 f*h + h, two LayerNorms 2*2h, i.e. 4h^2 + 2hf + f + 9h
(12h^2 + 13h for f = 4h).  Column-parallel QKV and fc1 shard weight and bias;
row-parallel output and fc2 shard the weight, their biases (2h) and the
LayerNorms (4h) are replicated.
llama layer: q h*h, k and v h*g each, o h*h, gate/up/down 3*h*f, two RMSNorms
2h, no biases (Qwen2 adds q/k/v biases h + 2g, ``qkv_bias``).  All matrices
sharded, norms replicated.
embedding: word table v*h (vocab-parallel, sharded); gpt adds learned positions
max_positions*h (replicated, as in Megatron).  head: final norm (2h LayerNorm,
h RMSNorm, replicated) + output projection v*h (sharded; with tied embeddings it
is the same tensor as the word table and both layers carry ``tie``).

Activation memory kept for backward (no recomputation, no sequence parallelism)
------------------------------------------------------------------------------
Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", Sec. 4.1 / Table 2: a GPT layer stores s*b*h*(34 + 5*a*s/h) bytes at
t = 1 (fp16, 1-byte dropout masks), of which 10*s*h is replicated over tp ranks
and (24 + 5*a*s/h)*s*h sharded.  Term by term, with b bytes per element:

  replicated
    2 norm inputs (LayerNorm/RMSNorm backward needs its input)     2*b*s*h
    QKV-projection input (the norm output)                          b*s*h
    MLP input (fc1, or the shared input of gate and up)             b*s*h
    2 residual dropout masks (1 byte each)               [dropout]  2*s*h
  sharded (per head or per ffn column)
    Q and K for Q K^T                                               b*s*h + b*s*g
    V for softmax(.) V                                              b*s*g
    softmax output (softmax backward)                               b*a*s^2
    attention dropout mask + dropout output (for . V)    [dropout]  a*s^2 + b*a*s^2
    attention output-projection input                               b*s*h
    MLP activation input: GeLU input b*s*f; SwiGLU keeps gate and up  b*s*f or 2*b*s*f
    MLP down-projection input (the activation output)               b*s*f

With b = 2, g = h, f = 4h and dropout this is exactly 10*s*h + (24*s*h + 5*a*s^2).
That is ``"attention": "eager"``.  The default, ``"flash"`` (FlashAttention, Dao et al.
2022), keeps none of the s^2 terms (softmax output, attention dropout mask and output)
but an fp32 log-sum-exp per head and query, 4*a*s bytes.  Each transformer layer also
carries what recomputation needs (``formulations/hetero.md`` H7): ``attention_memory_bytes``
(the s^2 terms, which selective recomputation frees), ``attention_flops`` (forward FLOPs
the attention core executes, which it recomputes; see FLOPs below) and ``kv_bytes`` (K and V, 2*b*s*g,
which context parallelism passes around its ring).
GQA only shrinks K and V (g = k*d < h), assuming the attention kernel reads the
shared K/V heads without materialising repeated copies.  SwiGLU is counted as
Megatron's fused ``bias_swiglu`` does it (saves the gate and up outputs,
recomputes SiLU), the analogue of Korthikanti counting only the GeLU input.
Without dropout (the llama default) the softmax output is the tensor ``. V``
reuses, so it is stored once.  Embedding: the embedding dropout mask s*h
(replicated) if dropout.  Head: final-norm input b*s*h and output-projection
input b*s*h (replicated), fp16 logits b*s*v and fp32 cross-entropy logits 4*s*v
(sharded by vocab, Megatron's vocab-parallel cross entropy).

FLOPs
-----
Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", 2 FLOPs per multiply-add: forward of a layer is
2*s*(weights in matmuls) + 4*s^2*h (Q K^T and scores x V), i.e. 24*s*h^2 +
4*s^2*h for a gpt layer with f = 4h; head 2*s*h*v; training = 3 x forward.
These are the FLOPs executed, which the time estimate (formulations/hetero.md, H2)
divides by the device's rate: with ``"causal": true`` (the default; decoder language
models) and FlashAttention, the kernel skips the blocks the causal mask hides, so the
attention core executes 2*s^2*h; an eager kernel computes all 4*s^2*h.  Model FLOPs
utilisation is reported with the 6 x parameters x tokens convention instead
(``amp_opt.model.evaluate``), which does not depend on the kernel.

Communication
-------------
p2p (``activation_bytes``): the hidden state b*s*h each layer hands on, held
whole by every tp rank (no scatter/gather optimisation), so replicated; the
head sends nothing.  Tensor parallel (``tp_comm_bytes``, all-reduce message
size, forward + backward): transformer layer 4*b*s*h (Megatron's g in forward
and f in backward, for attention and for MLP); vocab-parallel embedding b*s*h
(forward); head b*s*h (backward of the column-parallel projection's input) plus
3 fp32 values per token for the vocab-parallel cross entropy (max, sum of
exponentials, target logit).  ``tp_comm_messages`` counts the allreduces behind them
(4, 1 and 4), each paying its ring steps' latency (H19).

The module is a little over 400 lines because it states every preset's per-layer formulas
(parameters, FLOPs, activations, communication) side by side, one function per layer kind.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError
from .fields import number_field

TIE_WORD_EMBEDDINGS = "word_embeddings"

_COMMON_KEYS = {"preset", "name", "hidden", "layers", "heads", "seq_len", "vocab", "ffn",
                "tied_embeddings", "dtype_bytes", "dropout", "attention", "causal"}
ATTENTION = ("flash", "eager")  # flash (the default): the attention kernel keeps no s x s scores
_PRESET_KEYS = {
    "gpt": _COMMON_KEYS | {"position_embeddings", "max_positions"},
    "llama": _COMMON_KEYS | {"kv_heads", "qkv_bias"},
}


@dataclass(frozen=True)
class ModelShape:
    """A validated preset with every default filled in."""

    preset: str
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    seq_len: int
    vocab: int
    ffn: int
    tied_embeddings: bool
    dtype_bytes: int
    dropout: bool
    position_embeddings: bool
    max_positions: int
    qkv_bias: bool
    attention: str = "flash"
    causal: bool = True  # a decoder's causal mask: flash kernels skip the masked half

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of the K (and of the V) projection: kv_heads * head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def gated_mlp(self) -> bool:
        return self.preset == "llama"


# ---------------------------------------------------------------- validation

def _flag(spec: dict, key: str, field: str, default: bool) -> bool:
    value = spec.get(key, default)
    if not isinstance(value, bool):
        raise InputError(f"{field}.{key}", f"must be true or false, got {value!r}")
    return value


def parse_model(spec: dict, field: str = "model") -> ModelShape:
    """Validate a preset spec (unknown keys, types, divisibility) and fill defaults."""
    if not isinstance(spec, dict):
        raise InputError(field, f"must be an object, got {type(spec).__name__}")
    preset = spec.get("preset")
    if preset not in _PRESET_KEYS:
        raise InputError(f"{field}.preset", f"must be one of {', '.join(sorted(_PRESET_KEYS))}, got {preset!r}")
    unknown = sorted(set(spec) - _PRESET_KEYS[preset], key=str)
    if unknown:
        allowed = ", ".join(sorted(_PRESET_KEYS[preset]))
        raise InputError(f"{field}.{unknown[0]}", f"unknown key for preset {preset!r} (allowed: {allowed})")

    name = spec.get("name", preset)
    if not isinstance(name, str) or not name.strip():
        raise InputError(f"{field}.name", f"must be a non-empty string, got {name!r}")
    hidden = number_field(spec, "hidden", field)
    layers = number_field(spec, "layers", field)
    heads = number_field(spec, "heads", field)
    seq_len = number_field(spec, "seq_len", field)
    vocab = number_field(spec, "vocab", field)
    dtype_bytes = number_field(spec, "dtype_bytes", field, default=2)
    if hidden % heads:
        raise InputError(f"{field}.heads", f"must divide hidden ({hidden}), got {heads}")

    if preset == "gpt":
        ffn = number_field(spec, "ffn", field, default=4 * hidden)
        kv_heads = heads
        tied = _flag(spec, "tied_embeddings", field, True)
        dropout = _flag(spec, "dropout", field, True)
        position_embeddings = _flag(spec, "position_embeddings", field, True)
        qkv_bias = True
        if position_embeddings:
            max_positions = number_field(spec, "max_positions", field, default=seq_len)
            if max_positions < seq_len:
                raise InputError(f"{field}.max_positions",
                                 f"must be at least seq_len ({seq_len}), got {max_positions}")
        else:
            if "max_positions" in spec:
                raise InputError(f"{field}.max_positions", "only applies with position_embeddings: true")
            max_positions = 0
    else:
        ffn = number_field(spec, "ffn", field)
        kv_heads = number_field(spec, "kv_heads", field, default=heads)
        if heads % kv_heads:
            raise InputError(f"{field}.kv_heads", f"must divide heads ({heads}), got {kv_heads}")
        tied = _flag(spec, "tied_embeddings", field, False)
        dropout = _flag(spec, "dropout", field, False)
        qkv_bias = _flag(spec, "qkv_bias", field, False)
        position_embeddings = False
        max_positions = 0

    attention = spec.get("attention", "flash")
    if attention not in ATTENTION:
        raise InputError(f"{field}.attention", f"must be one of {', '.join(ATTENTION)}, got {attention!r}")
    causal = _flag(spec, "causal", field, True)
    return ModelShape(preset, name, hidden, layers, heads, kv_heads, seq_len, vocab, ffn,
                      tied, dtype_bytes, dropout, position_embeddings, max_positions, qkv_bias, attention, causal)


# ---------------------------------------------------------------- parameters

def gpt_layer_params(h: int, f: int) -> tuple[int, int]:
    """(replicated, sharded) parameters of a GPT-2/Megatron layer with biases."""
    replicated = 2 * 2 * h + h + h  # two LayerNorms; row-parallel biases of attn-out and fc2
    sharded = (3 * h * h + 3 * h) + h * h + (h * f + f) + f * h  # QKV, attn-out, fc1, fc2
    return replicated, sharded


def llama_layer_params(h: int, f: int, g: int, qkv_bias: bool = False) -> tuple[int, int]:
    """(replicated, sharded) parameters of a Llama layer: GQA attention, SwiGLU, RMSNorm."""
    replicated = 2 * h  # two RMSNorms
    attention = h * h + 2 * h * g + h * h + ((h + 2 * g) if qkv_bias else 0)
    return replicated, attention + 3 * h * f


def embedding_params(h: int, v: int, positions: int) -> tuple[int, int]:
    """(replicated, sharded): learned position table, vocab-parallel word table."""
    return positions * h, v * h


def head_params(h: int, v: int, norm_params: int) -> tuple[int, int]:
    """(replicated, sharded): final norm, output projection (no bias)."""
    return norm_params, v * h


# ---------------------------------------------------------------- activation memory

def attention_score_memory(s: int, a: int, b: int, dropout: bool, flash: bool) -> float:
    """Sharded bytes per sample the attention core keeps for its s x s scores: the softmax
    output, and with dropout its mask and output (Korthikanti et al. 2022, Sec. 4.1).
    FlashAttention keeps none of them, only an fp32 log-sum-exp per head and query (Dao et
    al. 2022, Sec. 3.1), so selective recomputation has nothing left to free."""
    if flash:
        return 0.0
    return float(b * a * s * s + ((a * s * s + b * a * s * s) if dropout else 0))


def transformer_activation_memory(s: int, h: int, a: int, g: int, f: int, b: int,
                                  gated: bool, dropout: bool, flash: bool = False) -> tuple[float, float]:
    """(replicated, sharded) bytes a layer keeps for backward (Korthikanti et al. 2022)."""
    replicated = 2 * b * s * h + b * s * h + b * s * h  # norm inputs, QKV input, MLP input
    if dropout:
        replicated += 2 * s * h  # residual dropout masks
    attention = b * s * h + 2 * b * s * g + b * s * h  # Q; K, V; proj input
    attention += attention_score_memory(s, a, b, dropout, flash) + (4 * a * s if flash else 0)  # scores, or LSE
    mlp = (2 if gated else 1) * b * s * f + b * s * f  # activation input(s); down-proj input
    return float(replicated), float(attention + mlp)


def embedding_activation_memory(s: int, h: int, dropout: bool) -> tuple[float, float]:
    """(replicated, sharded) bytes: the embedding dropout mask, if any."""
    return float(s * h if dropout else 0), 0.0


def head_activation_memory(s: int, h: int, v: int, b: int) -> tuple[float, float]:
    """(replicated, sharded) bytes: norm and projection inputs; fp16 and fp32 logits."""
    return float(2 * b * s * h), float(b * s * v + 4 * s * v)


# ---------------------------------------------------------------- flops and communication

def transformer_forward_flops(s: int, h: int, matmul_weights: int, attention_core: float | None = None) -> float:
    """Forward FLOPs of a layer (Narayanan et al. 2021): 2*s*weights + 4*s^2*h, the attention
    core's part as executed when given (:func:`attention_core_forward_flops`)."""
    core = 4 * s * s * h if attention_core is None else attention_core
    return float(2 * s * matmul_weights + core)


def attention_core_forward_flops(s: int, h: int, skips_masked: bool = False) -> float:
    """Forward FLOPs the attention core (Q K^T and scores x V) executes: 4*s^2*h (Narayanan et
    al. 2021); half of it when the kernel skips the blocks a causal mask hides (FlashAttention
    with a causal mask; an eager kernel computes the whole s x s matrix and masks it)."""
    return float(4 * s * s * h) / (2.0 if skips_masked else 1.0)


def head_forward_flops(s: int, h: int, v: int) -> float:
    """Forward FLOPs of the output projection to the vocabulary: 2*s*h*v."""
    return float(2 * s * h * v)


def training_flops(forward: float) -> float:
    """Forward + backward without recomputation: backward is twice the forward."""
    return 3.0 * forward


def hidden_state_bytes(s: int, h: int, b: int) -> float:
    """Bytes of the s x h hidden state, the p2p volume after a layer."""
    return float(b * s * h)


def transformer_tp_comm_bytes(s: int, h: int, b: int) -> float:
    """All-reduce bytes of a Megatron layer: 2 forward (g) + 2 backward (f) of s*h."""
    return 4.0 * b * s * h


def embedding_tp_comm_bytes(s: int, h: int, b: int) -> float:
    """All-reduce of the vocab-parallel embedding output (forward only)."""
    return float(b * s * h)


def head_tp_comm_bytes(s: int, h: int, b: int) -> float:
    """Backward all-reduce of the projection input + 3 fp32 per token in cross entropy."""
    return float(b * s * h + 3 * 4 * s)


# The allreduces behind each of the three (H19: each pays its ring steps' latency).
TRANSFORMER_TP_MESSAGES = 4  # g, g forward; f, f backward
EMBEDDING_TP_MESSAGES = 1  # the vocab-parallel embedding's output
HEAD_TP_MESSAGES = 4  # the projection input's gradient; the cross entropy's max, sum and target logit


# ---------------------------------------------------------------- assembly

def _layer(name, kind, params, act, act_mem, flops, tp_comm, tie=None, tied_params=0, **extra) -> dict:
    bytes_, messages = tp_comm
    layer = {
        "name": name,
        "kind": kind,
        "params": {"replicated": int(params[0]), "sharded": int(params[1])},
        "activation_bytes": {"replicated": float(act[0]), "sharded": float(act[1])},
        "activation_memory_bytes": {"replicated": float(act_mem[0]), "sharded": float(act_mem[1])},
        "flops": float(flops),
        "tp_comm_bytes": float(bytes_),
        "tp_comm_messages": int(messages),
    }
    if tie is not None:
        layer["tie"] = tie
        layer["tied_params"] = int(tied_params)
    layer.update(extra)
    return layer


def _matmul_weights(m: ModelShape) -> int:
    """Weights that multiply every token in a layer (biases and norms excluded)."""
    h, f, g = m.hidden, m.ffn, m.kv_dim
    return h * h + 2 * h * g + h * h + (3 if m.gated_mlp else 2) * h * f


def build_layers(m: ModelShape) -> list[dict]:
    """The layer dicts of a validated model, embedding first, head last."""
    s, h, a, v, b = m.seq_len, m.hidden, m.heads, m.vocab, m.dtype_bytes
    hidden_out = (hidden_state_bytes(s, h, b), 0.0)
    tie = TIE_WORD_EMBEDDINGS if m.tied_embeddings else None

    layers = [_layer("embedding", "embedding",
                     embedding_params(h, v, m.max_positions if m.position_embeddings else 0),
                     hidden_out, embedding_activation_memory(s, h, m.dropout),
                     0.0, (embedding_tp_comm_bytes(s, h, b), EMBEDDING_TP_MESSAGES), tie, v * h)]

    if m.preset == "gpt":
        params = gpt_layer_params(h, m.ffn)
        norm = 2 * h
    else:
        params = llama_layer_params(h, m.ffn, m.kv_dim, m.qkv_bias)
        norm = h
    flash = m.attention == "flash"
    memory = transformer_activation_memory(s, h, a, m.kv_dim, m.ffn, b, m.gated_mlp, m.dropout, flash)
    core = attention_core_forward_flops(s, h, skips_masked=flash and m.causal)
    flops = training_flops(transformer_forward_flops(s, h, _matmul_weights(m), core))
    comm = (transformer_tp_comm_bytes(s, h, b), TRANSFORMER_TP_MESSAGES)
    recompute = dict(attention_memory_bytes={"replicated": 0.0,
                                             "sharded": attention_score_memory(s, a, b, m.dropout, flash)},
                     attention_flops=core,
                     kv_bytes={"replicated": 0.0, "sharded": float(2 * b * s * m.kv_dim)})
    layers += [_layer(f"layer_{i}", "transformer", params, hidden_out, memory, flops, comm, **recompute)
               for i in range(m.layers)]

    layers.append(_layer("head", "head", head_params(h, v, norm), (0.0, 0.0),
                         head_activation_memory(s, h, v, b),
                         training_flops(head_forward_flops(s, h, v)),
                         (head_tp_comm_bytes(s, h, b), HEAD_TP_MESSAGES), tie, v * h))
    return layers


def expand_preset(spec: dict, field: str = "model") -> list[dict]:
    """Layer dicts (the loader's format) for a ``{"preset": "gpt"|"llama", ...}`` spec."""
    return build_layers(parse_model(spec, field))


def preset_summary(spec: dict, field: str = "model") -> dict:
    """Totals of a preset: parameters (tied tensor counted once), FLOPs, layer count."""
    m = parse_model(spec, field)
    layers = build_layers(m)
    by_kind: dict[str, int] = {}
    for layer in layers:
        count = layer["params"]["replicated"] + layer["params"]["sharded"]
        by_kind[layer["kind"]] = by_kind.get(layer["kind"], 0) + count
    tied = m.vocab * m.hidden if m.tied_embeddings else 0
    return {
        "name": m.name,
        "preset": m.preset,
        "layers": len(layers),
        "transformer_layers": m.layers,
        "params_total": sum(by_kind.values()) - tied,
        "params_by_kind": by_kind,
        "tied_params": tied,
        "flops_per_sample": sum(layer["flops"] for layer in layers),
        "activation_memory_bytes_per_sample": sum(
            layer["activation_memory_bytes"]["replicated"] + layer["activation_memory_bytes"]["sharded"]
            for layer in layers),
    }
