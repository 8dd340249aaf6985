"""What the runtime's modules save for backward, next to amp_opt's preset formula.

:func:`formula_activation_bytes` evaluates :mod:`amp_opt.model.presets`' activation
memory at tp = 1 for a micro-batch, with the element size of the dtype actually
run.  :func:`expected_saved_bytes` adds the documented differences between that
formula and what the runtime's modules save on CPU (measured with
:class:`amp_opt.runtime.memory.SavedTensorTracker`), term by term.  For the eager
attention kernel the sum is exact, byte for byte:

transformer block (both presets)
    + norm statistics the formula omits: LayerNorm keeps mean and 1/std per
      token (2 values per norm, in the input dtype on CPU; fp32 on CUDA);
      the runtime's RMSNorm keeps 1/rms per token in fp32 (1 value per norm).
embedding
    + the int64 token ids (8 bytes per token) the embedding lookup saves;
    + the int64 position ids (8 bytes per position, once per micro-batch) for
      learned positions.
head
    - the formula's half-precision logits b*s*v: the runtime casts the logits to
      fp32 and only the fp32 log-probabilities (the formula's 4*s*v) are kept;
    + the int64 targets (8 bytes per token) and the loss normaliser (one fp32);
    + the final norm's statistics, as in a block.

The ``"flash"`` kernel (``scaled_dot_product_attention``) keeps no s x s
probabilities (- b*a*s^2) but a fp32 log-sum-exp per head and token (+ 4*a*s);
depending on the kernel's output layout its output is a separate tensor from the
output projection's input (+ up to b*s*h): :func:`expected_saved_bytes` gives
the range for it.
"""

from __future__ import annotations

from dataclasses import replace

from ..model.presets import ModelShape, build_layers

INDEX_BYTES = 8  # int64 token / position ids
FP32 = 4


def formula_activation_bytes(shape: ModelShape, index: int, micro_batch: int, element_bytes: int) -> float:
    """The preset formula's bytes kept for backward by layer ``index`` (tp = 1, one micro-batch),
    with the eager attention kernel's s x s terms (the baseline the differences below are from,
    whatever ``shape.attention`` says).

    Examples
    --------
    >>> from ..model.presets import parse_model
    >>> m = parse_model({"preset": "gpt", "hidden": 8, "layers": 1, "heads": 2, "seq_len": 4, "vocab": 10})
    >>> formula_activation_bytes(m, 0, 1, 2)  # the embedding dropout mask, s*h
    32.0
    """
    layer = build_layers(replace(shape, dtype_bytes=element_bytes, attention="eager"))[index]
    memory = layer["activation_memory_bytes"]
    return micro_batch * (memory["replicated"] + memory["sharded"])


def _norm_stats(shape: ModelShape, tokens: int, element_bytes: int, norms: int) -> int:
    if shape.preset == "gpt":
        return norms * 2 * tokens * element_bytes  # LayerNorm mean and rstd (CPU: input dtype)
    return norms * tokens * FP32  # RMSNorm rstd, fp32


def formula_differences(shape: ModelShape, index: int, micro_batch: int, element_bytes: int,
                        attention: str = "eager") -> dict[str, int]:
    """Named byte terms to add to the formula to get what the module saves (CPU).

    For ``attention="flash"`` the ``flash_output_copy`` term is the upper end of
    the range (see the module docstring); the lower end is without it.
    """
    s, h, a, v = shape.seq_len, shape.hidden, shape.heads, shape.vocab
    tokens = micro_batch * s
    last = shape.layers + 1
    if index == 0:
        out = {"token_ids": INDEX_BYTES * tokens}
        if shape.position_embeddings:
            out["position_ids"] = INDEX_BYTES * s
        return out
    if index == last:
        return {"fp16_logits_not_kept": -element_bytes * tokens * v, "target_ids": INDEX_BYTES * tokens,
                "loss_normaliser": FP32, "norm_statistics": _norm_stats(shape, tokens, element_bytes, 1)}
    out = {"norm_statistics": _norm_stats(shape, tokens, element_bytes, 2)}
    if attention == "flash":
        out["no_attention_probabilities"] = -element_bytes * micro_batch * a * s * s
        out["logsumexp"] = FP32 * micro_batch * a * s
        out["flash_output_copy"] = element_bytes * tokens * h
    return out


def expected_saved_bytes(shape: ModelShape, index: int, micro_batch: int, element_bytes: int,
                         attention: str = "eager") -> tuple[float, float]:
    """(low, high) bytes the runtime's module saves on CPU; low == high except for flash."""
    terms = formula_differences(shape, index, micro_batch, element_bytes, attention)
    base = formula_activation_bytes(shape, index, micro_batch, element_bytes) + sum(terms.values())
    return base - terms.get("flash_output_copy", 0), base
