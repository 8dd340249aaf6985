"""The runner on plans whose stages and replicas differ: per-stage tp/dp and uneven batch shares."""

import pytest

torch = pytest.importorskip("torch")

from amp_opt.runtime.layout import RUNNABLE, Layout  # noqa: E402
from amp_opt.runtime.run import run_plan  # noqa: E402
from amp_opt.errors import InputError  # noqa: E402

from test_runtime_run import MODEL, RUN, _refused, doc, plan  # noqa: E402

# stage 0: two replicas at tp 1 taking 3 and 1 samples of each micro-batch of 4;
# stage 1: one replica at tp 2 taking all 4
UNEVEN = {"tp": [1, 2], "dp": [2, 1], "pp": 2, "shares": [[3, 1], [4]], "partition": [0, 2, 4]}


def amp_doc(devices=4, model=MODEL):
    out = doc(devices=devices, model=model)
    out["search"] = {"engine": "amp_opt"}
    return out


def two_cpu_types():
    """Two CPU stand-ins for device types: node host-a (devices 0, 1) and host-b (devices 2, 3)."""
    out = amp_doc()
    out["device_types"] = [{"name": "cpu-a", "memory": "8 GiB", "peak_flops": 1e11},
                           {"name": "cpu-b", "memory": "8 GiB", "peak_flops": 5e10}]
    out["nodes"] = [{"name": f"host-{k}", "device_type": f"cpu-{k}", "devices": 2, "intra_bandwidth": "1 GB/s",
                     "inter_bandwidth": "1 GB/s"} for k in "ab"]
    return out


@pytest.fixture(scope="module")
def grads(tmp_path_factory, single_process):
    """The folders of the single process's gradients and of this module's run's."""
    return single_process[1], tmp_path_factory.mktemp("uneven")


@pytest.fixture(scope="module")
def single(single_process):
    return single_process[0]


@pytest.fixture(scope="module")
def uneven(grads):
    """Stage 0's replicas on cpu-a (1 thread each), stage 1 on cpu-b (2 threads each)."""
    return run_plan(two_cpu_types(), UNEVEN, dump_grads=str(grads[1]), oversubscribe=True,
                    threads={"cpu-a": 1, "cpu-b": 2}, **RUN)


def test_layout_ranks_and_sample_ranges():
    lay = Layout.of(UNEVEN, global_batch=8)
    assert (lay.world, lay.micro, lay.n_micro, lay.uniform) == (4, 4, 2, False)
    assert [lay.place(k) for k in range(4)] == [(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 0, 1)]
    assert all(lay.rank(*lay.place(k)) == k for k in range(4))
    # each replica's samples, and the pieces that cross the boundary, tile the micro-batch
    assert [lay.samples(0, r) for r in range(2)] == [(0, 3), (3, 4)]
    assert lay.overlaps(1, 0, 0) == [(0, 0, 3), (1, 3, 4)] and lay.overlaps(0, 1, 1) == [(0, 3, 4)]
    skew = Layout.of({"tp": 1, "dp": [2, 2], "pp": 2, "shares": [[3, 1], [1, 3]], "partition": [0, 2, 4]},
                     global_batch=8)
    assert skew.overlaps(0, 1, 0) == [(0, 0, 1), (1, 1, 3)] and skew.overlaps(1, 0, 1) == [(0, 1, 3), (1, 3, 4)]
    # a uniform plan is today's Megatron order, replica r on positions [r*b, (r+1)*b)
    flat = Layout.of(plan(tp=2, dp=2, pp=2, mb=1, partition=[0, 2, 4]), global_batch=8)
    assert flat.uniform and flat.rank(1, 1, 0) == 0 + 2 * 1 + 4 * 1 and flat.samples(1, 1) == (1, 2)
    with pytest.raises(InputError, match=r"plan\.shares: the pipeline micro-batch of 3"):
        Layout.of(dict(UNEVEN, shares=[[2, 1], [3]]), global_batch=8)


def test_uneven_plan_runs_the_same_training_step(single, uneven):
    m = uneven["measured"]
    assert "failed" not in uneven and m["micro_batches_per_iteration"] == 2
    assert [(s["tp"], s["dp"], s["shares"]) for s in m["stages"]] == [(1, 2, [3, 1]), (2, 1, [4])]
    assert [(r["stage"], r["dp_rank"], r["tp_rank"], r["share"], r["threads"]) for r in m["ranks"]] == [
        (0, 0, 0, 3, 1), (0, 1, 0, 1, 1), (1, 0, 0, 4, 2), (1, 0, 1, 4, 2)]
    assert m["threads"] == [1, 1, 2, 2]
    assert m["stages"][0]["allreduce"] > 0 and m["stages"][1]["tp_comm"] > 0
    assert all(s["p2p"] > 0 and s["compute"] > 0 for s in m["stages"])
    # the uneven replicas take 3 and 1 samples: the first keeps more activations
    assert m["ranks"][0]["peak_memory"] > m["ranks"][1]["peak_memory"]
    # the same model on the same data: the same loss, also after Adam steps
    assert m["losses"][0] == pytest.approx(single["measured"]["losses"][0], rel=1e-6)
    assert m["losses"] == pytest.approx(single["measured"]["losses"], rel=1e-5)


def test_an_uneven_plan_recomputing_on_one_stage_runs_the_same_training_step(single):
    """A mode per stage (engine amp_opt) on an uneven plan: stage 0's two replicas recompute in
    full and keep less than without it, stage 1 keeps what it keeps without it; the same losses."""
    staged = {"tp": 1, "dp": [2, 1], "pp": 2, "shares": [[3, 1], [4]], "partition": [0, 2, 4]}
    runs = [run_plan(amp_doc(devices=3), staged | {"recompute": mode}, oversubscribe=True, **RUN)
            for mode in (["full", "none"], "none")]
    for record in runs:
        assert "failed" not in record, record.get("error")
        assert record["measured"]["losses"] == pytest.approx(single["measured"]["losses"], rel=1e-5)
    kept = [[s["memory"]["activations_peak"] for s in r["measured"]["stages"]] for r in runs]
    assert kept[0][0] < kept[1][0] and kept[0][1] == kept[1][1]


def test_uneven_replicas_reduce_to_the_single_process_gradients(single, uneven, grads):
    """Both replicas of stage 0 (3 and 1 samples) hold the whole batch's gradient after the dp sum,
    the tied word embedding's included; stage 1's replicated tensors too, and its tp shards stack up
    to the single process's tensors."""
    assert "failed" not in uneven and "failed" not in single
    ref = torch.load(grads[0] / "grads.0.pt")
    for rank in (0, 1):
        got = torch.load(grads[1] / f"grads.{rank}.pt")
        assert sorted(got) == sorted(k for k in ref if k.startswith(("embedding.", "layer_0.")))
        for name, g in got.items():
            torch.testing.assert_close(g, ref[name], rtol=1e-5, atol=1e-7)
    halves = [torch.load(grads[1] / f"grads.{rank}.pt") for rank in (2, 3)]
    assert sorted(halves[0]) == sorted(k for k in ref if k.startswith(("layer_1.", "head.")))
    for name, g in ref.items():
        if name not in halves[0]:
            continue
        a, b = halves[0][name], halves[1][name]
        if a.shape == g.shape:  # replicated: whole on both
            torch.testing.assert_close(a, g, rtol=1e-5, atol=1e-7)
            torch.testing.assert_close(b, g, rtol=1e-5, atol=1e-7)
        else:
            assert a.numel() + b.numel() == g.numel()


def test_uneven_run_measured_next_to_predicted(uneven):
    """The record pairs with the evaluator's prediction of the same plan, term by term (U1: a stage's
    compute is its slowest replica's at its share), and ``run``'s report prints it."""
    from amp_opt.commands.run import format_comparison
    from amp_opt.runtime.compare import compare_run
    from amp_opt.model.evaluate import evaluate
    from amp_opt.model.load import load_instance
    from amp_opt.model.plan import parse_plan

    instance = load_instance(two_cpu_types())
    evaluation = evaluate(instance, parse_plan(uneven["plan"]), "hetero")
    comparison = compare_run(uneven, evaluation, instance)
    assert evaluation.n_micro == 2 and comparison.iteration_time.predicted == evaluation.predicted_time
    assert [s.compute_per_micro_batch.predicted for s in comparison.stages] == [s.compute for s in evaluation.stages]
    ranks = uneven["measured"]["ranks"]
    stage0 = [r["compute_per_micro_batch"] for r in ranks if r["stage"] == 0]
    assert comparison.stages[0].compute_per_micro_batch.measured == pytest.approx(max(stage0))
    assert comparison.stages[0].allreduce.measured > 0 and comparison.stages[0].allreduce.predicted > 0
    text = format_comparison(instance, uneven, evaluation, comparison)
    assert "tp=1,2 dp=2,1 pp=2" in text and "measured/predicted" in text
    assert "ran 4 processes on" in text and "threads by rank 1,1,2,2" in text


def test_every_runnable_setting_passes_the_refusal():
    from amp_opt.model.plan import parse_plan
    from amp_opt.runtime.run import refuse_unsupported

    field = {"zero_stages": "zero_stage"}
    for key, values in RUNNABLE.items():
        for value in values:
            refuse_unsupported(parse_plan(plan() | {field.get(key, key): value}))


def test_what_run_cannot_execute_is_refused_with_the_way_to_a_runnable_plan(monkeypatch):
    _refused(doc(), plan(mb=1, dp=2) | {"zero_stage": 2},
             r"plan\.zero_stage: the runtime does not run ZeRO stage 2 \(it runs 0, 1\); .*profile --runnable")
    _refused(doc(), plan() | {"cp": 2}, r"plan\.cp: .*\"search\" restricted to")
    _refused(doc(), plan(pp=2, partition=[0, 1, 2, 3, 4]) | {"virtual_stages": 2}, r"plan\.virtual_stages")
    # a stage's tensor-parallel degree must divide the model's heads, named per stage
    _refused(amp_doc(devices=6, model=dict(MODEL, heads=2, hidden=64)), dict(UNEVEN, tp=[1, 4], dp=[2, 1]),
             r"plan\.tp\[1\]", oversubscribe=True)
    monkeypatch.setattr("amp_opt.runtime.run.usable_cores", lambda: 2)
    _refused(amp_doc(), UNEVEN, r"the sum over stages of tp_s\*dp_s = 4 processes, this machine has")
    _refused(two_cpu_types(), UNEVEN, r"threads: gives no thread count for device type 'cpu-b'",
             threads={"cpu-a": 1}, oversubscribe=True)


@pytest.mark.slow
@pytest.mark.parametrize("devices, other", [
    # stage 0 at tp 2, stage 1 two replicas of 1 and 3 samples, stage 2 at tp 1: the two ends of the
    # tied embedding at different tp and dp
    (5, {"tp": [2, 1, 1], "dp": [1, 2, 1], "pp": 3, "shares": [[4], [1, 3], [4]], "partition": [0, 1, 2, 4]}),
    # the same dp on both stages, opposite shares: every replica exchanges with both of the other stage
    (4, {"tp": 1, "dp": [2, 2], "pp": 2, "shares": [[3, 1], [1, 3]], "partition": [0, 2, 4]}),
    # ... under ZeRO-1: each stage's replicas reduce-scatter and step their shards
    (4, {"tp": 1, "dp": [2, 2], "pp": 2, "shares": [[3, 1], [1, 3]], "partition": [0, 2, 4], "zero_stage": 1}),
    # sequence parallelism at tp 2 then 4 (the boundary carries the whole sequence), selective recomputation
    (6, {"tp": [2, 4], "dp": 1, "pp": 2, "shares": [[4], [4]], "partition": [0, 2, 4], "sequence_parallel": True,
         "recompute": "selective"}),
])
def test_other_uneven_plans_run_the_same_training_step(single, devices, other):
    record = run_plan(amp_doc(devices=devices), other, oversubscribe=True, **RUN)
    assert "failed" not in record, record.get("error")
    assert record["measured"]["losses"] == pytest.approx(single["measured"]["losses"], rel=1e-5)


@pytest.mark.slow
def test_run_command_runs_an_uneven_plan_and_writes_the_record(tmp_path):
    import json
    import subprocess
    import sys

    (tmp_path / "inst.json").write_text(json.dumps(two_cpu_types()))  # two CPU stand-in types: runnable
    (tmp_path / "plan.json").write_text(json.dumps(UNEVEN))
    done = subprocess.run([sys.executable, "-m", "amp_opt", "run", "inst.json", "plan.json", "--iterations", "2",
                           "--warmup", "1", "--oversubscribe", "-o", "runs.json", "--json"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["comparison"]["iteration_time"]["predicted"] == out["predicted"]["predicted_time"]
    assert [s["shares"] for s in out["record"]["measured"]["stages"]] == [[3, 1], [4]]
    assert json.loads((tmp_path / "runs.json").read_text())[0]["plan"]["shares"] == [[3, 1], [4]]
