"""Turn a parsed Hugging Face ``config.json`` into a model preset dict.

Covers GPT-2 ("gpt2"), GPT-NeoX ("gpt_neox") and Llama-style ("llama", "mistral",
"qwen2") configs without depending on ``transformers``: only the keys that
determine parameter counts, FLOPs and activations are read, with Hugging Face's
own defaults where a config may omit a key.  GPT-NeoX maps to the gpt preset
with ``position_embeddings: false`` (rotary) and untied embeddings; its parallel
residual does not change parameters or FLOPs.
"""

from __future__ import annotations

from ..errors import InputError
from .fields import number_field

LLAMA_STYLE = ("llama", "mistral", "qwen2")
SUPPORTED = ("gpt2", "gpt_neox") + LLAMA_STYLE


def _int(config: dict, key: str, field: str, default=None) -> int:
    """A positive integer config value; missing without a default is an error naming the model type."""
    if config.get(key) is None and default is None:
        raise InputError(f"{field}.{key}", f"is required for model_type {config.get('model_type')!r} but missing")
    return number_field(config, key, field, default=default)


def _bool(config: dict, key: str, field: str, default: bool) -> bool:
    value = config.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InputError(f"{field}.{key}", f"must be true or false, got {value!r}")
    return value


def _any_dropout(config: dict, keys: tuple[str, ...], field: str, default: float) -> bool:
    """Whether any of the dropout probabilities is positive (HF default if absent)."""
    active = False
    for key in keys:
        value = config.get(key, default)
        if value is None:
            value = default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise InputError(f"{field}.{key}", f"must be a probability in [0, 1), got {value!r}")
        active = active or value > 0
    return active


def seq_len_field(field: str) -> str:
    """Where a bad ``seq_len`` is reported: beside the config ("model.hf_config" -> "model.seq_len")."""
    return field.rsplit(".", 1)[0] + ".seq_len" if "." in field else "seq_len"


def _seq_len(seq_len, max_positions: int, field: str) -> int:
    if seq_len is None:
        return max_positions
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len <= 0:
        raise InputError(seq_len_field(field), f"must be a positive integer, got {seq_len!r}")
    return seq_len


def _name(config: dict, model_type: str) -> str:
    name = config.get("_name_or_path")
    return name if isinstance(name, str) and name else model_type


def preset_from_hf_config(config: dict, field: str, seq_len: int | None = None) -> dict:
    """The preset dict (see ``amp_opt.presets``) equivalent to a HF model config."""
    if not isinstance(config, dict):
        raise InputError(field, f"must be an object (a parsed config.json), got {type(config).__name__}")
    model_type = config.get("model_type")
    if model_type not in SUPPORTED:
        raise InputError(f"{field}.model_type",
                         f"unsupported {model_type!r}; supported: {', '.join(SUPPORTED)}")
    if model_type == "gpt2":
        return _from_gpt2(config, field, seq_len)
    if model_type == "gpt_neox":
        return _from_gpt_neox(config, field, seq_len)
    return _from_llama(config, field, seq_len)


def _from_gpt2(config: dict, field: str, seq_len) -> dict:
    """GPT-2: learned positions (n_positions, or n_ctx in old configs), tied by default."""
    hidden = _int(config, "n_embd", field)
    positions_key = "n_positions" if "n_positions" in config else "n_ctx"
    positions = _int(config, positions_key, field)
    s = _seq_len(seq_len, positions, field)
    if s > positions:
        raise InputError(seq_len_field(field), f"must not exceed {positions_key} ({positions}), got {s}")
    return {
        "preset": "gpt",
        "name": _name(config, "gpt2"),
        "hidden": hidden,
        "layers": _int(config, "n_layer", field),
        "heads": _int(config, "n_head", field),
        "seq_len": s,
        "vocab": _int(config, "vocab_size", field),
        "ffn": _int(config, "n_inner", field, default=4 * hidden),
        "tied_embeddings": _bool(config, "tie_word_embeddings", field, True),
        "max_positions": positions,
        "dropout": _any_dropout(config, ("embd_pdrop", "attn_pdrop", "resid_pdrop"), field, 0.1),
    }


def _from_gpt_neox(config: dict, field: str, seq_len) -> dict:
    """GPT-NeoX: rotary (no position table), untied by default, 4h GELU MLP with biases."""
    return {
        "preset": "gpt",
        "name": _name(config, "gpt_neox"),
        "hidden": _int(config, "hidden_size", field),
        "layers": _int(config, "num_hidden_layers", field),
        "heads": _int(config, "num_attention_heads", field),
        "seq_len": _seq_len(seq_len, _int(config, "max_position_embeddings", field), field),
        "vocab": _int(config, "vocab_size", field),
        "ffn": _int(config, "intermediate_size", field),
        "tied_embeddings": _bool(config, "tie_word_embeddings", field, False),
        "position_embeddings": False,
        "dropout": _any_dropout(config, ("attention_dropout", "hidden_dropout"), field, 0.0),
    }


def _from_llama(config: dict, field: str, seq_len) -> dict:
    """Llama / Mistral / Qwen2: RMSNorm, SwiGLU, GQA; Qwen2 adds q/k/v biases."""
    hidden = _int(config, "hidden_size", field)
    heads = _int(config, "num_attention_heads", field)
    head_dim = config.get("head_dim")
    if head_dim is not None and (hidden % heads or head_dim != hidden // heads):
        raise InputError(f"{field}.head_dim",
                         f"only head_dim = hidden_size / num_attention_heads ({hidden}/{heads}) "
                         f"is supported, got {head_dim!r}")
    preset = {
        "preset": "llama",
        "name": _name(config, config["model_type"]),
        "hidden": hidden,
        "layers": _int(config, "num_hidden_layers", field),
        "heads": heads,
        # HF: a missing num_key_value_heads means multi-head attention.
        "kv_heads": _int(config, "num_key_value_heads", field, default=heads),
        "seq_len": _seq_len(seq_len, _int(config, "max_position_embeddings", field), field),
        "vocab": _int(config, "vocab_size", field),
        "ffn": _int(config, "intermediate_size", field),
        "tied_embeddings": _bool(config, "tie_word_embeddings", field, False),
        "dropout": _any_dropout(config, ("attention_dropout",), field, 0.0),
    }
    if config["model_type"] == "qwen2":
        preset["qkv_bias"] = True
    elif _bool(config, "attention_bias", field, False):
        # Llama's optional attention_bias also puts a bias on o_proj; not modelled.
        raise InputError(f"{field}.attention_bias", "attention biases are not supported for Llama-style presets")
    return preset
