"""The runner on plans of several pipelines (U6): each pipeline on its own samples, the gradients
of each layer summed over every pipeline holding it; the same training step as one process."""

import pytest

torch = pytest.importorskip("torch")

from amp_opt.errors import InputError  # noqa: E402
from amp_opt.runtime.layout import pipelines_of  # noqa: E402
from amp_opt.runtime.run import run_plan  # noqa: E402

from test_runtime_run import MODEL, RUN  # noqa: E402
from test_runtime_uneven import amp_doc  # noqa: E402

# pipeline 0: two stages (the embedding alone, then the rest), 3 micro-batches of 1; pipeline 1: one
# stage, 5 micro-batches of 1 (the tied word table: a two-stage pipeline's ends and a one-stage one)
TWO = {"pipelines": [
    {"tp": 1, "dp": 1, "pp": 2, "micro_batch": 1, "partition": [0, 1, 4], "micro_batches": 3},
    {"tp": 1, "dp": 1, "pp": 1, "micro_batch": 1, "partition": [0, 4], "micro_batches": 5}]}


@pytest.fixture(scope="module")
def grads(tmp_path_factory, single_process):
    """The folders of the single process's gradients and of this module's run's."""
    return single_process[1], tmp_path_factory.mktemp("pipelines")


@pytest.fixture(scope="module")
def single(single_process):
    return single_process[0]


@pytest.fixture(scope="module")
def several(grads):
    return run_plan(amp_doc(devices=3), TWO, dump_grads=str(grads[1]), oversubscribe=True, **RUN)


def test_pipelines_are_laid_out_one_after_another():
    pipes = pipelines_of(TWO, global_batch=8)
    assert [(p.base, p.start, p.lay.world, p.lay.n_micro) for p in pipes] == [(0, 0, 2, 3), (2, 3, 1, 5)]


def test_several_pipelines_run_the_same_training_step(single, several):
    assert "failed" not in several, several.get("error")
    m = several["measured"]
    assert m["micro_batches_per_iteration"] == [3, 5]
    assert [(s["pipeline"], s["stage"], s["layers"]) for s in m["stages"]] == [(0, 0, [0, 1]), (0, 1, [1, 4]),
                                                                                (1, 0, [0, 4])]
    assert all(s["allreduce"] > 0 for s in m["stages"])
    # the same model on the same data: the same loss, also after Adam steps
    assert m["losses"] == pytest.approx(single["measured"]["losses"], rel=1e-5)


def test_every_pipeline_holds_the_whole_batch_s_gradients(single, several, grads):
    """After the reduction across the pipelines every rank holds, for each of its layers, the single
    process's gradient (the tied word table's included)."""
    assert "failed" not in several and "failed" not in single
    ref = torch.load(grads[0] / "grads.0.pt")
    seen = set()
    for rank in range(3):
        got = torch.load(grads[1] / f"grads.{rank}.pt")
        for name, g in got.items():
            torch.testing.assert_close(g, ref[name], rtol=1e-5, atol=1e-7)
            seen.add(name)
    assert seen == set(ref)


def test_the_run_is_measured_next_to_its_prediction(several):
    from amp_opt.commands.run import format_comparison
    from amp_opt.model.evaluate import evaluate
    from amp_opt.model.load import load_instance
    from amp_opt.model.plan import parse_plan
    from amp_opt.runtime.compare import compare_run

    instance = load_instance(amp_doc(devices=3))
    evaluation = evaluate(instance, parse_plan(several["plan"]), "hetero")
    comparison = compare_run(several, evaluation, instance)
    assert [s.pipeline for s in comparison.stages] == [0, 0, 1]
    assert comparison.iteration_time.predicted == evaluation.predicted_time
    text = format_comparison(instance, several, evaluation, comparison)
    assert "3+5 micro-batches" in text and "  1.0 " in text and "(the slowest pipeline)" in text


def test_pipelines_holding_a_layer_at_tp_that_do_not_divide_are_refused():
    mixed = {"pipelines": [dict(TWO["pipelines"][0], tp=2), dict(TWO["pipelines"][1], tp=3)]}
    with pytest.raises(InputError, match=r"plan.pipelines: the runtime reduces each layer .* tp 2, 3"):
        run_plan(amp_doc(devices=7, model=dict(MODEL, heads=6, hidden=96, ffn=384)), mixed, oversubscribe=True, **RUN)


@pytest.mark.parametrize("sp", [False, True])
def test_pipelines_holding_a_layer_at_different_tp_run_the_same_training_step(single, sp):
    """Per-replica tp: a two-stage pipeline at tp 1 and a one-stage one at tp 2 (sequence parallel
    or not); each layer's gradients are summed piece by piece of the tp-2 sharding, the tp-1
    replica's shard cut in two, and every rank ends with the whole batch's gradient."""
    mixed = {"pipelines": [dict(TWO["pipelines"][0]),
                           dict(TWO["pipelines"][1], tp=2, sequence_parallel=sp)]}
    record = run_plan(amp_doc(devices=4), mixed, oversubscribe=True, **RUN)
    assert "failed" not in record, record.get("error")
    assert record["measured"]["losses"] == pytest.approx(single["measured"]["losses"], rel=1e-5)


def test_pipelines_of_tp_2_with_sequence_parallelism_run_the_same_training_step(single):
    """A one-stage pipeline and a two-stage one, both at tp 2, the second sequence parallel: the
    segments [0, 3) and [3, 4) are each summed over the tensor-parallel ranks alike."""
    tp2 = {"pipelines": [
        {"tp": 2, "dp": 1, "pp": 1, "micro_batch": 2, "partition": [0, 4], "micro_batches": 1},
        {"tp": 2, "dp": 1, "pp": 2, "micro_batch": 2, "partition": [0, 3, 4], "micro_batches": 3,
         "sequence_parallel": True}]}
    record = run_plan(amp_doc(devices=6), tp2, oversubscribe=True, **RUN)
    assert "failed" not in record, record.get("error")
    assert record["measured"]["losses"] == pytest.approx(single["measured"]["losses"], rel=1e-5)
