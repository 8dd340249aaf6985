"""Instances whose model comes from a preset or a Hugging Face config.json load and solve."""

import json

import pytest

from amp_opt import InputError, load_instance, solve

CLUSTER = {
    "nodes": [{"name": "a100", "count": 2, "device_type": "A100-80GB", "devices": 8,
               "intra_bandwidth": "300 GB/s", "inter_bandwidth": "200 Gbit/s"},
              {"name": "v100", "count": 2, "device_type": "V100-32GB", "devices": 8,
               "intra_bandwidth": "150 GB/s", "inter_bandwidth": "100 Gbit/s"}],
    "training": {"global_batch": 64},
}

LLAMA_3_8B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
              "max_position_embeddings": 8192, "tie_word_embeddings": False}


def test_hf_config_file_is_read_relative_to_the_instance(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_3_8B))
    doc = {"version": 1, "model": {"hf_config": "config.json", "seq_len": 2048}, **CLUSTER}
    (tmp_path / "inst.json").write_text(json.dumps(doc))
    inst = load_instance(tmp_path / "inst.json")
    assert inst.num_layers == 34  # embedding, 32 blocks, head
    assert sum(layer.params.at(1) for layer in inst.layers) == 8_030_261_248
    assert any("Hugging Face" in note for note in inst.notes)
    result = solve(inst, placement="rank-order")
    assert result.best.feasible


def test_gpt_preset_instance_solves_with_catalog_gpus():
    doc = {"version": 1, "model": {"preset": "gpt", "hidden": 2048, "layers": 24, "heads": 16, "seq_len": 2048,
                                   "vocab": 51200}, **CLUSTER}
    inst = load_instance(doc)
    assert inst.device_types["A100-80GB"].memory == 80 * 2**30  # from the catalog
    result = solve(inst, placement="rank-order")
    assert result.best.feasible and result.best.notes  # compute was estimated from FLOPs, and it says so


def test_bad_preset_and_missing_config_name_the_field(tmp_path):
    with pytest.raises(InputError, match="model"):
        load_instance({"version": 1, "model": {"preset": "gpt", "hidden": 1000, "layers": 2, "heads": 16,
                                               "seq_len": 8, "vocab": 10}, **CLUSTER})
    doc = {"version": 1, "model": {"hf_config": "nope.json"}, **CLUSTER}
    (tmp_path / "inst.json").write_text(json.dumps(doc))
    with pytest.raises(InputError, match="nope.json"):
        load_instance(tmp_path / "inst.json")
