"""Presets, HF config mapping and GPU catalog checked against published numbers."""

from __future__ import annotations

import copy

import pytest

from amp_opt.model.catalog import CATALOG, GIB, lookup
from amp_opt.errors import InputError
from amp_opt.model.hf_config import preset_from_hf_config
from amp_opt.model.presets import expand_preset, preset_summary

GPT2_MEDIUM = {"preset": "gpt", "hidden": 1024, "layers": 24, "heads": 16, "seq_len": 1024,
               "vocab": 50257, "tied_embeddings": True}
LLAMA2_7B = {"preset": "llama", "hidden": 4096, "layers": 32, "heads": 32, "kv_heads": 32,
             "seq_len": 4096, "vocab": 32000, "ffn": 11008, "tied_embeddings": False}
LLAMA3_70B = {"preset": "llama", "hidden": 8192, "layers": 80, "heads": 64, "kv_heads": 8,
              "seq_len": 4096, "vocab": 128256, "ffn": 28672, "tied_embeddings": False}

HF_GPT2_MEDIUM = {"model_type": "gpt2", "n_embd": 1024, "n_layer": 24, "n_head": 16,
                  "n_positions": 1024, "n_ctx": 1024, "vocab_size": 50257, "n_inner": None,
                  "embd_pdrop": 0.1, "attn_pdrop": 0.1, "resid_pdrop": 0.1}
HF_NEOX_20B = {"model_type": "gpt_neox", "hidden_size": 6144, "num_hidden_layers": 44,
               "num_attention_heads": 64, "intermediate_size": 24576, "vocab_size": 50432,
               "max_position_embeddings": 2048, "tie_word_embeddings": False,
               "rotary_pct": 0.25, "use_parallel_residual": True}
HF_LLAMA3_8B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
                "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                "vocab_size": 128256, "max_position_embeddings": 8192,
                "tie_word_embeddings": False, "attention_dropout": 0.0}
HF_QWEN2_05B = {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
                "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
                "vocab_size": 151936, "max_position_embeddings": 32768,
                "tie_word_embeddings": True}


def spec(base, **changes):
    out = copy.deepcopy(base)
    out.update(changes)
    return out


def layer_of(layers, kind):
    return next(layer for layer in layers if layer["kind"] == kind)


def per_rank(part, t):
    return part["replicated"] + part["sharded"] / t


# ---------------------------------------------------------------- parameter totals

@pytest.mark.parametrize("model, expected", [
    (GPT2_MEDIUM, 354_823_168),     # HF gpt2-medium
    (LLAMA2_7B, 6_738_415_616),     # HF meta-llama/Llama-2-7b-hf
    (LLAMA3_70B, 70_553_706_496),   # HF meta-llama/Meta-Llama-3-70B
])
def test_known_parameter_totals(model, expected):
    assert preset_summary(model)["params_total"] == expected


def test_tied_embedding_counted_once_and_marked_on_both_ends():
    tied = expand_preset(GPT2_MEDIUM)
    untied = expand_preset(spec(GPT2_MEDIUM, tied_embeddings=False))
    assert layer_of(tied, "embedding")["tie"] == layer_of(tied, "head")["tie"]
    assert all("tie" not in layer for layer in untied)
    word_table = 50257 * 1024
    assert (preset_summary(spec(GPT2_MEDIUM, tied_embeddings=False))["params_total"]
            - preset_summary(GPT2_MEDIUM)["params_total"]) == word_table


def test_layer_list_shape():
    layers = expand_preset(LLAMA2_7B)
    assert [layer["kind"] for layer in layers] == ["embedding"] + ["transformer"] * 32 + ["head"]
    assert len({layer["name"] for layer in layers}) == len(layers)
    recompute = {"attention_memory_bytes", "attention_flops", "kv_bytes"}
    for layer in layers:
        assert set(layer) - {"tie"} - recompute == {"name", "kind", "params", "activation_bytes",
                                                   "activation_memory_bytes", "flops", "tp_comm_bytes", "tp_comm_messages"}
        assert (recompute <= set(layer)) == (layer["kind"] == "transformer")
        assert isinstance(layer["params"]["replicated"], int)
        assert isinstance(layer["params"]["sharded"], int)


def test_position_embeddings_follow_max_positions():
    base = preset_summary(GPT2_MEDIUM)["params_total"]
    assert preset_summary(spec(GPT2_MEDIUM, seq_len=512, max_positions=1024))["params_total"] == base
    assert (base - preset_summary(spec(GPT2_MEDIUM, position_embeddings=False))["params_total"]
            == 1024 * 1024)


# ---------------------------------------------------------------- per-rank split

@pytest.mark.parametrize("t", [1, 2, 4, 8, 16])
def test_gpt_layer_per_rank_params_match_megatron_partitioning(t):
    h, f = 1024, 4096
    layer = layer_of(expand_preset(GPT2_MEDIUM), "transformer")
    # Column-parallel QKV / fc1 split weight and bias; row-parallel proj / fc2
    # split the weight and keep the bias whole; LayerNorms are whole.
    megatron = ((3 * h * h + 3 * h) / t + (h * h / t + h) + (h * f + f) / t
                + (f * h / t + h) + 2 * 2 * h)
    assert per_rank(layer["params"], t) == pytest.approx(megatron, rel=1e-12)


@pytest.mark.parametrize("t", [1, 2, 8])
def test_llama_head_per_rank_and_shards_add_up(t):
    head = layer_of(expand_preset(LLAMA3_70B), "head")
    assert per_rank(head["params"], t) == 8192 + 128256 * 8192 / t
    # t ranks together hold one sharded copy plus t replicated copies.
    whole = head["params"]["replicated"] + head["params"]["sharded"]
    assert t * per_rank(head["params"], t) == whole + (t - 1) * head["params"]["replicated"]


# ---------------------------------------------------------------- activation memory

@pytest.mark.parametrize("s, h, a", [(1024, 1024, 16), (2048, 4096, 32), (2048, 12288, 96)])
def test_gpt_layer_activation_memory_is_korthikanti(s, h, a):
    model = {"preset": "gpt", "hidden": h, "layers": 2, "heads": a, "seq_len": s, "vocab": 50000, "attention": "eager"}
    layer = layer_of(expand_preset(model), "transformer")
    mem = layer["activation_memory_bytes"]
    assert per_rank(mem, 1) == pytest.approx(s * h * (34 + 5 * a * s / h), rel=1e-12)
    assert per_rank(mem, 8) == pytest.approx(s * h * (10 + 24 / 8 + 5 * a * s / (8 * h)), rel=1e-12)
    # Selective recomputation keeps the rest: 34 s h (Korthikanti et al. 2022, Table 2).
    assert per_rank(mem, 1) - per_rank(layer["attention_memory_bytes"], 1) == pytest.approx(34 * s * h, rel=1e-12)
    assert layer["attention_flops"] == 4 * s * s * h


@pytest.mark.parametrize("s, h, a", [(1024, 1024, 16), (8192, 16384, 128)])
def test_flash_attention_keeps_no_scores(s, h, a):
    model = {"preset": "gpt", "hidden": h, "layers": 2, "heads": a, "seq_len": s, "vocab": 50000}
    flash = layer_of(expand_preset(model), "transformer")
    eager = layer_of(expand_preset(dict(model, attention="eager")), "transformer")
    # The default keeps an fp32 log-sum-exp per head and query instead of the s x s terms.
    assert per_rank(flash["activation_memory_bytes"], 1) == pytest.approx(34 * s * h + 4 * a * s, rel=1e-12)
    assert per_rank(flash["attention_memory_bytes"], 1) == 0
    assert per_rank(eager["attention_memory_bytes"], 1) == 5 * a * s * s
    # A causal flash kernel skips the masked half of the attention core; an eager one computes it all.
    assert eager["flops"] - flash["flops"] == 3 * 2 * s * s * h
    assert flash["attention_flops"] == eager["attention_flops"] / 2 == 2 * s * s * h
    full = layer_of(expand_preset(dict(model, causal=False)), "transformer")
    assert full["flops"] == eager["flops"]
    assert flash["kv_bytes"] == eager["kv_bytes"] == {"replicated": 0.0,
                                                                                         "sharded": 2 * 2 * s * h}


def test_ffn_width_changes_only_the_mlp_terms():
    small = layer_of(expand_preset(spec(GPT2_MEDIUM, ffn=2048)), "transformer")
    big = layer_of(expand_preset(GPT2_MEDIUM), "transformer")
    s = 1024
    # GeLU input and fc2 input, 2 bytes each, scale with ffn: 4*s*(4096-2048).
    assert big["activation_memory_bytes"]["sharded"] - small["activation_memory_bytes"]["sharded"] == 4 * s * 2048
    assert big["activation_memory_bytes"]["replicated"] == small["activation_memory_bytes"]["replicated"]


def test_unknown_attention_kernel_names_the_field():
    with pytest.raises(InputError, match="model.attention: must be one of flash, eager"):
        expand_preset(spec(GPT2_MEDIUM, attention="sdpa"))


def test_gqa_shrinks_only_k_and_v():
    s, h = 4096, 8192
    gqa = layer_of(expand_preset(LLAMA3_70B), "transformer")["activation_memory_bytes"]
    mha = layer_of(expand_preset(spec(LLAMA3_70B, kv_heads=64)), "transformer")["activation_memory_bytes"]
    g = 8 * 128
    assert mha["sharded"] - gqa["sharded"] == 2 * 2 * s * (h - g)
    assert mha["replicated"] == gqa["replicated"]


def test_llama_layer_activation_memory_terms():
    s, h, a, f, b = 4096, 4096, 32, 11008, 2
    mem = layer_of(expand_preset(spec(LLAMA2_7B, attention="eager")), "transformer")["activation_memory_bytes"]
    # norm inputs x2, attention input, MLP input; no dropout masks.
    assert mem["replicated"] == 4 * b * s * h
    # Q, K, V, softmax output (once: no dropout), proj input, gate+up, down input.
    assert mem["sharded"] == 3 * b * s * h + b * a * s * s + b * s * h + 3 * b * s * f
    # FlashAttention (the default): no softmax output, an fp32 log-sum-exp per head and query.
    flash = layer_of(expand_preset(LLAMA2_7B), "transformer")["activation_memory_bytes"]
    assert flash["sharded"] == mem["sharded"] - b * a * s * s + 4 * a * s


def test_head_activation_memory_counts_fp16_and_fp32_logits():
    s, h, v = 1024, 1024, 50257
    mem = layer_of(expand_preset(GPT2_MEDIUM), "head")["activation_memory_bytes"]
    assert mem == {"replicated": 2 * 2 * s * h, "sharded": 2 * s * v + 4 * s * v}


# ---------------------------------------------------------------- flops and communication

@pytest.mark.parametrize("s, h", [(1024, 1024), (2048, 12288)])
def test_gpt_layer_flops_is_narayanan(s, h):
    model = {"preset": "gpt", "hidden": h, "layers": 1, "heads": 16, "seq_len": s, "vocab": 50000, "attention": "eager"}
    layer = layer_of(expand_preset(model), "transformer")
    assert layer["flops"] == 3 * (24 * s * h * h + 4 * s * s * h)


def test_gpt_model_flops_match_narayanan_closed_form():
    # Narayanan et al. 2021 eq.: 96*B*s*l*h^2*(1 + s/6h + V/16lh) with recomputation
    # (4 passes); without recomputation it is 3/4 of that.
    s, h, l, v = 2048, 12288, 96, 51200
    model = {"preset": "gpt", "hidden": h, "layers": l, "heads": 96, "seq_len": s, "vocab": v, "attention": "eager"}
    expected = 72 * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))
    assert preset_summary(model)["flops_per_sample"] == pytest.approx(expected, rel=1e-12)


def test_llama_layer_flops_with_gqa_and_swiglu():
    s, h, f, g = 4096, 8192, 28672, 1024
    layer = layer_of(expand_preset(LLAMA3_70B), "transformer")
    forward = 2 * s * (2 * h * h + 2 * h * g + 3 * h * f) + 2 * s * s * h  # causal flash: half the core
    assert layer["flops"] == 3 * forward
    assert layer_of(expand_preset(LLAMA3_70B), "head")["flops"] == 3 * 2 * s * h * 128256


def test_communication_volumes():
    s, h = 1024, 1024
    layers = expand_preset(GPT2_MEDIUM)
    transformer = layer_of(layers, "transformer")
    assert transformer["tp_comm_bytes"] == 4 * s * h * 2
    assert transformer["activation_bytes"] == {"replicated": s * h * 2, "sharded": 0.0}
    assert layer_of(layers, "head")["activation_bytes"] == {"replicated": 0.0, "sharded": 0.0}
    fp32 = expand_preset(spec(GPT2_MEDIUM, dtype_bytes=4))
    assert layer_of(fp32, "transformer")["tp_comm_bytes"] == 4 * s * h * 4


# ---------------------------------------------------------------- Hugging Face configs

@pytest.mark.parametrize("config, expected", [
    (HF_GPT2_MEDIUM, 354_823_168),
    (HF_NEOX_20B, 20_554_567_680),
    (HF_LLAMA3_8B, 8_030_261_248),
    (HF_QWEN2_05B, 494_032_768),
])
def test_hf_configs_match_known_sizes(config, expected):
    preset = preset_from_hf_config(config, "model.hf_config")
    assert preset_summary(preset)["params_total"] == expected


def test_hf_mapping_details():
    neox = preset_from_hf_config(HF_NEOX_20B, "model.hf_config")
    assert neox["preset"] == "gpt" and neox["position_embeddings"] is False
    assert neox["tied_embeddings"] is False and neox["seq_len"] == 2048
    gpt2 = preset_from_hf_config(HF_GPT2_MEDIUM, "model.hf_config", seq_len=512)
    assert gpt2["seq_len"] == 512 and gpt2["ffn"] == 4096 and gpt2["tied_embeddings"] is True
    llama = preset_from_hf_config(HF_LLAMA3_8B, "model.hf_config")
    assert llama["kv_heads"] == 8 and llama["seq_len"] == 8192
    old_gpt2 = {k: v for k, v in HF_GPT2_MEDIUM.items() if k != "n_positions"}
    assert preset_from_hf_config(old_gpt2, "m")["seq_len"] == 1024


@pytest.mark.parametrize("config, key", [
    ({**HF_LLAMA3_8B, "model_type": "bert"}, "model.hf_config.model_type"),
    ({k: v for k, v in HF_LLAMA3_8B.items() if k != "model_type"}, "model.hf_config.model_type"),
    ({k: v for k, v in HF_LLAMA3_8B.items() if k != "intermediate_size"}, "model.hf_config.intermediate_size"),
    ({k: v for k, v in HF_NEOX_20B.items() if k != "hidden_size"}, "model.hf_config.hidden_size"),
    ({k: v for k, v in HF_GPT2_MEDIUM.items() if k not in ("n_positions", "n_ctx")}, "model.hf_config.n_ctx"),
    ({**HF_GPT2_MEDIUM, "n_layer": "24"}, "model.hf_config.n_layer"),
    ({**HF_LLAMA3_8B, "num_key_value_heads": 0}, "model.hf_config.num_key_value_heads"),
    ({**HF_LLAMA3_8B, "tie_word_embeddings": "no"}, "model.hf_config.tie_word_embeddings"),
    ({**HF_LLAMA3_8B, "head_dim": 256}, "model.hf_config.head_dim"),
    ({**HF_GPT2_MEDIUM, "resid_pdrop": 1.5}, "model.hf_config.resid_pdrop"),
])
def test_bad_hf_config_names_the_key(config, key):
    with pytest.raises(InputError) as err:
        preset_from_hf_config(config, "model.hf_config")
    assert err.value.field == key
    assert str(err.value).startswith(key + ":")


@pytest.mark.parametrize("seq_len", [2048, 0, 512.0])
def test_hf_bad_seq_len_is_reported_beside_the_config(seq_len):
    with pytest.raises(InputError) as err:
        preset_from_hf_config(HF_GPT2_MEDIUM, "instance.model.hf_config", seq_len=seq_len)
    assert err.value.field == "instance.model.seq_len"


# ---------------------------------------------------------------- bad preset input

def drop(base, key):
    return {k: v for k, v in base.items() if k != key}


@pytest.mark.parametrize("model, field", [
    ({**GPT2_MEDIUM, "heads": 12}, "model.heads"),              # 12 does not divide 1024
    ({**LLAMA3_70B, "kv_heads": 7}, "model.kv_heads"),          # 7 does not divide 64
    ({**GPT2_MEDIUM, "kv_heads": 4}, "model.kv_heads"),         # not a gpt key
    ({**LLAMA2_7B, "position_embeddings": True}, "model.position_embeddings"),
    ({**GPT2_MEDIUM, "hiden": 1024}, "model.hiden"),
    ({**GPT2_MEDIUM, "preset": "bert"}, "model.preset"),
    (drop(GPT2_MEDIUM, "preset"), "model.preset"),
    (drop(LLAMA2_7B, "ffn"), "model.ffn"),
    (drop(GPT2_MEDIUM, "vocab"), "model.vocab"),
    ({**GPT2_MEDIUM, "layers": 0}, "model.layers"),
    ({**GPT2_MEDIUM, "hidden": -1024}, "model.hidden"),
    ({**GPT2_MEDIUM, "seq_len": 1024.0}, "model.seq_len"),
    ({**GPT2_MEDIUM, "vocab": True}, "model.vocab"),
    ({**GPT2_MEDIUM, "ffn": "4096"}, "model.ffn"),
    ({**GPT2_MEDIUM, "dtype_bytes": 0}, "model.dtype_bytes"),
    ({**GPT2_MEDIUM, "tied_embeddings": "yes"}, "model.tied_embeddings"),
    ({**GPT2_MEDIUM, "dropout": 1}, "model.dropout"),
    ({**GPT2_MEDIUM, "name": ""}, "model.name"),
    ({**GPT2_MEDIUM, "max_positions": 512}, "model.max_positions"),   # below seq_len
    ({**GPT2_MEDIUM, "position_embeddings": False, "max_positions": 2048}, "model.max_positions"),
    ({**LLAMA2_7B, "qkv_bias": "true"}, "model.qkv_bias"),
])
def test_bad_preset_input_names_the_field(model, field):
    with pytest.raises(InputError) as err:
        expand_preset(model)
    assert err.value.field == field
    assert err.value.exit_code == 2
    assert str(err.value).startswith(field + ":")


def test_field_prefix_is_the_callers():
    with pytest.raises(InputError) as err:
        expand_preset({**GPT2_MEDIUM, "heads": 12}, field="models[2]")
    assert str(err.value) == "models[2].heads: must divide hidden (1024), got 12"
    with pytest.raises(InputError) as err:
        expand_preset(["gpt"], field="model")
    assert err.value.field == "model"


# ---------------------------------------------------------------- GPU catalog

REQUIRED_GPUS = ["V100-16GB", "V100-32GB", "T4", "A10G", "L4", "A100-40GB", "A100-80GB",
                 "H100-80GB", "H200", "RTX-4090"]


def test_catalog_has_required_gpus_with_sane_numbers():
    for name in REQUIRED_GPUS:
        gpu = CATALOG[name]
        assert gpu.name == name
        assert 8 * GIB <= gpu.memory_bytes <= 160 * GIB
        assert 50e12 <= gpu.peak_flops <= 1.1e15
        assert gpu.source and gpu.intra_node_bandwidth > 0


@pytest.mark.parametrize("name, memory_gib, tflops", [
    ("A100-80GB", 80, 312.0),       # dense BF16, not the 624 sparse figure
    ("H100-80GB", 80, 989.4),       # SXM dense, half of 1,979 sparse
    ("L4", 24, 121.0),              # half of 242 sparse
    ("RTX-4090", 24, 165.2),        # FP16 tensor with FP32 accumulate
    ("A10G", 24, 70.0),             # not the A10's 125
    ("V100-32GB", 32, 125.0),
])
def test_catalog_datasheet_numbers(name, memory_gib, tflops):
    gpu = CATALOG[name]
    assert gpu.memory_bytes == memory_gib * 2**30
    assert gpu.peak_flops == pytest.approx(tflops * 1e12)


@pytest.mark.parametrize("spelling, name", [
    ("a100_80gb", "A100-80GB"), ("A100 80GB", "A100-80GB"), ("a10080gb", "A100-80GB"),
    ("rtx4090", "RTX-4090"), ("RTX 4090", "RTX-4090"), ("h100", "H100-80GB"),
    ("  t4 ", "T4"), ("A10G", "A10G"), ("v100-32gb", "V100-32GB"),
])
def test_lookup_is_tolerant(spelling, name):
    assert lookup(spelling, "cluster.nodes[0].gpu") is CATALOG[name]


@pytest.mark.parametrize("bad", ["A100", "B200", "", 80])
def test_lookup_errors_name_field_and_list_known(bad):
    with pytest.raises(InputError) as err:
        lookup(bad, "cluster.nodes[3].gpu")
    assert err.value.field == "cluster.nodes[3].gpu"
    if isinstance(bad, str):
        for name in REQUIRED_GPUS:
            assert name in str(err.value)
