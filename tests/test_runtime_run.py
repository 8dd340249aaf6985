"""The runner: real pipeline / data / tensor parallel runs on local gloo processes."""

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from amp_opt.model.evaluate import evaluate  # noqa: E402
from amp_opt.runtime.accounting import expected_saved_bytes  # noqa: E402
from amp_opt.runtime.compare import compare_run  # noqa: E402
from amp_opt.runtime.modules import model_shape  # noqa: E402
from amp_opt.runtime.run import run_plan  # noqa: E402
from amp_opt.errors import InputError  # noqa: E402
from amp_opt.model.load import load_instance  # noqa: E402
from amp_opt.model.plan import parse_plan  # noqa: E402

MODEL = {"preset": "gpt", "hidden": 64, "layers": 2, "heads": 4, "seq_len": 32, "vocab": 128, "dropout": False,
         "dtype_bytes": 4}


def doc(devices=2, global_batch=8, model=MODEL):
    return {"format": "amp_opt.instance", "version": 1, "name": "tiny", "model": dict(model),
            "device_types": [{"name": "cpu", "memory": "8 GiB", "peak_flops": 1e11}],
            "nodes": [{"name": "host", "device_type": "cpu", "devices": devices, "intra_bandwidth": "1 GB/s",
                       "inter_bandwidth": "1 GB/s"}],
            "training": {"global_batch": global_batch}}


def plan(tp=1, dp=1, pp=1, mb=2, partition=None):
    return {"tp": tp, "dp": dp, "pp": pp, "micro_batch": mb, "partition": partition or [0, 4]}


RUN = dict(iterations=3, warmup=1, timeout=120)


@pytest.fixture(scope="module")
def single():
    return run_plan(doc(devices=1), plan(), **RUN)


@pytest.fixture(scope="module")
def pipelined():
    return run_plan(doc(), plan(pp=2, partition=[0, 2, 4]), **RUN)


def _consistent(record, n):
    m = record["measured"]
    assert "failed" not in record
    assert len(m["iteration_times"]) == 3 and m["micro_batches_per_iteration"] == n
    assert record["iteration_time"] > 0 and record["peak_memory"] > 0
    assert min(m["iteration_times"]) <= record["iteration_time"] <= max(m["iteration_times"])
    for stage in m["stages"]:
        assert stage["compute"] > 0
        assert stage["compute_per_micro_batch"] == pytest.approx(stage["compute"] / n)
        # An iteration holds its rank's compute, communication and optimizer step.  Each figure is
        # a median over 3 iterations, taken per rank and then the largest over the stage's ranks,
        # so every figure is bounded by the slowest iteration.  Any two medians of 3 values share
        # an iteration at or above both, so on a one-rank stage the slowest iteration also bounds
        # their sum.  With replicas the two maxima can come from different ranks (the fast
        # replica's allreduce includes its wait for the slow one's compute): no sum bound there.
        slowest = max(m["iteration_times"])
        assert all(slowest >= 0.95 * stage[term] for term in ("compute", "allreduce", "p2p", "optimizer"))
        if sum(r["stage"] == stage["stage"] for r in m["ranks"]) == 1:
            assert slowest >= 0.95 * (stage["compute"] + stage["allreduce"] + stage["optimizer"])
        parts = stage["memory"]
        assert stage["peak_memory"] == sum(parts.values())
        assert parts["gradients"] <= parts["parameters"]  # ZeRO-1 pads its flat parameters to a multiple of dp
        sharded = record["plan"].get("zero_stage") and stage["dp"] > 1  # Adam's moments of a shard
        assert parts["optimizer"] == 2 * parts["parameters"] // (stage["dp"] if sharded else 1)
        assert parts["activations_peak"] > 0
    assert record["iteration_time"] >= max(s["compute"] for s in m["stages"])
    assert m["memory_kind"] == "tracked" and m["threads"] >= 1
    assert all(loss == pytest.approx(4.85, abs=0.3) for loss in m["losses"])  # ln(128) at init


def test_pipeline_run_is_consistent_and_computes_the_same_loss(single, pipelined):
    _consistent(single, 4)
    _consistent(pipelined, 4)
    stages = pipelined["measured"]["stages"]
    assert [s["layers"] for s in stages] == [[0, 2], [2, 4]]
    assert all(s["p2p"] > 0 for s in stages) and stages[0]["tie_allreduce"] > 0
    assert pipelined["plan"]["stages"] == [[[0]], [[1]]]
    # The same model on the same data: equal losses, also after Adam steps (the tied copies stay in sync).
    assert pipelined["measured"]["losses"][0] == pytest.approx(single["measured"]["losses"][0], rel=1e-6)
    assert pipelined["measured"]["losses"] == pytest.approx(single["measured"]["losses"], rel=1e-4)
    # 1F1B, byte for byte: stage 0 keeps min(pp, n) = 2 micro-batches of saved activations, their two
    # outputs (held for backward, being sent) and one received gradient; stage 1 (last) keeps one
    # micro-batch and the one input gradient in flight.
    shape = model_shape(MODEL)
    saved = [expected_saved_bytes(shape, i, 2, 4)[0] for i in range(4)]
    hidden = 2 * 32 * 64 * 4
    assert stages[0]["memory"]["activations_peak"] == 2 * (saved[0] + saved[1]) + 3 * hidden
    assert stages[1]["memory"]["activations_peak"] == saved[2] + saved[3] + hidden


@pytest.fixture(scope="module")
def grads_one(tmp_path_factory):
    """(record, dumped gradients) of a single process at micro-batch 1."""
    one = tmp_path_factory.mktemp("one")
    return run_plan(doc(devices=1), plan(mb=1), dump_grads=str(one), **RUN), torch.load(one / "grads.0.pt")


@pytest.fixture(scope="module")
def dp2(tmp_path_factory):
    two = tmp_path_factory.mktemp("two")
    return run_plan(doc(), plan(dp=2, mb=1), dump_grads=str(two), **RUN), two


def test_data_parallel_gradients_equal_a_single_process(grads_one, dp2):
    (ref, grads), (dp2, two) = grads_one, dp2
    _consistent(dp2, 4)
    assert all(s["allreduce"] > 0 for s in dp2["measured"]["stages"])
    assert dp2["measured"]["stages"][0]["memory"]["communication_buffers"] > 0
    for rank in (0, 1):
        got = torch.load(two / f"grads.{rank}.pt")
        assert sorted(got) == sorted(grads)
        for name, g in grads.items():
            torch.testing.assert_close(got[name], g, rtol=1e-5, atol=1e-7)
    assert dp2["measured"]["losses"] == pytest.approx(ref["measured"]["losses"], rel=1e-4)


@pytest.fixture(scope="module")
def tp2():
    return run_plan(doc(), plan(tp=2), **RUN)


def test_tensor_parallel_run_computes_the_same_model(single, tp2):
    _consistent(tp2, 4)
    assert tp2["measured"]["stages"][0]["tp_comm"] > 0
    assert any("replicated" in note for note in tp2["measured"]["notes"])
    assert tp2["measured"]["losses"] == pytest.approx(single["measured"]["losses"], rel=1e-4)


def test_measured_next_to_predicted(pipelined):
    from amp_opt.calibrate.predict import peak_of_stage
    from amp_opt.commands.run import format_comparison

    calibrated = dict(doc(), calibration={"device_types": {"cpu": {"memory_overhead": 2**20}}})
    instance = load_instance(calibrated)
    evaluation = evaluate(instance, parse_plan(pipelined["plan"]), "hetero")
    comparison = compare_run(pipelined, evaluation, instance)
    assert comparison.iteration_time.measured == pipelined["iteration_time"]
    assert comparison.iteration_time.predicted == evaluation.predicted_time
    assert [s.compute_per_micro_batch.predicted for s in comparison.stages] == [s.compute for s in evaluation.stages]
    assert comparison.to_json()["stages"][1]["memory"]["measured"] == pipelined["measured"]["stages"][1]["peak_memory"]
    # The predicted memory is the peak the calibrated model predicts (eq. C5'), in the JSON and the text alike.
    peaks = [peak_of_stage(instance, s) for s in evaluation.stages]
    assert [s["memory"]["predicted"] for s in comparison.to_json()["stages"]] == peaks
    assert peaks[0] == evaluation.stages[0].memory - instance.training.memory_reserve + 2**20
    text = format_comparison(instance, pipelined, evaluation, comparison)
    for stage, peak in zip(text.splitlines()[6:8], peaks):
        assert stage.split()[-1] == f"{peak / 2**20:.2f}"
    assert "peak memory (fullest device, MiB)" in text and f"{max(peaks) / 2**20:.2f}  (tracked)" in text
    # ... and the notes that explain the comparison are printed: a pp=2 run without replicas shows an
    # allreduce, of the tied embedding.
    assert any("tied word embedding" in n for n in comparison.notes)
    assert all(f"note: {n}" in text for n in comparison.notes)


def _refused(instance, bad_plan, match, **kw):
    started = []
    with pytest.raises(InputError, match=match):
        run_plan(instance, bad_plan, on_start=started.append, **kw)
    assert not started


def test_bad_plans_are_refused_before_any_process_starts():
    _refused(doc(), plan(pp=2, partition=[0, 4, 4]), r"plan\.partition")
    _refused(doc(), plan(dp=3), r"tp\*cp\*dp\*pp = 1\*1\*3\*1 = 3, the cluster has 2 devices")
    _refused(doc(devices=4), plan(dp=4, mb=1), r"plan: needs tp\*dp\*pp = 4 processes, this machine has")
    _refused(doc(devices=2, model=dict(MODEL, heads=1, hidden=64)), plan(tp=2), r"plan\.tp")
    explicit = doc()
    explicit["model"] = {"layers": [{"name": f"l{i}", "params": 10, "activation_bytes": 1} for i in range(4)]}
    _refused(explicit, plan(pp=2, partition=[0, 2, 4]), r"instance\.model\.layers")


def _gone(pids):
    return all(not Path(f"/proc/{pid}").exists() for pid in pids)


@pytest.mark.parametrize("how", ["raise", "kill"])
def test_a_failing_or_killed_worker_leaves_no_process(how):
    pids = []
    record = run_plan(doc(), plan(pp=2, partition=[0, 2, 4]), on_start=pids.extend,
                      fault={"rank": 1, "how": how}, **RUN)
    assert record["failed"] == "error" and record["plan"]["pp"] == 2
    assert ("fault injected" in record["error"]) if how == "raise" else ("rank 1: -9" in record["error"])
    assert len(pids) == 2 and _gone(pids)


def test_a_hanging_worker_times_out_and_leaves_no_process():
    pids = []
    record = run_plan(doc(), plan(dp=2), on_start=pids.extend, fault={"rank": 0, "how": "hang"},
                      iterations=1, warmup=0, timeout=15)
    assert record == {"plan": record["plan"], "failed": "error", "error": "timed out after 15 s"}
    assert _gone(pids)


def test_out_of_memory_is_a_record():
    record = run_plan(dict(doc(), training={"global_batch": 8, "memory_reserve": 0}), plan(pp=2, partition=[0, 2, 4]),
                      memory_limit=50_000, **RUN)
    assert record["failed"] == "oom" and "exceed the memory limit" in record["error"]


def test_memory_limit_stands_for_the_device_memory_and_is_recorded(pipelined):
    """--memory-limit is the memory of each device: the tracked total (model state, reduction buffer,
    reserve, activations, buffers) may reach it and not exceed it; the record says what it was."""
    assert "memory_limit" not in pipelined  # CPU without a limit: the processes share the machine's memory
    no_reserve = doc()
    no_reserve["training"]["memory_reserve"] = 0
    peak = pipelined["peak_memory"]
    record = run_plan(no_reserve, plan(pp=2, partition=[0, 2, 4]), memory_limit=peak, **RUN)
    assert "failed" not in record and record["peak_memory"] == peak and record["memory_limit"] == peak
    record = run_plan(no_reserve, plan(pp=2, partition=[0, 2, 4]), memory_limit=peak - 1, **RUN)
    assert record["failed"] == "oom" and record["memory_limit"] == peak - 1
    with pytest.raises(InputError, match="memory_reserve"):  # 1 GiB by default: nothing would be left
        run_plan(doc(), plan(pp=2, partition=[0, 2, 4]), memory_limit=peak, **RUN)


def test_no_worker_outlives_the_tests():
    # other test modules may leave their own helpers (solvers); count only engine workers
    mine = os.getpid()
    workers = [p for p in Path("/proc").iterdir()
               if p.name.isdigit() and _ppid(p) == mine and b"amp_opt.runtime.worker" in _cmdline(p)]
    assert not workers


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


def _ppid(proc: Path):
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def test_run_task_for_torchrun_is_json_and_checked():
    import json

    from amp_opt.runtime.run import build_run_task

    task = build_run_task(doc(), plan(pp=2, partition=[0, 2, 4]), attention="flash")
    assert json.loads(json.dumps(task)) == task
    assert task["plan"]["stages"] == [[[0]], [[1]]] and task["global_batch"] == 8
    with pytest.raises(InputError, match="attention"):
        build_run_task(doc(), plan(pp=2, partition=[0, 2, 4]), attention="fast")


# ---- recomputation and ZeRO-1: the same training step, the memory the cost model prices

@pytest.fixture(scope="module")
def recomputed():
    return {mode: run_plan(doc(devices=1), plan() | {"recompute": mode}, **RUN) for mode in ("full", "selective")}


@pytest.fixture(scope="module")
def zero1(tmp_path_factory):
    two = tmp_path_factory.mktemp("zero")
    return run_plan(doc(), plan(dp=2, mb=1) | {"zero_stage": 1}, dump_grads=str(two), **RUN), two


def test_recomputation_computes_the_same_step_and_keeps_what_it_says(single, recomputed):
    """Full recomputation keeps each block's input and rebuilds one block at a time during backward;
    selective keeps Q, K, V and frees the attention probabilities (b*a*s^2, fp32) of every block."""
    full, selective = recomputed["full"], recomputed["selective"]
    for record in (full, selective):
        _consistent(record, 4)
        assert record["measured"]["losses"] == pytest.approx(single["measured"]["losses"], rel=1e-6)
    shape = model_shape(MODEL)
    saved = [expected_saved_bytes(shape, i, 2, 4)[0] for i in range(4)]
    hidden, probs = 2 * 32 * 64 * 4, 2 * 4 * 32 * 32 * 4
    assert single["measured"]["stages"][0]["memory"]["activations_peak"] == sum(saved)
    assert selective["measured"]["stages"][0]["memory"]["activations_peak"] == sum(saved) - 2 * probs
    # forward: the embedding's ids and both blocks' inputs (the head's own comes free with the last block's
    # output); backward: the head's released, block 1 rebuilt on top of its input
    assert full["measured"]["stages"][0]["memory"]["activations_peak"] == saved[0] + 2 * hidden + saved[2] - hidden


def test_recompute_per_stage_and_block_method(pipelined):
    """A per-stage list (an engine that allows it) and the block method's first layers recompute;
    the step is the same."""
    deepspeed = dict(doc(), search={"engine": "deepspeed"})
    staged = run_plan(deepspeed, plan(pp=2, partition=[0, 2, 4]) | {"recompute": ["full", "none"]}, **RUN)
    block = run_plan(doc(devices=1), plan() | {"recompute": "full", "recompute_layers": 1}, **RUN)
    assert staged["measured"]["losses"] == pytest.approx(pipelined["measured"]["losses"], rel=1e-6)
    kept = [s["memory"]["activations_peak"] for s in staged["measured"]["stages"]]
    assert kept[0] < pipelined["measured"]["stages"][0]["memory"]["activations_peak"]
    assert kept[1] == pipelined["measured"]["stages"][1]["memory"]["activations_peak"]
    shape = model_shape(MODEL)
    saved = [expected_saved_bytes(shape, i, 2, 4)[0] for i in range(4)]
    hidden = 2 * 32 * 64 * 4
    # block 0 recomputes (keeps its input), block 1 keeps everything: the forward's peak
    assert block["measured"]["stages"][0]["memory"]["activations_peak"] == saved[0] + hidden + saved[2] + saved[3]


def test_zero1_reduces_the_same_gradients_and_shards_the_optimizer(grads_one, zero1):
    (ref, grads), (zero, two) = grads_one, zero1
    _consistent(zero, 4)
    for rank in (0, 1):  # every rank's shard of the reduced gradient, gathered: the single process's
        got = torch.load(two / f"grads.{rank}.pt")
        assert sorted(got) == sorted(grads)
        for name, g in grads.items():
            torch.testing.assert_close(got[name], g, rtol=1e-5, atol=1e-7)
    assert zero["measured"]["losses"] == pytest.approx(ref["measured"]["losses"], rel=1e-5)
    parts, state = zero["measured"]["stages"][0]["memory"], ref["measured"]["stages"][0]["memory"]["parameters"]
    shard = -(-state // 8) * 4  # fp32 elements, padded to a multiple of the 2 replicas
    assert parts["optimizer"] == 2 * shard and parts["parameters"] == 2 * shard
    assert parts["communication_buffers"] == 2 * shard and parts["gradients"] == state


def test_zero1_with_a_pipeline_and_a_tied_embedding(single):
    """Four processes: two stages of two replicas, the tied word gradient summed between the ends
    before the replicas reduce-scatter; the first stage recomputes in full."""
    record = run_plan(dict(doc(devices=4), search={"engine": "deepspeed"}),
                      plan(dp=2, pp=2, mb=1, partition=[0, 2, 4]) | {"zero_stage": 1, "recompute": ["full", "none"]},
                      oversubscribe=True, **RUN)
    _consistent(record, 4)
    assert record["measured"]["losses"] == pytest.approx(single["measured"]["losses"], rel=1e-5)


@pytest.fixture(scope="module")
def sequence_parallel():
    return run_plan(doc(), plan(tp=2) | {"sequence_parallel": True}, **RUN)


def test_sequence_parallel_computes_the_same_model_on_half_the_norms(single, tp2, sequence_parallel):
    _consistent(sequence_parallel, 4)
    assert sequence_parallel["measured"]["losses"] == pytest.approx(single["measured"]["losses"], rel=1e-5)
    # each block's two LayerNorms keep their input (b*s*h) and mean and 1/std (2*b*s) on half the sequence
    hidden, stats = 2 * 32 * 64 * 4, 2 * 2 * 32 * 4
    kept = [r["measured"]["stages"][0]["memory"]["activations_peak"] for r in (tp2, sequence_parallel)]
    assert kept[1] == kept[0] - 2 * (2 * hidden + 2 * stats) // 2
    stage = sequence_parallel["measured"]["stages"][0]
    assert stage["tp_comm"] > 0 and stage["memory"]["parameters"] == tp2["measured"]["stages"][0]["memory"][
        "parameters"]


def test_sequence_parallel_needs_the_sequence_to_split():
    started = []
    with pytest.raises(InputError, match=r"plan\.sequence_parallel: needs every tensor-parallel degree to divide "
                                         r"model\.seq_len \(30\); stage 0 has tp 4"):
        run_plan(doc(devices=4, model=dict(MODEL, seq_len=30)), plan(tp=4) | {"sequence_parallel": True},
                 on_start=started.append, oversubscribe=True)
    assert not started


def test_the_prediction_moves_with_what_runs(single, recomputed, dp2, zero1, tp2, sequence_parallel):
    """Recomputation, ZeRO-1 and sequence parallelism lower the measured and the predicted peak alike
    (the runs use the eager attention kernel, whose s x s probabilities selective recomputation
    frees: the instance says so)."""
    instance = load_instance(doc(devices=4, model=dict(MODEL, attention="eager")))

    def peaks(record):
        evaluation = evaluate(instance, parse_plan(record["plan"]), "hetero")
        return compare_run(record, evaluation, instance).stages[0].memory

    for base, lower in ((single, recomputed["full"]), (single, recomputed["selective"]), (dp2[0], zero1[0]),
                        (tp2, sequence_parallel)):
        assert peaks(lower).measured < peaks(base).measured and peaks(lower).predicted < peaks(base).predicted
