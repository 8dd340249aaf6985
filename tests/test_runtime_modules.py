"""The engine's modules: parameter counts and saved activations against amp_opt's presets."""

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from amp_opt.runtime.accounting import expected_saved_bytes, formula_activation_bytes  # noqa: E402
from amp_opt.runtime.memory import SavedTensorTracker, saved_activation_bytes  # noqa: E402
from amp_opt.runtime.modules import (  # noqa: E402
    DTYPES, TensorParallel, build_layer, build_model, model_shape, parameter_count,
)
from amp_opt.errors import InputError  # noqa: E402
from amp_opt.model.presets import build_layers  # noqa: E402

SHAPES = {
    "gpt": dict(preset="gpt", hidden=64, layers=2, heads=4, seq_len=16, vocab=100, dropout=False),
    "gpt_untied_rotary": dict(preset="gpt", hidden=64, layers=2, heads=4, seq_len=16, vocab=100, ffn=96,
                              dropout=False, position_embeddings=False, tied_embeddings=False),
    "gpt_long_positions": dict(preset="gpt", hidden=32, layers=1, heads=2, seq_len=8, max_positions=20, vocab=50),
    "llama_gqa_qkv_bias": dict(preset="llama", hidden=64, layers=2, heads=4, kv_heads=2, seq_len=16, vocab=100,
                               ffn=96, qkv_bias=True),
    "llama_tied_mha": dict(preset="llama", hidden=64, layers=2, heads=4, seq_len=24, vocab=100, ffn=96,
                           tied_embeddings=True),
}


def _counts(shape, tp=1):
    return [layer["params"]["replicated"] + layer["params"]["sharded"] / tp for layer in build_layers(shape)]


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_parameter_counts_equal_the_preset(name):
    shape = model_shape(SHAPES[name])
    model = build_model(shape)
    assert list(model) == [layer["name"] for layer in build_layers(shape)]
    assert [parameter_count(m) for m in model.values()] == _counts(shape)
    tied = shape.tied_embeddings
    assert (model["head"].weight is model["embedding"].word) == tied
    total = parameter_count(model)
    assert total == sum(_counts(shape)) - (shape.vocab * shape.hidden if tied else 0)


@pytest.mark.parametrize("name", ["gpt", "llama_gqa_qkv_bias"])
def test_tensor_parallel_block_holds_its_share(name):
    shape = model_shape(SHAPES[name])
    per_rank = _counts(shape, tp=2)[1]
    for rank in (0, 1):
        block = build_layer(shape, 1, tp=TensorParallel(2, rank))
        assert parameter_count(block) == per_rank


def test_tensor_parallel_shards_are_slices_of_the_full_layer():
    shape = model_shape(SHAPES["gpt"])
    full = build_layer(shape, 1).attn.qkv.weight
    h = shape.hidden
    halves = [build_layer(shape, 1, tp=TensorParallel(2, r)).attn.qkv.weight for r in (0, 1)]
    for part in range(3):  # q, k and v rows, each split over the ranks
        rows = full[part * h:(part + 1) * h]
        got = torch.cat([halves[r][part * h // 2:(part + 1) * h // 2] for r in (0, 1)])
        assert torch.equal(rows, got)


def test_hf_config_model_builds():
    config = {"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
              "num_hidden_layers": 1, "vocab_size": 100, "intermediate_size": 96, "max_position_embeddings": 32}
    shape = model_shape({"model": {"hf_config": config, "seq_len": 16}})
    assert shape.qkv_bias and shape.kv_heads == 2
    assert [parameter_count(m) for m in build_model(shape).values()] == _counts(shape)


def test_explicit_layer_list_cannot_be_built():
    doc = {"model": {"layers": [{"name": "l0", "params": 10, "activation_bytes": 1}]}}
    with pytest.raises(InputError, match=r"instance\.model\.layers: an explicit layer list has no dimensions"):
        model_shape(doc)


def test_bad_options_are_input_errors():
    shape = model_shape(SHAPES["gpt"])
    with pytest.raises(InputError, match="attention"):
        build_layer(shape, 1, attention="fast")
    with pytest.raises(InputError, match="must divide model.heads"):
        build_layer(shape, 1, tp=TensorParallel(3, 0))
    with pytest.raises(InputError, match="dtype"):
        build_layer(shape, 1, dtype="float8")


def _saved(model, index, shape, batch, dtype):
    module = list(model.values())[index]
    tokens = torch.randint(0, shape.vocab, (batch, shape.seq_len))
    if index == 0:
        return saved_activation_bytes(lambda: module(tokens), exclude=[model])
    x = torch.randn(batch, shape.seq_len, shape.hidden, dtype=dtype, requires_grad=True)
    if index == len(model) - 1:
        return saved_activation_bytes(lambda: module(x, tokens), exclude=[model])
    return saved_activation_bytes(lambda: module(x), exclude=[model])


@pytest.mark.parametrize("dtype_name,element", [("float32", 4), ("bfloat16", 2)])
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_eager_saved_activations_equal_formula_plus_documented_terms(name, dtype_name, element):
    spec = dict(SHAPES[name], dropout=False)
    shape = model_shape(spec)
    model = build_model(shape, dtype=dtype_name, attention="eager")
    for batch in (1, 3):
        for index in range(len(model)):
            low, high = expected_saved_bytes(shape, index, batch, element, "eager")
            assert low == high
            assert _saved(model, index, shape, batch, DTYPES[dtype_name]) == low, (index, batch)


@pytest.mark.parametrize("name", ["gpt", "llama_gqa_qkv_bias"])
def test_flash_keeps_no_quadratic_scores(name):
    shape = model_shape(SHAPES[name])
    for attention in ("flash", "eager"):
        model = build_model(shape, attention=attention, dtype="float32")
        got = _saved(model, 1, shape, 2, torch.float32)
        low, high = expected_saved_bytes(shape, 1, 2, 4, attention)
        assert low <= got <= high
    # the formula's b*a*s^2 term is what flash does not keep
    eager = _saved(build_model(shape, attention="eager", dtype="float32"), 1, shape, 2, torch.float32)
    flash = _saved(build_model(shape, attention="flash", dtype="float32"), 1, shape, 2, torch.float32)
    assert eager - flash >= 4 * 2 * shape.heads * shape.seq_len ** 2 - 4 * 2 * shape.heads * shape.seq_len


def test_transformer_formula_term_is_what_the_block_keeps_beyond_norm_statistics():
    shape = model_shape(SHAPES["gpt"])
    model = build_model(shape, dtype="float32")
    stats = 2 * 2 * 2 * shape.seq_len * 4  # 2 LayerNorms x (mean, rstd) x batch 2 x s tokens x fp32
    assert _saved(model, 1, shape, 2, torch.float32) - stats == formula_activation_bytes(shape, 1, 2, 4)


def test_saved_tensors_are_released_after_backward_and_limit_raises():
    shape = model_shape(SHAPES["llama_gqa_qkv_bias"])
    block = build_layer(shape, 1, dtype="float32")
    x = torch.randn(2, shape.seq_len, shape.hidden, requires_grad=True)
    with SavedTensorTracker(exclude=[block]) as tracker:
        y = block(x)
    assert tracker.live > 0
    y.sum().backward()
    del y
    assert tracker.live == 0 and tracker.peak > 0
    with pytest.raises(torch.OutOfMemoryError):
        with SavedTensorTracker(exclude=[block], limit=1000):
            block(x)


def test_tensor_parallel_forward_backward_equal_the_full_block_over_gloo(tmp_path):
    code = r"""
import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
from amp_opt.runtime.modules import model_shape, build_layer, TensorParallel
from amp_opt.runtime.launch import free_port

def work(rank, port, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    for spec in (dict(preset="gpt", hidden=64, layers=1, heads=4, seq_len=16, vocab=50, dropout=False, dtype_bytes=4),
                 dict(preset="llama", hidden=64, layers=1, heads=4, kv_heads=2, seq_len=16, vocab=50, ffn=96, dtype_bytes=4)):
        shape = model_shape(spec)
        x = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(1), requires_grad=True)
        g = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(2))
        full = build_layer(shape, 1)
        y_full = full(x); y_full.backward(g); gx_full = x.grad.clone(); x.grad = None
        part = build_layer(shape, 1, tp=TensorParallel(2, rank, None))
        y = part(x); y.backward(g)
        ok = torch.allclose(y, y_full, atol=1e-5) and torch.allclose(x.grad, gx_full, atol=1e-5)
        norm_ok = torch.allclose(part.norm1.weight.grad, full.norm1.weight.grad, atol=1e-5)
        q.put((rank, spec["preset"], bool(ok), bool(norm_ok)))
    dist.destroy_process_group()

if __name__ == "__main__":
    ctx = mp.get_context("spawn"); q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=work, args=(r, port, q)) for r in range(2)]
    [p.start() for p in procs]; [p.join(120) for p in procs]
    out = [q.get(timeout=5) for _ in range(4)]
    print(sorted(out)); sys.exit(0 if all(o[2] and o[3] for o in out) else 1)
"""
    script = tmp_path / "tp_check.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr


def test_import_amp_opt_engine_does_not_import_torch_and_missing_torch_is_an_input_error():
    code = ("import sys, amp_opt, amp_opt.runtime; assert 'torch' not in sys.modules\n"
            "sys.modules['torch'] = None\n"
            "from amp_opt.errors import InputError\n"
            "try:\n    amp_opt.runtime.profile_model\nexcept InputError as e:\n    print(e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == 'PyTorch is not installed: pip install "amp_opt[torch]"'


@pytest.mark.parametrize("name", ["gpt_untied_rotary", "gpt_long_positions", "llama_gqa_qkv_bias"])
@pytest.mark.parametrize("attention", ["eager", "flash"])
def test_recomputation_gives_the_same_gradients_and_keeps_less(name, attention):
    """Selective and full recomputation (dropout included: the RNG state is replayed) change what is
    kept for backward, never the loss or the gradients; the eager kernel's selective frees b*a*s^2."""
    from amp_opt.runtime.modules import run_layers, set_recompute

    shape = model_shape(SHAPES[name])
    tokens = torch.randint(0, shape.vocab, (2, shape.seq_len), generator=torch.Generator().manual_seed(1))
    kept, grads = {}, {}
    for mode in ("none", "selective", "full"):
        model = build_model(shape, attention=attention)
        assert set_recompute(model, mode) == ([] if mode == "none" else [f"layer_{i}" for i in range(shape.layers)])
        torch.manual_seed(0)
        with SavedTensorTracker(exclude=[model]) as tracker:
            loss = run_layers(model, tokens, tokens)
            kept[mode] = tracker.live
        loss.backward()
        grads[mode] = torch.cat([p.grad.flatten() for p in model.parameters()])
    for mode in ("selective", "full"):
        torch.testing.assert_close(grads[mode], grads["none"], rtol=0, atol=0)
    assert kept["full"] < kept["selective"] <= kept["none"]
    if attention == "eager":  # the probabilities; with dropout its noise and output too (CPU: the input's dtype)
        element = DTYPES["bfloat16" if shape.dtype_bytes == 2 else "float32"].itemsize
        per_score = element * (3 if shape.dropout else 1)
        assert kept["none"] - kept["selective"] == shape.layers * 2 * shape.heads * shape.seq_len ** 2 * per_score
