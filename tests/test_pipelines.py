"""Plans of several pipelines (docs/hetero-plans.md, formulations/hetero.md U6): the record, its
JSON form and checks, the pricing by the one evaluator, explain/plot/run, and the Hetu export
checked by Hetu's own rules."""

import doctest
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

import amp_opt
from amp_opt import InputError, evaluate, parse_instance, parse_plan
from amp_opt.export.hetu import export_hetu
from amp_opt.model.evaluate import memory_parts
from amp_opt.model.plan import check_plan
from amp_opt.model.plan_pipelines import Pipelines, pipeline_instance
from amp_opt.model.schedule import schedule_of

SCHEMA = json.loads((Path(amp_opt.__file__).parent / "schema" / "plan.schema.json").read_text())
MODEL = {"preset": "gpt", "hidden": 64, "layers": 4, "heads": 4, "seq_len": 32, "vocab": 128}


def cluster(**kwargs):
    return parse_instance(instance_doc(**kwargs))


def instance_doc(*, tied=False, a=4, v=4, batch=16, engine="amp_opt", latency=0.0, same=False, overlap=False):
    """Node "a" of A100s (devices 0..a-1) and node "v" of V100s (or A100s too, ``same``)."""
    second = "A100" if same else "V100"
    return {
        "format": "amp_opt.instance", "version": 1, "name": "two-nodes",
        "model": dict(MODEL, tied_embeddings=tied),
        "device_types": [{"name": "A100", "memory": "40 GiB", "peak_flops": 3.12e14, "memory_bandwidth": "1.5 TB/s"},
                         {"name": "V100", "memory": "16 GiB", "peak_flops": 1.25e14, "memory_bandwidth": "0.9 TB/s"}],
        "nodes": [{"name": "a", "device_type": "A100", "devices": a, "intra_bandwidth": "300 GB/s",
                   "inter_bandwidth": "25 GB/s", "inter_latency": latency},
                  {"name": "v", "device_type": second, "devices": v, "intra_bandwidth": "150 GB/s",
                   "inter_bandwidth": "12.5 GB/s", "inter_latency": 2 * latency}],
        "training": {"global_batch": batch, "overlap_grad_reduce": overlap}, "search": {"engine": engine}}


# pipeline 0: an A100 at tp 1, then two A100s at tp 2 (5 micro-batches of 2); pipeline 1: V100 pairs at tp 2 (3 of 2)
TWO = {"pipelines": [
    {"tp": [1, 2], "dp": 1, "pp": 2, "micro_batch": 2, "partition": [0, 2, 6], "micro_batches": 5,
     "stages": [[[0]], [[1, 2]]]},
    {"tp": 2, "dp": 1, "pp": 2, "micro_batch": 2, "partition": [0, 3, 6], "micro_batches": 3,
     "stages": [[[4, 5]], [[6, 7]]]}]}


def with_pipeline(doc, i, **fields):
    out = json.loads(json.dumps(doc))
    out["pipelines"][i].update(fields)
    return out


# -- the record and its checks --------------------------------------------------------------------
def test_the_record_its_json_round_trip_and_the_schema():
    plan = parse_plan(TWO)
    assert isinstance(plan, Pipelines) and plan.micro_batches == (5, 3)
    assert [plan.samples(i) for i in range(2)] == [10, 6] and plan.devices == 7
    checked = check_plan(cluster(), plan)
    assert parse_plan(checked.to_json()) == checked
    jsonschema.validate(checked.to_json(), SCHEMA)
    one = {k: v for k, v in TWO["pipelines"][0].items() if k != "micro_batches"}
    jsonschema.validate([TWO, one], SCHEMA)  # evaluate's list of plans may mix both forms
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"pipelines": TWO["pipelines"][:1]}, SCHEMA)


@pytest.mark.parametrize("doc, field, words", [
    ({"pipelines": TWO["pipelines"][:1]}, "plan.pipelines", "at least two"),
    ({"pipelines": TWO["pipelines"], "tp": 1}, "plan.tp", "one field"),
    (with_pipeline(TWO, 1, micro_batches=None), "plan.pipelines[1].micro_batches", "is required"),
    (with_pipeline(TWO, 0, micro_batches=0), "plan.pipelines[0].micro_batches", "positive integer"),
    (with_pipeline(TWO, 1, pipelines=[]), "plan.pipelines[1].pipelines", "do not nest"),
    (with_pipeline(TWO, 0, tp=[1]), "plan.pipelines[0].tp", "pp is 2"),
])
def test_bad_shapes_are_named(doc, field, words):
    with pytest.raises(InputError, match=rf"^{re.escape(field)}: .*{words}"):
        parse_plan(doc)


@pytest.mark.parametrize("doc, kwargs, field, words", [
    (with_pipeline(TWO, 1, micro_batches=4), {}, "plan.pipelines", r"5\*2 \+ 4\*2 = 18 samples .* global batch is 16"),
    (with_pipeline(TWO, 1, stages=[[[2, 5]], [[6, 7]]]), {}, r"plan.pipelines\[1\].stages\[0\]", "used by pipeline 0"),
    (TWO, {"engine": "megatron"}, "plan.pipelines", "megatron runs one pipeline configuration"),
    (with_pipeline(TWO, 0, zero_stage=1), {}, r"plan.pipelines\[0\].zero_stage", "zero_stage 0"),
    (with_pipeline(TWO, 1, stages=[[[4, 5]], [[6, 8]]]), {}, r"plan.pipelines\[1\].stages\[1\]\[0\]",
     "device 8 does not exist"),
])
def test_checks_against_the_instance_are_named(doc, kwargs, field, words):
    with pytest.raises(InputError, match=rf"^{field}: .*{words}"):
        check_plan(cluster(**kwargs), parse_plan(doc))


def test_pipelines_without_stages_take_the_next_devices_in_order():
    doc = {"pipelines": [{k: v for k, v in p.items() if k != "stages"} for p in TWO["pipelines"]]}
    checked = check_plan(cluster(), parse_plan(doc))
    assert checked.pipelines[0].stages == (((0,),), ((1, 2),))
    assert checked.pipelines[1].stages == (((3, 4),), ((5, 6),))


# -- pricing (U6) ---------------------------------------------------------------------------------
@pytest.mark.parametrize("tied, latency, tp, overlap", [(False, 0.0, 1, False), (True, 1e-5, 1, False),
                                                       (False, 1e-5, 2, False), (False, 1e-5, 1, True),
                                                       (True, 0.0, 2, True)])
def test_identical_pipelines_price_as_one_pipeline_of_their_replicas(tied, latency, tp, overlap):
    """Two pipelines that are the replicas of one plan (the same partition, devices and degrees)
    price as that plan: U6 is H4 over the same ring (and H18 where the engine overlaps it), and
    each pipeline H13 on its half of the batch."""
    inst = cluster(tied=tied, latency=latency, same=True, overlap=overlap)
    one = evaluate(inst, parse_plan({"tp": tp, "dp": 2, "pp": 2, "micro_batch": 2, "partition": [0, 3, 6]}))
    stages = one.plan.stages
    two = evaluate(inst, parse_plan({"pipelines": [
        {"tp": tp, "dp": 1, "pp": 2, "micro_batch": 2, "partition": [0, 3, 6], "micro_batches": 4,
         "stages": [[stages[0][r]], [stages[1][r]]]} for r in range(2)]}))
    assert two.predicted_time == pytest.approx(one.predicted_time, rel=1e-12)
    assert [r.allreduce for r in two.stages] == pytest.approx([r.allreduce for r in one.stages] * 2, rel=1e-12)
    assert [r.memory for r in two.stages] == [r.memory for r in one.stages] * 2
    assert two.breakdown == pytest.approx(one.breakdown, rel=1e-12) and two.n_micro == (4, 4)
    if overlap:  # the backward pass hides part of the reduction here, in both forms alike
        plain = evaluate(cluster(tied=tied, latency=latency, same=True), two.plan)
        assert two.predicted_time < plain.predicted_time


def test_the_end_of_each_stage_by_hand():
    """U6 from the instance's own numbers: the segments [0,2), [2,3), [3,6) of partitions [0,2,6] and
    [0,3,6]; each ring over both pipelines' replicas (R = 2), at the least tp's shard and the slowest
    inter-node link shared by the largest tp's rings; the stage's end is the sum of its segments'
    rings and its optimizer step."""
    inst = cluster(latency=1e-5)
    ev = evaluate(inst, parse_plan(TWO))
    per_param = inst.training.allreduce_bytes_per_param

    def ring(a, b, tps):
        params = sum(inst.layers[i].params.at(min(tps)) for i in range(a, b))
        return 2 * (2 - 1) / 2 * params * per_param / 12.5e9 + 2 * (2 - 1) * 2e-5  # V100 node: the slower NIC

    seg = {(0, 2): ring(0, 2, [1, 2]), (2, 3): ring(2, 3, [2, 2]), (3, 6): ring(3, 6, [2, 2])}
    want = [seg[0, 2], seg[2, 3] + seg[3, 6], seg[0, 2] + seg[2, 3], seg[3, 6]]
    got = [r.allreduce - r.optimizer_step for r in ev.stages]
    assert got == pytest.approx(want, rel=1e-12)
    assert all(r.optimizer_step > 0 for r in ev.stages)


def test_the_overlapped_end_by_hand():
    """With the engine overlapping the reduction (H18), a segment's ring starts once every holder
    is at most its stage's window before its own pipeline's end; a stage's end is its rings from
    the latest of their starts, no earlier than its pipeline's end, then its step."""
    from amp_opt.model.costs.pipelines import segment_reduction
    from amp_opt.model.evaluate import stage_costs
    from amp_opt.model.tables import Tables

    inst, plain = cluster(latency=1e-5, overlap=True), cluster(latency=1e-5)
    plan = check_plan(inst, parse_plan(TWO))
    ev = evaluate(inst, plan)
    bodies, windows = [], []
    for i, p in enumerate(plan.pipelines):
        sub = pipeline_instance(inst, plan, i)
        alone = evaluate(sub, p)
        bodies.append(alone.predicted_time - alone.breakdown["allreduce"])
        costs = stage_costs(sub, p, "hetero")
        windows.append([float(costs.overlap_window(s, p.partition[s], p.partition[s + 1])) for s in range(p.pp)])
    holders = {(0, 2): [(0, 0), (1, 0)], (2, 3): [(0, 1), (1, 0)], (3, 6): [(0, 1), (1, 1)]}
    mine = {(i, s): [seg for seg, hs in holders.items() if (i, s) in hs] for i in range(2) for s in range(2)}
    steps = {(r.pipeline, r.index): r.optimizer_step for r in ev.stages}
    tables = Tables(inst)
    want = 0.0
    for (i, s), segs in mine.items():
        start = max(bodies[h] - windows[h][t] for seg in segs for h, t in holders[seg])
        rings = sum(segment_reduction(inst, tables, plan, a, b, holders[a, b]) for a, b in segs)
        want = max(want, max(bodies[i], start + rings) + steps[i, s])
    assert ev.predicted_time == pytest.approx(want, rel=1e-12)
    assert ev.predicted_time < evaluate(plain, plan).predicted_time


def test_the_iteration_is_the_slowest_pipeline_then_the_slowest_end():
    inst = cluster()
    plan = check_plan(inst, parse_plan(TWO))
    ev = evaluate(inst, plan)
    bodies = []
    for i, p in enumerate(plan.pipelines):
        alone = evaluate(pipeline_instance(inst, plan, i), p)  # the pipeline on its own samples
        bodies.append(alone.predicted_time - alone.breakdown["allreduce"])
        # its compute, boundaries and memory are its own (U1, U2, U4): only its end changes
        mine = [r for r in ev.stages if r.pipeline == i]
        assert [(r.compute, r.p2p, r.memory) for r in mine] == [(r.compute, r.p2p, r.memory) for r in alone.stages]
        assert ev.pipelines[i].n_micro == plan.micro_batches[i]
    assert ev.predicted_time == pytest.approx(max(bodies) + max(r.allreduce for r in ev.stages), rel=1e-12)
    # the plot's schedule: every stage's end starts once the slowest pipeline's passes are done
    sched = schedule_of(inst, ev)
    ends = [op for op in sched.ops if op.kind == "allreduce"]
    passes = max(op.end for op in sched.ops if op.kind != "allreduce")
    assert [op.start for op in ends] == [passes] * 4
    assert [op.end - op.start for op in ends] == pytest.approx([r.allreduce for r in ev.stages])
    assert sched.makespan == pytest.approx(passes + max(r.allreduce for r in ev.stages))


def test_memory_parts_and_a_pipeline_that_does_not_fit():
    inst = cluster()
    ev = evaluate(inst, parse_plan(TWO))
    parts = memory_parts(inst, ev)
    assert len(parts) == 4 and all(p.total == pytest.approx(r.memory) for p, r in zip(parts, ev.stages))
    small = instance_doc()
    small["device_types"][1]["memory"] = "0.9 GiB"
    ev = evaluate(parse_instance(small), parse_plan(TWO))
    assert not ev.feasible and all(v.startswith("pipeline 1 stage") for v in ev.violations)


def test_the_amp_model_prices_one_pipeline_only():
    with pytest.raises(InputError, match="plan.pipelines: the amp cost model prices one pipeline"):
        evaluate(cluster(), parse_plan(TWO), "amp")


# -- commands -------------------------------------------------------------------------------------
def run_cli(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "amp_opt", *args], cwd=tmp_path, capture_output=True, text=True)


def write(tmp_path, inst_doc=None, plan=TWO):
    (tmp_path / "inst.json").write_text(json.dumps(inst_doc or instance_doc()))
    (tmp_path / "plan.json").write_text(json.dumps(plan))


def test_evaluate_explain_and_plot_show_every_pipeline(tmp_path):
    write(tmp_path)
    done = run_cli(tmp_path, "evaluate", "inst.json", "plan.json", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert [s["pipeline"] for s in out["stages"]] == [0, 0, 1, 1] and out["micro_batches_per_iteration"] == [5, 3]
    assert [p["samples"] for p in out["pipelines"]] == [10, 6]
    text = run_cli(tmp_path, "evaluate", "inst.json", "plan.json").stdout
    assert "pipeline.stage" in text and "5+3 micro-batches" in text
    done = run_cli(tmp_path, "explain", "inst.json", "plan.json")
    assert done.returncode == 0, done.stderr
    assert "partitions [0, 2, 6] and [0, 3, 6]" in done.stdout and "; pipeline 1; tp 2, dp 1" in done.stdout
    pytest.importorskip("matplotlib")
    done = run_cli(tmp_path, "plot", "inst.json", "plan.json", "-o", "p.png")
    assert done.returncode == 0 and (tmp_path / "p.png").stat().st_size > 0, done.stderr


@pytest.mark.parametrize("args", [("export", "inst.json", "plan.json", "--format", "megatron"),
                                  ("export", "inst.json", "plan.json", "--format", "flagscale")])
def test_what_takes_one_pipeline_says_so_in_one_line(tmp_path, args):
    write(tmp_path)
    done = run_cli(tmp_path, *args)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("amp-opt: error: plan.pipelines: ") and "--format hetu" in done.stderr


# -- the Hetu export ------------------------------------------------------------------------------
def hetu_accepts(instance, plan, out):
    """Hetu's own rules on the exported strategy (PKU-DAIR/Hetu at 9e47240: the generator's asserts in
    python/hetu/models/llama/generate_llama_hetero_4d_config.py, StrategyConfig.__post_init__ in
    python/hetu/utils/parallel/ds_config.py, Trainer.extract_strategy and prepare_feed_dict in
    python/hetu/engine/trainer.py, DeducePipeline in hetu/graph/define_and_run_graph.cc), then that
    its rank arithmetic puts each stage's layers on the plan's devices."""
    ds, trainer = out["config"]["ds_parallel"], out["config"]["trainer"]
    plan = check_plan(instance, plan)
    layers = ds["hetero_layers"]
    # generator and StrategyConfig
    assert ds["hetero"] is True and ds["rank_to_device_mapping"] is not None and layers is not None
    assert len(ds["cp_list"]) == ds["dp"] and len(layers) == sum(ds["cp_list"])
    assert all(sum(p) == ds["num_layers"] for p in layers) and ds["gpus_per_stage"] == ds["tp"]
    # extract_strategy: every launched device is the image of exactly one virtual rank
    tp, mapping = ds["tp"], ds["rank_to_device_mapping"]
    slots = sum(len(p) for p in layers) * tp
    assert sorted(mapping) == list(range(slots)) and sorted(mapping.values()) == list(range(ds["num_gpus"]))
    assert ds["num_gpus"] == slots == out["launch"]["world_size"]
    # prepare_feed_dict: one count per data-parallel group; the batch split as the plan splits it
    mbs, counts = trainer["micro_batch_size"], ds["micro_batch_num_list"]
    assert len(counts) == ds["dp"] and mbs * sum(counts) == trainer["global_load_size"] == instance.training.global_batch
    # the generator's rank arithmetic: pipeline p, stage s owns ranks (acc[p] + s) * tp + j
    launch = [r["device"] for r in out["launch"]["ranks"]]
    pipes = plan.pipelines if isinstance(plan, Pipelines) else None
    seen, acc = {}, 0
    for p, stage_counts in enumerate(layers):
        for s, count in enumerate(stage_counts):
            ranks = range((acc + s) * tp, (acc + s + 1) * tp)
            group = [launch[mapping[r]] for r in ranks if r not in ds["unused_rank"]]
            assert group, "every stage keeps a used rank"
            for d in group:  # DeducePipeline: a device is in one pipeline
                assert seen.setdefault(d, p) == p
            if pipes is not None:
                own = pipes[p]
                assert group == list(own.stages[s][0]) and counts[p] == plan.micro_batches[p]
                kinds = [instance.layers[k].kind for k in own.stage_layers(s)]
            else:
                assert group == list(plan.stages[s][p])
                kinds = [instance.layers[k].kind for k in plan.stage_layers(s)]
            assert count == kinds.count("transformer")
        acc += len(stage_counts)
    # the recompute block: per pipeline, the global transformer ids of the stages that recompute in full
    listed = ds["recompute"]["recompute_layer_idxs_list"]
    for p, stage_counts in enumerate(layers):
        own = pipes[p] if pipes is not None else plan
        starts = [sum(stage_counts[:s]) for s in range(len(stage_counts))]
        want = [k for s, count in enumerate(stage_counts) if own.recompute_of(s) == "full"
                for k in range(starts[s], starts[s] + count)]
        assert (listed[p] if listed is not None else []) == want
    assert listed is None or ds["recompute"]["recompute_granularity"] == "full"
    used = {d for d in seen}
    idle = {launch[mapping[r]] for r in ds["unused_rank"]}
    assert not used & idle and all(r["idle"] == (r["device"] in idle) for r in out["launch"]["ranks"])


def test_two_pipelines_export_to_hetu():
    inst = cluster()
    out = export_hetu(inst, parse_plan(TWO))
    hetu_accepts(inst, parse_plan(TWO), out)
    assert out["config"]["ds_parallel"]["hetero_layers"] == [[1, 3], [2, 2]]
    assert out["config"]["ds_parallel"]["unused_rank"] == [1]  # pipeline 0's stage 0 runs tp 1 of 2
    assert "rank_to_device_mapping:\n    0: 0\n" in out["yaml"]
    assert out["config"]["ds_parallel"]["recompute"]["recompute_layer_idxs_list"] is None


def test_recomputing_stages_list_their_layers_for_hetu():
    inst = cluster()
    plan = parse_plan(with_pipeline(with_pipeline(TWO, 0, recompute=["none", "full"]), 1, recompute="full"))
    out = export_hetu(inst, plan)
    hetu_accepts(inst, plan, out)
    assert out["config"]["ds_parallel"]["recompute"]["recompute_layer_idxs_list"] == [[1, 2, 3], [0, 1, 2, 3]]


@pytest.mark.parametrize("plan", [
    {"tp": 2, "dp": 2, "pp": 2, "micro_batch": 2, "partition": [0, 3, 6]},
    {"tp": [1, 2], "dp": 2, "pp": 2, "micro_batch": 1, "partition": [0, 2, 6]},
])
def test_a_plan_of_one_pipeline_exports_one_hetu_pipeline_per_replica(plan):
    inst = cluster()
    out = export_hetu(inst, parse_plan(plan))
    hetu_accepts(inst, parse_plan(plan), out)
    assert out["config"]["ds_parallel"]["dp"] == 2


@pytest.mark.parametrize("plan, field, words", [
    (with_pipeline(TWO, 1, dp=2, micro_batch=1, stages=[[[4], [5]], [[6], [7]]], tp=1),
     r"plan.pipelines\[1\].dp", "pipeline of its own"),
    (with_pipeline(with_pipeline(TWO, 1, micro_batch=1, micro_batches=6), 0, micro_batches=5), "plan.pipelines",
     "one micro-batch size"),
    ({"tp": 1, "dp": 2, "pp": 1, "shares": [[3, 1]], "partition": [0, 6]}, "plan.shares", "equal shares"),
    (with_pipeline(TWO, 0, recompute="selective"), r"plan.pipelines\[0\].recompute", "none or full per stage"),
    ({"pipelines": [{"tp": 1, "dp": 1, "pp": 2, "micro_batch": 2, "partition": [0, 1, 6], "micro_batches": 4},
                    {"tp": 1, "dp": 1, "pp": 1, "micro_batch": 2, "partition": [0, 6], "micro_batches": 4}]},
     r"plan.pipelines\[0\].partition", "holds no transformer layer"),
    ({"tp": [1, 4], "dp": 1, "pp": 2, "micro_batch": 2, "partition": [0, 3, 6]}, None, None),
])
def test_what_hetu_cannot_express_is_refused_in_one_line(plan, field, words):
    inst = cluster(a=4, v=4)
    if field is None:  # fits: 2 stages x 4 virtual ranks on 8 devices
        hetu_accepts(inst, parse_plan(plan), export_hetu(inst, parse_plan(plan)))
        small = cluster(a=4, v=2)
        with pytest.raises(InputError, match=r"plan.tp: .*8 devices, the cluster has 6"):
            export_hetu(small, parse_plan({**plan, "stages": [[[4]], [[0, 1, 2, 3]]]}))
        return
    with pytest.raises(InputError, match=rf"^{field}: .*{words}"):
        export_hetu(inst, parse_plan(plan))


def test_cli_writes_the_hetu_export(tmp_path):
    write(tmp_path)
    done = run_cli(tmp_path, "export", "inst.json", "plan.json", "--format", "hetu", "-o", "h.json")
    assert done.returncode == 0, done.stderr
    out = json.loads((tmp_path / "h.json").read_text())
    assert out["format"] == "amp_opt.export.hetu" and out["evaluation"]["predicted_time"] > 0
    out["config"]["ds_parallel"]["rank_to_device_mapping"] = {
        int(k): v for k, v in out["config"]["ds_parallel"]["rank_to_device_mapping"].items()}
    hetu_accepts(cluster(), parse_plan(TWO), out)


def test_the_docs_examples_are_what_the_commands_print():
    """docs/hetero-plans.md's plan and numbers (evaluate, solve) and docs/hetero-run.md's Hetu export."""
    root = Path(__file__).resolve().parent.parent
    folder, plans_doc = root / "docs" / "hetero", (root / "docs" / "hetero-plans.md").read_text()
    blocks = [json.loads(b) for b in re.findall(r"```json\n(.*?)```", plans_doc, re.S)]
    assert json.loads((folder / "pipelines.json").read_text()) in blocks
    gpt = amp_opt.load_instance(str(folder / "gpt_two_types.json"))
    ev = evaluate(gpt, parse_plan(json.loads((folder / "pipelines.json").read_text())))
    best = amp_opt.solve(gpt).best
    words = " ".join(plans_doc.split())
    assert f"predicts {ev.predicted_time:.4f} s per iteration" in words
    assert f"finds {best.predicted_time:.4f} s with one pipeline" in words and best.plan.pp == 2
    assert f"{ev.predicted_time / best.predicted_time - 1:.1%} slower" in words
    ms = [f"{r.compute * 1e3:.2f}" for r in ev.stages]
    assert f"{ms[0]} and {ms[1]} ms against the V100 pipeline's {ms[2]} and {ms[3]} ms" in words
    run_doc = (root / "docs" / "hetero-run.md").read_text()
    inst = amp_opt.load_instance(str(folder / "two_types.json"))
    plan = parse_plan(json.loads((folder / "two_pipelines.json").read_text()))
    out = export_hetu(inst, plan)
    hetu_accepts(inst, plan, out)
    assert out["yaml"] in re.findall(r"```yaml\n(.*?)```", run_doc, re.S)
    assert json.loads((folder / "two_pipelines.json").read_text()) in [
        json.loads(b) for b in re.findall(r"```json\n(.*?)```", run_doc, re.S)]


@pytest.mark.parametrize("name", ["amp_opt.model.costs.pipelines", "amp_opt.model.plan"])
def test_docstring_examples_of_the_new_modules(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0


def test_calibrate_fits_runs_of_several_pipelines():
    """Measured runs of plans of several pipelines calibrate like any other (here: times made by a
    V100 30% slower than the model says, recovered as its compute_scale)."""
    from amp_opt.calibrate.fit import apply_calibration, fit_calibration
    from amp_opt.calibrate.runs import bind_runs, parse_runs

    inst = cluster()
    plans = [with_pipeline(TWO, 1, micro_batches=m, micro_batch=b) for m, b in ((3, 2), (1, 6), (6, 1))]
    slow = apply_calibration(inst, {"device_types": {"V100": {"compute_scale": 1.3}}})
    times = [evaluate(slow, parse_plan(p)).predicted_time for p in plans]
    runs = bind_runs(parse_runs([{"plan": p, "iteration_time": t} for p, t in zip(plans, times)]), inst)
    assert runs.device_types(runs.records[0]) == ("A100", "V100")
    cal = fit_calibration(runs, cv=False, max_parameters=1)
    assert {k: round(v, 2) for k, v in cal.time.values.items()} == {"compute_scale[V100]": 1.3}


def test_a_plug_in_s_plan_of_several_pipelines_is_scored_and_listed():
    """result_from_plans re-scores a plug-in's plans with the evaluator, several pipelines included,
    and the solve report's table of best plans lists them (each pipeline's partition)."""
    import io

    from amp_opt.commands.report import Report, top_table
    from amp_opt.search.options import solve_options
    from amp_opt.search.registry import result_from_plans

    inst = cluster()
    one = {"tp": 1, "dp": 2, "pp": 2, "micro_batch": 2, "partition": [0, 3, 6]}
    result = result_from_plans(inst, [parse_plan(TWO), parse_plan(one)], solve_options(top_k=2), name="mine")
    assert {type(ev.plan).__name__ for ev in result.top} == {"Pipelines", "Plan"}
    buffer = io.StringIO()
    Report(file=buffer).print(top_table(result))
    assert "[0, 2, 6] and [0, 3, 6]" in buffer.getvalue() and "[0, 3, 6]" in buffer.getvalue()


def test_explain_offers_each_overflowing_pipeline_its_own_changes():
    """A plan of several pipelines that does not fit: the changes are those of the pipeline whose
    stages overflow, on its own devices and samples, each scored as the whole plan."""
    from amp_opt.search.alternatives import explain_plan

    doc = json.loads((Path(__file__).resolve().parent.parent / "docs/hetero/gpt_two_types.json").read_text())
    doc["device_types"][1]["memory"] = "10 GiB"  # the V100s: too small for pipeline 1 as written
    inst = parse_instance(doc)
    plan = {"pipelines": [
        {"tp": 4, "dp": 1, "pp": 2, "micro_batch": 4, "partition": [0, 14, 26], "micro_batches": 11,
         "stages": [[[0, 1, 2, 3]], [[4, 5, 6, 7]]]},
        {"tp": 1, "dp": 1, "pp": 8, "micro_batch": 4, "partition": [0, 4, 7, 10, 13, 16, 19, 22, 26],
         "micro_batches": 5, "stages": [[[d]] for d in range(8, 16)]}]}
    out = explain_plan(inst, parse_plan(plan))
    assert not out["fits"] and {o["pipeline"] for o in out["overflows"]} == {1}
    assert all(out["stages"][o["position"]]["pipeline"] == 1 for o in out["overflows"])
    changes = [a["change"] for a in out["alternatives"]]
    assert changes and all(c.startswith("pipeline 1: ") for c in changes)
    fitting = [a for a in out["alternatives"] if a["fits"]]
    assert any("recompute full" in a["change"] for a in fitting)
    for a in fitting:  # pipeline 0 as written, pipeline 1 on its samples (5 x 4 = 20)
        changed = parse_plan(a["plan"])
        assert changed.pipelines[0] == check_plan(inst, parse_plan(plan)).pipelines[0]
        assert changed.samples(1) == 20
        assert evaluate(inst, changed).predicted_time == pytest.approx(a["predicted_time"])


@pytest.mark.parametrize("overlap", [False, True])
def test_the_order_of_the_pipelines_does_not_change_the_price(overlap):
    """Pipelines are a set: listed in the other order (devices given), every term is the same."""
    inst = cluster(latency=1e-5, overlap=overlap)
    ev = evaluate(inst, parse_plan(TWO))
    swapped = evaluate(inst, parse_plan({"pipelines": TWO["pipelines"][::-1]}))
    assert swapped.predicted_time == pytest.approx(ev.predicted_time, rel=1e-12)
    def terms(e):
        return sorted((r.layers, r.device_types, r.compute, r.allreduce, r.memory) for r in e.stages)

    for a, b in zip(terms(swapped), terms(ev)):
        assert a[:2] == b[:2] and a[2:] == pytest.approx(b[2:], rel=1e-12)
