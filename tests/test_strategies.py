"""Today's strategy space (formulations/hetero.md H7-H12): each term against a hand computation,
engine rules, old plans, idle GPUs, cost and budgets, and every solver equal to the enumerator
with all decisions open."""

import dataclasses
import json
import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from amp_opt import InfeasibleError, evaluate, parse_instance, parse_plan, solve
from amp_opt.model.profiles import layer_times

GB = 1e9
GIB = 2**30
DATA = __import__("pathlib").Path(__file__).resolve().parent / "data"


def preset_doc(*, attention="eager", nodes=(("A100-80GB", 1, 4),), layers=4, global_batch=8, search=None, **training):
    """A tiny GPT (hidden 64, 4 heads, seq 128) on nodes of catalog GPUs: (gpu, count, devices)."""
    return {
        "version": 1,
        "name": "tiny-gpt",
        "model": {"preset": "gpt", "hidden": 64, "layers": layers, "heads": 4, "vocab": 256, "seq_len": 128,
                  "attention": attention},
        "nodes": [{"name": f"n{i}", "device_type": gpu, "count": count, "devices": devices,
                   "intra_bandwidth": "100 GB/s", "inter_bandwidth": "100 Gbit/s"}
                  for i, (gpu, count, devices) in enumerate(nodes)],
        "training": {"global_batch": global_batch, **training},
        "search": search or {},
    }


def plan(tp=1, dp=1, pp=1, micro_batch=1, partition=None, **fields):
    doc = {"tp": tp, "dp": dp, "pp": pp, "micro_batch": micro_batch, **fields}
    doc["partition"] = partition
    return parse_plan(doc)


def single_stage(inst, **fields):
    return plan(partition=[0, inst.num_layers], **fields)


def stage_params(inst, ids=None):
    """Parameters a stage holding layers ``ids`` keeps (tp 1): a tied tensor counts once."""
    ids = range(inst.num_layers) if ids is None else ids
    tied = [inst.layers[i] for i in ids if inst.layers[i].tie]
    return sum(inst.layers[i].params.at(1) for i in ids) - (tied[0].tied_params if len(tied) > 1 else 0.0)


def times(inst, tp=1, b=1):
    node = inst.nodes[0]
    return layer_times(inst, node.device_type, node.intra_bandwidth, tp, b).seconds


# -- the attention kernel -------------------------------------------------------------------
def test_flash_keeps_no_scores_and_eager_keeps_them():
    flash = parse_instance(preset_doc(attention="flash"))
    eager = parse_instance(preset_doc(attention="eager"))
    for f, e in zip(flash.layers, eager.layers):
        if e.kind == "transformer":
            assert e.attention_memory_bytes.at(1, False) > 0
            assert f.attention_memory_bytes.at(1, False) == 0
            # the s^2 terms are the whole difference, less flash's log-sum-exp row statistics
            diff = e.activation_memory_bytes.at(1, False) - f.activation_memory_bytes.at(1, False)
            assert diff == pytest.approx(e.attention_memory_bytes.at(1, False) - 4 * 4 * 128)
    assert parse_instance({k: v for k, v in preset_doc().items()} | {"model": {
        "preset": "gpt", "hidden": 64, "layers": 4, "heads": 4, "vocab": 256, "seq_len": 128}}).layers[1] == flash.layers[1]


# -- H7/H8: recomputation --------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_recomputation_time_and_memory_by_hand(mode):
    inst = parse_instance(preset_doc())
    ev = evaluate(inst, single_stage(inst, recompute=mode, zero_stage=0))
    t = times(inst)
    tr = inst.training
    rec = np.array([layer.recomputes for layer in inst.layers])
    mem = np.array([layer.activation_memory_bytes.at(1, False) for layer in inst.layers])
    scores = np.array([layer.attention_memory_bytes.at(1, False) for layer in inst.layers])
    before = np.array([0.0] + [layer.activation_bytes.at(1, False) for layer in inst.layers[:-1]])
    extra = {"none": np.zeros(len(t)),
             "selective": np.array([l.attention_flops / l.flops if l.recomputes else 0.0 for l in inst.layers]),
             "full": np.where(rec, 1 / 3, 0.0)}[mode]
    assert ev.stages[0].compute == pytest.approx(float((t * (1 + extra)).sum()), rel=1e-12)
    kept = {"none": mem, "selective": mem - np.where(rec, scores, 0.0), "full": np.where(rec, np.minimum(before, mem), mem)}[mode]
    params = stage_params(inst)
    state = params * (tr.weight_bytes + tr.gradient_bytes + tr.optimizer_bytes)
    buffer = float(np.max(np.where(rec, mem, 0.0))) if mode == "full" else 0.0
    # one stage keeps min(p - s, n) = 1 micro-batch in flight
    expected = state + float(kept.sum()) + buffer + tr.memory_reserve
    assert ev.stages[0].memory == pytest.approx(expected, rel=1e-9)


def test_selective_frees_exactly_the_scores_and_full_keeps_less():
    inst = parse_instance(preset_doc(attention="eager"))
    mem = {m: evaluate(inst, single_stage(inst, recompute=m)).stages[0].memory for m in ("none", "selective", "full")}
    assert mem["full"] < mem["selective"] < mem["none"]


def test_block_recomputation_recomputes_the_first_layers_of_each_stage():
    inst = parse_instance(preset_doc(layers=4))
    t = times(inst)
    ev = evaluate(inst, single_stage(inst, recompute="full", recompute_layers=1))
    first = next(i for i, layer in enumerate(inst.layers) if layer.recomputes)
    assert ev.stages[0].compute == pytest.approx(float(t.sum() + t[first] / 3), rel=1e-12)


def test_block_counts_searched_are_those_below_a_stage_s_most_layers():
    from amp_opt.model.candidates import block_counts, candidates

    inst = parse_instance(preset_doc(layers=4, search={"recompute_layers": [1, 2, 3, 4, 9], "recompute": ["full"]}))
    # four transformer layers and two others: a stage holds at most 4 of them, and with pp = 5
    # at most 2 (of the 4 other stages, at most 2 hold only the embedding or the head)
    assert block_counts(inst, 1) == [1, 2, 3]
    assert block_counts(inst, 5) == [1]
    assert {c.recompute_layers for c in candidates(inst)} == {0, 1, 2, 3}
    ds = parse_instance(preset_doc(layers=4, search={"recompute_layers": [1], "engine": "deepspeed"}))
    assert not any(c.recompute_layers for c in candidates(ds))
    assert not any(c.recompute_layers and c.virtual_stages > 1
                   for c in candidates(parse_instance(preset_doc(layers=4, nodes=(("A100-80GB", 2, 4),),
                                                                 search={"recompute_layers": [1]}))))


def test_block_memory_floor_is_below_the_memory_and_grows_with_the_range():
    """The candidate bound's feasibility check (a greedy) needs a floor that only grows with a
    stage's range; the block method's own memory need not (dropping a stage's first layer moves
    the block one layer on)."""
    from amp_opt.model.costs import CandidateTerms
    from amp_opt.model.plan import Candidate
    from amp_opt.model.tables import Tables

    doc = preset_doc(attention="eager", layers=6, global_batch=8)
    doc["model"].update(hidden=2048, seq_len=4096, heads=16, vocab=32000)
    inst = parse_instance(doc)
    L = inst.num_layers
    for r, zero in ((1, 0), (2, 0), (3, 3)):
        terms = CandidateTerms(Tables(inst), Candidate(1, 1, 2, 2, recompute="full", recompute_layers=r, zero_stage=zero))
        for s in (0, 1):
            for k in range(L):
                for l in range(k + 1, L + 1):
                    floor = float(terms.memory_floor(s, k, l))
                    assert floor <= float(terms.memory(s, k, l)) * (1 + 1e-12)
                    if l < L:
                        assert floor <= float(terms.memory_floor(s, k, l + 1))
                    if k > 0:
                        assert floor <= float(terms.memory_floor(s, k - 1, l))


def test_the_block_method_wins_where_memory_allows_part_of_a_stage_and_every_backend_finds_it():
    """8 GiB per device: no recomputation does not fit in two stages, recomputing every layer is
    slower than recomputing the first two of each stage; the programs (no DP incumbents, rows
    M15) find that plan as the enumerator does."""
    doc = preset_doc(attention="flash", nodes=(("A100-80GB", 1, 2),), layers=4, global_batch=8,
                     search={"micro_batches": [4], "tp": [1], "cp": [1], "zero_stages": [0], "virtual_stages": [1],
                             "recompute": ["none", "full"], "recompute_layers": [1, 2]})
    doc["model"].update(hidden=2048, seq_len=4096, heads=16, vocab=32000)
    doc["device_types"] = [{"name": "A100-80GB", "memory": "8 GiB"}]
    inst = parse_instance(doc)
    ref = solve(inst, solver="enumerate").best
    assert (ref.plan.pp, ref.plan.recompute, ref.plan.recompute_layers) == (2, "full", 2)
    every = evaluate(inst, dataclasses.replace(ref.plan, recompute_layers=None))
    assert every.predicted_time > ref.predicted_time
    for solver in ("cpsat-nodp", "cbc-nodp", "cpsat-assign-nokinds") + (("highs-nodp",) if "highs" in OTHER_SOLVERS else ()):
        got = solve(inst, solver=solver)
        assert got.solver.status == "OPTIMAL", solver
        assert got.best.predicted_time == pytest.approx(ref.predicted_time, rel=1e-6), solver
        assert got.best.plan.recompute_layers == 2, solver


def per_stage_instance(memory_gib, recompute=("none", "full"), engine="deepspeed"):
    """Two A100s with ``memory_gib`` GiB each, a 4-layer GPT whose activations matter (flash)."""
    doc = preset_doc(attention="flash", nodes=(("A100-80GB", 1, 2),), layers=4, global_batch=8,
                     search={"micro_batches": [4], "tp": [1], "cp": [1], "zero_stages": [0], "virtual_stages": [1],
                             "recompute": list(recompute), "engine": engine})
    doc["model"].update(hidden=2048, seq_len=4096, heads=16, vocab=32000)
    doc["device_types"] = [{"name": "A100-80GB", "memory": f"{memory_gib} GiB"}]
    return parse_instance(doc)


def test_per_stage_candidates_replace_the_uniform_ones_where_the_engine_allows_them():
    from amp_opt.model.candidates import candidates
    from amp_opt.model.engines import ENGINES
    from amp_opt.model.plan import Candidate

    ds = candidates(per_stage_instance(8))
    assert ds and all(c.per_stage and c.recompute == "full" for c in ds)
    assert not any(c.per_stage for c in candidates(per_stage_instance(8, engine="megatron")))
    assert not any(c.per_stage for c in candidates(per_stage_instance(8, recompute=("full",))))
    uniform = dataclasses.replace(per_stage_instance(8), search=dataclasses.replace(per_stage_instance(8).search,
                                                                                    per_stage_recompute=False))
    assert {c.recompute for c in candidates(uniform)} == {"none", "full"} and not any(c.per_stage for c in candidates(uniform))
    rule = ENGINES["megatron"].rule(per_stage_instance(8), Candidate(1, 1, 2, 4, recompute="full", per_stage=True))
    assert rule is not None and rule[0] == "recompute"


# At 8 GiB AMP's closed form (hetero-closed) preferred ("none", "full"); under 1F1B (H13) the first
# stage's bottleneck weighs less, so the slower recomputing stage goes first there too.
@pytest.mark.parametrize("memory_gib, modes, model", [(7, ("full", "none"), "hetero"), (8, ("full", "none"), "hetero"),
                                                      (8, ("none", "full"), "hetero-closed")])
def test_per_stage_recomputation_wins_where_one_stage_fits_without_it_and_every_backend_finds_it(memory_gib, modes,
                                                                                                    model):
    """DeepSpeed lets each stage recompute or not.  At 7 and 8 GiB per device one stage of the best
    plan fits without recomputation and the other does not: that plan beats recomputing on both
    stages and not recomputing at all; the programs (rows M16, no DP incumbents) find it as the
    enumerator does, and their plans list the modes."""
    inst = per_stage_instance(memory_gib)
    ref = solve(inst, solver="enumerate", cost_model=model).best
    assert (ref.plan.pp, ref.plan.recompute) == (2, modes)
    uniform = []
    for mode in ("none", "full"):
        try:
            uniform.append(solve(per_stage_instance(memory_gib, recompute=(mode,)), solver="enumerate",
                                 cost_model=model).best.predicted_time)
        except InfeasibleError:
            uniform.append(np.inf)
    assert ref.predicted_time < min(uniform)
    assert evaluate(inst, ref.plan, model).predicted_time == ref.predicted_time
    solvers = ("cpsat-nodp", "cbc-nodp", "cpsat-assign-nokinds", "cpsat", "cbc") + (
        ("highs-nodp",) if "highs" in OTHER_SOLVERS else ())
    for solver in solvers:
        got = solve(inst, solver=solver, cost_model=model)
        assert got.solver.status == "OPTIMAL", solver
        assert got.best.predicted_time == pytest.approx(ref.predicted_time, rel=1e-6), solver
        assert got.best.plan.recompute == modes, solver


# -- sequence parallelism --------------------------------------------------------------------
def test_sequence_parallelism_splits_norms_and_p2p_at_the_same_compute():
    inst = parse_instance(preset_doc(nodes=(("A100-80GB", 1, 8),)))
    base = dict(tp=2, dp=1, pp=2, micro_batch=1, partition=[0, 3, inst.num_layers], zero_stage=0)
    off, on = (evaluate(inst, plan(**base, sequence_parallel=sp)) for sp in (False, True))
    assert on.stages[0].compute == pytest.approx(off.stages[0].compute)
    assert on.stages[0].p2p == pytest.approx(off.stages[0].p2p / 2)
    assert on.stages[0].memory < off.stages[0].memory


# -- H9: ZeRO --------------------------------------------------------------------------------
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_zero_stages_memory_and_traffic(zero):
    inst = parse_instance(preset_doc())
    R = 4
    ev = evaluate(inst, single_stage(inst, dp=R, micro_batch=1, zero_stage=zero))
    tr = inst.training
    layers = inst.layers
    params = stage_params(inst)
    w, g, o = tr.weight_bytes, tr.gradient_bytes, tr.optimizer_bytes
    per_param = w / (R if zero >= 3 else 1) + g / (R if zero >= 2 else 1) + o / (R if zero >= 1 else 1)
    acts = sum(layer.activation_memory_bytes.at(1, False) for layer in layers)
    gathered = max(layer.params.at(1) for layer in layers) * (w + g) if zero == 3 else 0.0
    assert ev.stages[0].memory == pytest.approx(params * per_param + acts + gathered + tr.memory_reserve, rel=1e-9)
    bw = inst.nodes[0].intra_bandwidth
    t = float(times(inst).sum())
    # H15: then the optimizer step, each rank over its shard of the states from ZeRO-1 on
    step = params * (2 * o + g + w) / (R if zero >= 1 else 1) / inst.device_types["A100-80GB"].memory_bandwidth
    if zero < 3:  # one ring allreduce (or reduce-scatter + all-gather) per iteration
        assert ev.stages[0].allreduce == pytest.approx(2 * (R - 1) / R * params * tr.allreduce_bytes_per_param / bw
                                                       + step)
        assert ev.stages[0].compute == pytest.approx(t)
    else:  # two gathers and a reduce-scatter per micro-batch, on top of compute (H10)
        assert ev.stages[0].allreduce == pytest.approx(step)
        assert ev.stages[0].compute == pytest.approx(t + (R - 1) / R * (2 * w + g) * params / bw)


# -- H10: context parallelism ----------------------------------------------------------------
@pytest.mark.parametrize("mode", ["none", "full"])
def test_context_parallel_splits_the_sequence_and_rings_keys_and_values(mode):
    inst = parse_instance(preset_doc())
    cp = 2
    one = evaluate(inst, single_stage(inst, dp=2, recompute=mode, zero_stage=0))
    two = evaluate(inst, single_stage(inst, dp=2, cp=cp, recompute=mode, zero_stage=0))
    kv = sum(layer.kv_bytes.at(1) for layer in inst.layers)
    passes = 4 if mode == "full" else 3
    ring = passes * (cp - 1) * kv / cp / inst.nodes[0].intra_bandwidth
    assert two.stages[0].compute == pytest.approx(one.stages[0].compute / cp + ring, rel=1e-12)
    # the gradient ring spans dp * cp = 4 ranks instead of 2; the optimizer step (H15, ZeRO 0) is the same
    step = (stage_params(inst) * (2 * inst.training.optimizer_bytes + inst.training.gradient_bytes
                                  + inst.training.weight_bytes) / inst.device_types["A100-80GB"].memory_bandwidth)
    assert two.stages[0].allreduce - step == pytest.approx((one.stages[0].allreduce - step) * (3 / 4) / (1 / 2))


# -- H11: interleaving -----------------------------------------------------------------------
def test_interleaved_schedule_formula_memory_and_p2p():
    inst = parse_instance(preset_doc(layers=4, global_batch=8))
    # pp 2, v 2: four chunks of one transformer layer (embedding with the first, head with the last)
    p = plan(dp=1, pp=2, micro_batch=1, partition=[0, 2, 3, 4, 6], virtual_stages=2, zero_stage=0)
    ev = evaluate(inst, p)
    E = [s.compute for s in ev.stages]
    n, v = 8, 2
    assert ev.predicted_time == pytest.approx((n - 1 / v) * max(E) + sum(E) / v + sum(s.p2p for s in ev.stages)
                                              + max(s.allreduce for s in ev.stages))
    t = times(inst)
    assert E[0] == pytest.approx(t[0] + t[1] + t[3])  # chunks 0 and 2
    flat = evaluate(inst, plan(dp=1, pp=2, micro_batch=1, partition=[0, 3, 6], zero_stage=0))
    assert ev.stages[0].p2p == pytest.approx(2 * flat.stages[0].p2p)  # every boundary crossed v times
    # stage 0 keeps Megatron's warm-up: (2 (p-1) + (v-1) p + 1) / v = 2.5 micro-batches of its layers
    acts = [layer.activation_memory_bytes.at(1, False) for layer in inst.layers]
    state = ev.stages[0].memory - inst.training.memory_reserve - 2.5 * (acts[0] + acts[1] + acts[3])
    params = stage_params(inst, (0, 1, 3))
    assert state == pytest.approx(params * 16, rel=1e-9)


# -- engine rules ----------------------------------------------------------------------------
@pytest.mark.parametrize("fields, engine, field, words", [
    ({"sequence_parallel": True}, "megatron", "sequence_parallel", "needs tp > 1"),
    ({"pp": 2, "partition": [0, 2, 4, 5, 7], "virtual_stages": 2}, "megatron", "virtual_stages", "must divide"),
    ({"pp": 2, "partition": [0, 2, 3, 4, 6], "virtual_stages": 2}, "megatron", "virtual_stages", "divisible by pp"),
    ({"dp": 2, "pp": 2, "partition": [0, 3, 6], "zero_stage": 3}, "megatron", "zero_stage", "pp = 1"),
    ({"cp": 2}, "deepspeed", "cp", "no context parallelism"),
    ({"pp": 2, "partition": [0, 2, 3, 4, 6], "virtual_stages": 2}, "deepspeed", "virtual_stages", "interleaved"),
    ({"recompute": "selective"}, "deepspeed", "recompute", "whole layers"),
    ({"recompute": "full", "recompute_layers": 1}, "deepspeed", "recompute_layers", "no block method"),
    ({"pp": 2, "partition": [0, 2, 3, 4, 6], "virtual_stages": 2, "recompute": "full", "recompute_layers": 1},
     "megatron", "recompute_layers", "virtual_stages 1"),
])
def test_runtime_rules_reject_a_given_plan_in_one_line(tmp_path, fields, engine, field, words):
    # five transformer layers (seven with the embedding and the loss) split into no four equal chunks
    layers = 5 if words == "must divide" else 4
    doc = preset_doc(search={"engine": engine}, layers=layers, global_batch=5 if words == "divisible by pp" else 8)
    base = {"tp": 1, "dp": 1, "pp": 1, "micro_batch": 1, "partition": [0, layers + 2]}
    (tmp_path / "i.json").write_text(json.dumps(doc))
    (tmp_path / "p.json").write_text(json.dumps(base | fields))
    run = subprocess.run([sys.executable, "-m", "amp_opt", "evaluate", str(tmp_path / "i.json"), str(tmp_path / "p.json")],
                         capture_output=True, text=True)
    assert run.returncode == 2, run.stderr
    line = run.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert f"plan.{field}" in line and words in line and engine in line


def test_megatron_split_counts_the_embedding_and_the_loss_when_that_makes_chunks_equal():
    from amp_opt.model.engines import megatron_split

    inst = parse_instance(preset_doc(layers=6))  # embedding, 6 transformer layers, head
    assert megatron_split(inst, 3) == megatron_split(inst, 3).__class__((0, 3, 5, 8), False, False)
    both = megatron_split(inst, 4)  # 6 + 2 = 8 units: the embedding and the head count as layers
    assert (both.boundaries, both.embedding_counted, both.loss_counted) == ((0, 2, 4, 6, 8), True, True)
    one = megatron_split(inst, 7)  # 6 + 1
    assert one.embedding_counted != one.loss_counted and len(one.boundaries) == 8
    assert megatron_split(inst, 5) is None


def test_the_search_never_proposes_what_the_engine_cannot_run():
    from amp_opt.model.candidates import candidates
    from amp_opt.model.engines import ENGINES

    for engine in ("megatron", "deepspeed"):
        inst = parse_instance(preset_doc(nodes=(("A100-80GB", 2, 4),), search={"engine": engine}))
        cands = candidates(inst)
        assert cands
        assert all(ENGINES[engine].rule(inst, c) is None for c in cands)
        assert not any(c.sequence_parallel and c.tp == 1 for c in cands)
        assert any(c.tp > 1 for c in cands)  # DeepSpeed has no sequence parallelism, and still tensor parallelism
    assert any(c.virtual_stages > 1 for c in candidates(parse_instance(preset_doc(nodes=(("A100-80GB", 2, 4),)))))


# -- old plans and the paper optima ----------------------------------------------------------
def test_an_old_plan_keeps_its_meaning(paper_instances):
    inst = paper_instances["het_cluster"]
    old = parse_plan({"tp": 1, "dp": 4, "pp": 4, "micro_batch": 1, "partition": [0, 9, 16, 23, 30]})
    assert (old.cp, old.sequence_parallel, old.recompute, old.zero_stage, old.virtual_stages) == (1, False, "none", None, 1)
    spelled = dataclasses.replace(old, zero_stage=inst.training.zero_stage)
    assert evaluate(inst, old).predicted_time == evaluate(inst, spelled).predicted_time


def today(instance):
    """The instance with every new decision fixed to what amp_opt searched before them, and without
    the optimizer step (H15: no device type states its memory bandwidth)."""
    space = dataclasses.replace(instance.search, cp=(1,), sequence_parallel=(False,), recompute=("none",),
                                zero_stages=(instance.training.zero_stage,), virtual_stages=(1,), idle=False)
    types = {name: dataclasses.replace(t, memory_bandwidth=None) for name, t in instance.device_types.items()}
    return dataclasses.replace(instance, search=space, device_types=types)


@pytest.mark.parametrize("exp", ["homogeneous", "het_cluster", "het_model"])
def test_paper_optima_unchanged_with_the_new_decisions_fixed(paper_instances, exp):
    """The optima recorded from the code before these decisions existed (tests/data/paper_optima.json).
    They were recorded under the closed-form iteration time (H6): the hetero ones are checked with
    ``hetero-closed``, the hetero terms under H6 (``hetero`` itself now uses the 1F1B schedule's H13)."""
    recorded = json.loads((DATA / "paper_optima.json").read_text())["optima"][exp]
    for key, ref in recorded.items():
        cost_model, placement = key.split("/")
        cost_model = "hetero-closed" if cost_model == "hetero" else cost_model
        best = solve(today(paper_instances[exp]), solver="enumerate", cost_model=cost_model, placement=placement).best
        assert best.predicted_time == pytest.approx(ref["time"], rel=1e-9), key
        assert list(best.plan.partition) == ref["partition"], key


# -- idle GPUs, cost, budget -----------------------------------------------------------------
def slow_and_fast(**kw):
    """Four fast A100s and one node of slow T4s: a T4 stage drags a pipeline down."""
    return preset_doc(nodes=(("A100-80GB", 1, 4), ("T4", 1, 4)), layers=4, global_batch=8, **kw)


def by_classes(doc):
    """The instance searched by whole node classes (``search.idle`` "classes"): the tests of the
    subsets' time sharing, carries and helpers count on a few subsets."""
    doc["search"] = {**doc.get("search", {}), "idle": "classes"}
    return doc


def test_idle_node_classes_when_slow_gpus_only_drag():
    inst = parse_instance(slow_and_fast())
    result = solve(inst, solver="enumerate")
    assert result.best.devices_used < inst.num_devices
    classes = solve(parse_instance(by_classes(slow_and_fast())), solver="enumerate")
    assert result.best.predicted_time <= classes.best.predicted_time < solve(
        dataclasses.replace(inst, search=dataclasses.replace(inst.search, idle=False)), solver="enumerate").best.predicted_time
    forced = solve(dataclasses.replace(inst, search=dataclasses.replace(inst.search, idle=False)), solver="enumerate")
    assert forced.best.devices_used == inst.num_devices
    assert forced.best.predicted_time > result.best.predicted_time


def test_a_subset_that_runs_out_of_its_share_is_reported_with_the_caller_s_time_limit():
    """No plan anywhere, one subset stopped by its (small) share of the time: exit 4 naming the
    limit the caller gave, not the share."""
    from amp_opt.errors import NoPlanFound
    from amp_opt.search.options import solve_options
    from amp_opt.search.subsets import solve_subsets

    inst = parse_instance(by_classes(slow_and_fast()))

    def run(sub, options, started):
        if len(sub.nodes) < len(inst.nodes):
            raise NoPlanFound(f"time limit of {options.time_limit:.3g} s")
        raise InfeasibleError("nothing fits")

    with pytest.raises(NoPlanFound, match="time limit of 5 s"):
        solve_subsets(inst, solve_options(solver="enumerate", time_limit=5.0), run)


def test_a_stop_that_is_not_the_clock_keeps_its_own_message():
    """A search that stopped for another reason (a coarsened model found nothing) says so."""
    from amp_opt.errors import NoPlanFound
    from amp_opt.search.options import solve_options
    from amp_opt.search.subsets import solve_subsets

    inst = parse_instance(by_classes(slow_and_fast()))

    def run(sub, options, started):
        if len(sub.nodes) == len(inst.nodes):
            raise NoPlanFound("coarsened", "no plan with stage boundaries on the blocks fits")
        raise InfeasibleError("nothing fits")

    with pytest.raises(NoPlanFound, match="stage boundaries on the blocks"):
        solve_subsets(inst, solve_options(solver="enumerate", time_limit=5.0), run)


def test_a_subset_stopped_once_and_proven_infeasible_on_its_second_run_is_a_verdict():
    """Every subset proven infeasible in the end, one of them only when revisited: exit 3, not 4."""
    from amp_opt.errors import NoPlanFound
    from amp_opt.search.options import solve_options
    from amp_opt.search.subsets import solve_subsets

    inst = parse_instance(by_classes(slow_and_fast()))
    calls = []

    def run(sub, options, started):
        calls.append(len(sub.nodes))
        if len(sub.nodes) < len(inst.nodes) and calls.count(len(sub.nodes)) == 1 and len(sub.nodes) == 1:
            raise NoPlanFound("time limit of 0.1 s")
        raise InfeasibleError("nothing fits")

    with pytest.raises(InfeasibleError, match="nothing fits"):
        solve_subsets(inst, solve_options(solver="enumerate", time_limit=5.0), run)
    assert len(calls) > len(set(calls))  # a subset was run twice


def test_a_set_searched_again_lists_each_of_its_plans_once():
    """--top-k over sets of devices: a set whose first run ended unproven is run again, and its
    second run returns the plans of its first; each plan is listed once, and the K-th plan (the
    cutoff of later runs) counts distinct plans."""
    from amp_opt.search.options import solve_options
    from amp_opt.search.solve import run_builtin
    from amp_opt.search.subsets import solve_subsets

    inst = parse_instance(by_classes(slow_and_fast()))
    runs = []

    def run(sub, options, started):
        result = run_builtin(sub, dataclasses.replace(options, cutoff=math.inf), started)
        runs.append(len(sub.nodes))
        if runs.count(len(sub.nodes)) == 1:  # the first run of each set: unproven
            result = dataclasses.replace(result, solver=dataclasses.replace(result.solver, status="FEASIBLE", bound=0.0))
        return result

    result = solve_subsets(inst, solve_options(solver="enumerate", time_limit=5.0, top_k=4), run)
    assert len(runs) > len(set(runs))  # a set was run again
    keys = [json.dumps(ev.plan.to_json(), sort_keys=True) for ev in result.top]
    assert len(keys) == len(set(keys)) == 4
    alone = solve(inst, solver="enumerate", top_k=4)
    assert [ev.predicted_time for ev in result.top] == pytest.approx([ev.predicted_time for ev in alone.top])


def test_only_the_first_subset_searches_for_its_infeasibility_diagnosis():
    """The message of an infeasible instance is the whole cluster's; the later subsets skip the
    search for their least overfull plan (it took each one's whole share of the time, and a
    generated 1024-GPU instance that is proven infeasible in 30 s then ran out of time)."""
    from amp_opt.search.options import solve_options
    from amp_opt.search.solve import run_builtin
    from amp_opt.search.subsets import solve_subsets

    inst = parse_instance(slow_and_fast(memory_reserve="100 GiB"))  # more than any GPU holds: nothing fits
    asked = []

    def run(sub, options, started):
        asked.append((len(sub.nodes), options.diagnose))
        return run_builtin(sub, options, started)

    with pytest.raises(InfeasibleError) as whole:
        solve(dataclasses.replace(inst, search=dataclasses.replace(inst.search, idle=False)), solver="enumerate")
    with pytest.raises(InfeasibleError) as idle:
        solve_subsets(inst, solve_options(solver="enumerate", time_limit=5.0), run)
    assert str(idle.value).startswith(str(whole.value))
    assert asked[0] == (len(inst.nodes), True) and len(asked) > 1
    assert all(not diagnose for _, diagnose in asked[1:])


def test_the_whole_cluster_s_diagnosis_is_the_message_even_when_it_comes_last():
    """The whole cluster stopped on its first run and proven infeasible on its second, after the
    other subsets (which skip their diagnosis): its message is the one shown."""
    from amp_opt.errors import NoPlanFound
    from amp_opt.search.options import solve_options
    from amp_opt.search.subsets import solve_subsets

    inst = parse_instance(by_classes(slow_and_fast()))
    runs = []

    def run(sub, options, started):
        runs.append(len(sub.nodes))
        if len(sub.nodes) == len(inst.nodes) and runs.count(len(sub.nodes)) == 1:
            raise NoPlanFound("time limit of 3 s")
        raise InfeasibleError("the whole cluster's diagnosis" if options.diagnose else "not diagnosed")

    with pytest.raises(InfeasibleError, match="^the whole cluster's diagnosis; leaving"):
        solve_subsets(inst, solve_options(solver="enumerate", time_limit=5.0), run)
    assert runs.count(len(inst.nodes)) == 2


def test_the_time_left_is_shared_by_the_subsets_not_proven_yet():
    """After the first pass every subset still open gets a share of the time left (the first of
    them not all of it), and each of them is run again."""
    from amp_opt.errors import NoPlanFound
    from amp_opt.search.options import solve_options
    from amp_opt.search.solve import run_builtin
    from amp_opt.search.subsets import solve_subsets

    inst = parse_instance(by_classes(preset_doc(nodes=(("A100-80GB", 1, 4), ("A100-40GB", 1, 4), ("V100-32GB", 1, 4)),
                                     layers=4, global_batch=8)))
    calls = []

    def run(sub, options, started):
        if len(sub.nodes) == len(inst.nodes):
            return run_builtin(sub, options, started)
        calls.append((tuple(n.device_type for n in sub.nodes), started.budget))
        raise NoPlanFound("time limit of 0.1 s", bound=0.0)

    result = solve_subsets(inst, solve_options(solver="enumerate", time_limit=5.0), run)
    assert result.solver.status == "FEASIBLE"
    first = {classes for classes, _ in calls}
    again = calls[len(first):2 * len(first)]
    assert len(first) >= 3 and {classes for classes, _ in again} == first
    assert again[0][1] < 0.5 * again[-1][1]  # a share, not everything left


def test_a_subset_run_again_gets_its_own_carry_back():
    """Each subset's runs share one carry (what its last run proved and found), and different
    subsets never share one: a revisit goes on from its own last run, not another subset's."""
    from amp_opt.errors import NoPlanFound
    from amp_opt.search.options import solve_options
    from amp_opt.search.solve import run_builtin
    from amp_opt.search.subsets import solve_subsets

    inst = parse_instance(by_classes(preset_doc(nodes=(("A100-80GB", 1, 4), ("A100-40GB", 1, 4), ("V100-32GB", 1, 4)),
                                     layers=4, global_batch=8)))
    carries: dict[tuple, set] = {}

    def run(sub, options, started):
        if len(sub.nodes) == len(inst.nodes):
            return run_builtin(sub, options, started)
        assert options.carry is not None
        carries.setdefault(tuple(n.device_type for n in sub.nodes), set()).add(id(options.carry))
        raise NoPlanFound("time limit of 0.1 s", bound=0.0)

    solve_subsets(inst, solve_options(solver="enumerate", time_limit=5.0), run)
    assert len(carries) >= 3
    assert all(len(ids) == 1 for ids in carries.values())  # one carry per subset, every run
    assert len(set().union(*carries.values())) == len(carries)  # none shared between subsets


def test_a_subset_stopped_with_a_bound_keeps_it():
    """A subset's search that stops without a plan still proves a bound (its candidates' bounds):
    when that bound is above the best plan, the result is proven optimal."""
    from amp_opt.errors import NoPlanFound
    from amp_opt.search.options import solve_options
    from amp_opt.search.solve import run_builtin
    from amp_opt.search.subsets import solve_subsets

    inst = parse_instance(by_classes(slow_and_fast()))

    def run(sub, options, started, bound):
        if len(sub.nodes) == len(inst.nodes):
            return run_builtin(sub, options, started)
        raise NoPlanFound("time limit of 0.1 s", bound=bound)

    options = solve_options(solver="enumerate", time_limit=5.0)
    whole = solve(dataclasses.replace(inst, search=dataclasses.replace(inst.search, idle=False)), solver="enumerate")
    high = solve_subsets(inst, options, lambda *a: run(*a, bound=10 * whole.best.predicted_time))
    assert high.solver.status == "OPTIMAL" and high.best.predicted_time == whole.best.predicted_time
    none = solve_subsets(inst, options, lambda *a: run(*a, bound=0.0))
    assert none.solver.status == "FEASIBLE" and none.solver.bound < whole.best.predicted_time


def test_every_subset_run_starts_from_the_slowest_program_build_so_far():
    """A program's build is not cut short, so the search only starts one it has time for,
    judged by the slowest build timed so far: the idle-GPU search hands each subset's run the
    slowest of every earlier run (the first build of a late subset used to start unestimated)."""
    from amp_opt.search.options import solve_options
    from amp_opt.search.solve import run_builtin
    from amp_opt.search.subsets import solve_subsets

    inst = parse_instance(by_classes(slow_and_fast()))
    given, rates = [], iter([3e-4, 1e-4, 5e-5, 0.0, 0.0, 0.0, 0.0, 0.0])

    def run(sub, options, started):
        given.append(options.carry.build_rate)
        result = run_builtin(sub, dataclasses.replace(options, carry=None), started)
        options.carry.build_rate = max(options.carry.build_rate, next(rates))  # what its builds took
        return result

    solve_subsets(inst, solve_options(solver="enumerate", time_limit=5.0), run)
    assert len(given) >= 2 and given[0] == 0.0 and all(rate == 3e-4 for rate in given[1:])


def test_a_carried_build_rate_keeps_a_run_from_builds_it_has_no_time_for():
    """Phase 2 takes the carry's build rate as its estimate before its first build: with a rate
    no time limit covers it builds no program, and a run that builds one leaves its rate."""
    from conftest import INSTANCES

    from amp_opt import load_instance
    from amp_opt.search.context import Carry
    from amp_opt.search.options import solve_options
    from amp_opt.search.solve import run_builtin

    inst = load_instance(INSTANCES / "suite" / "scale" / "s0064-gpt3-2.7b-a100-v100.json")
    options = solve_options(solver="cpsat", time_limit=3.0)
    slow = Carry(build_rate=1e3)
    assert run_builtin(inst, dataclasses.replace(options, carry=slow)).solver.extra["programs"] == 0
    fresh = Carry()
    built = run_builtin(inst, dataclasses.replace(options, carry=fresh)).solver.extra["programs"]
    assert (fresh.build_rate > 0) == (built > 0)


def test_the_least_overfull_diagnosis_stops_at_the_deadline():
    """Past the deadline the tightest plan is sought no further than the first candidate with one,
    and the message says it is the tightest among those examined."""
    import time

    from amp_opt.search.clock import Clock
    from amp_opt.search.context import Search
    from amp_opt.search.diagnose import infeasible_reason, least_overfull_rank_order
    from amp_opt.search.options import solve_options

    doc = preset_doc(nodes=(("A100-80GB", 2, 4),), search={"recompute": ["none"], "zero_stages": [0]})
    doc["device_types"] = [{"name": "A100-80GB", "memory": "100 MiB"}]
    inst = parse_instance(doc)
    with pytest.raises(InfeasibleError):
        solve(inst, solver="enumerate")
    whole = least_overfull_rank_order(Search(inst, solve_options(time_limit=60.0)))
    late = Search(inst, solve_options(time_limit=1.0), Clock.of(1.0, started=time.perf_counter() - 10.0))
    cut = least_overfull_rank_order(late)
    assert not whole.partial and cut.partial and cut.ratio >= whole.ratio
    assert "examined before the time limit" in infeasible_reason(late, cut)


def test_cost_objective_and_budget_equal_brute_force():
    from amp_opt.bench.brute import brute_force

    inst = parse_instance(preset_doc(nodes=(("A100-80GB", 1, 2), ("T4", 1, 2)), layers=2, global_batch=8,
                                     search={"recompute": ["none"], "zero_stages": [0], "virtual_stages": [1]}))
    cheapest = solve(inst, solver="enumerate", objective="cost").best
    assert cheapest.cost == pytest.approx(brute_force(inst, objective="cost").value, rel=1e-12)
    budget = 2 * inst.device_types["T4"].price_per_hour + 1e-9  # both T4s, or fewer GPUs
    within = solve(inst, solver="enumerate", budget=budget).best
    assert within.cost * 3600 / within.predicted_time <= budget
    assert within.predicted_time == pytest.approx(brute_force(inst, budget=budget).value, rel=1e-12)


def test_a_budget_no_plan_meets_exits_3_with_the_cheapest_plan(tmp_path):
    (tmp_path / "i.json").write_text(json.dumps(slow_and_fast()))
    run = subprocess.run([sys.executable, "-m", "amp_opt", "solve", str(tmp_path / "i.json"), "--budget", "0.5"],
                         capture_output=True, text=True)
    assert run.returncode == 3
    assert "budget" in run.stderr and "USD/hour" in run.stderr and "over" in run.stderr and "Traceback" not in run.stderr
    assert "the cheapest devices that can train (1 node of 4 x T4)" in run.stderr


# -- every solver equals the enumerator with all decisions open ------------------------------
GPUS = ["A100-80GB", "A100-40GB", "V100-32GB", "T4"]


def open_instance(gpus, devices, layers, memory_gib, attention="eager", engine="megatron"):
    """A small GPT (hidden 2048, 16 heads, sequences of 4096 tokens: memory matters) on two or
    three node classes with all decisions open, block counts 1 and 2 included; eager attention,
    so that selective recomputation pays (flash: so that the block method wins); memories from
    4 to 24 GiB, so that recomputation, ZeRO, sequence and context parallelism and idle GPUs all
    win somewhere; on Megatron or on DeepSpeed (whose stages each choose their recomputation)."""
    doc = preset_doc(attention=attention, nodes=tuple((g, 1, devices) for g in gpus), layers=layers, global_batch=8,
                     search={"micro_batches": [1, 2, 4], "tp": [1, 2], "recompute_layers": [1, 2], "engine": engine})
    doc["model"].update(hidden=2048, seq_len=4096, heads=16, vocab=32000)
    doc["device_types"] = [{"name": g, "memory": f"{memory_gib[i]} GiB"} for i, g in enumerate(gpus)]
    return parse_instance(doc)


open_instances = st.builds(
    open_instance, gpus=st.lists(st.sampled_from(GPUS), min_size=2, max_size=3, unique=True),
    devices=st.sampled_from([1, 2]), layers=st.integers(2, 4),
    memory_gib=st.lists(st.sampled_from([4, 6, 8, 12, 24]), min_size=3, max_size=3),
    attention=st.sampled_from(["eager", "flash"]), engine=st.sampled_from(["megatron", "deepspeed"]))


# Every backend and the second layer formulation (HiGHS when its optional extra is installed).
OTHER_SOLVERS = ("cpsat", "cbc", "cpsat-assign", "cbc-nokinds") + (
    ("highs",) if __import__("importlib").util.find_spec("highspy") else ())


def outcome(instance, solver):
    try:
        return solve(instance, solver=solver)
    except InfeasibleError:
        return None


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instance=open_instances)
# CP-SAT's symmetry handling (OR-Tools 9.15) called this program infeasible under a cutoff, and under
# H13 its presolve's inclusion detection called a worse plan optimal (cpsat.solve):
@example(instance=open_instance(["V100-32GB", "A100-80GB", "T4"], 1, 2, [8, 4, 6], "eager", "deepspeed"))
def test_all_solvers_equal_the_enumerator_with_all_decisions_open(instance):
    found = {s: outcome(instance, s) for s in ("enumerate",) + OTHER_SOLVERS}
    assert len({r is None for r in found.values()}) == 1, {s: r is None for s, r in found.items()}
    if found["enumerate"] is None:
        return
    ref = found["enumerate"].best.predicted_time
    for name, result in found.items():
        assert result.solver.status == "OPTIMAL", name
        assert result.best.feasible, name
        assert result.best.predicted_time == pytest.approx(ref, rel=1e-5), name


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instance=open_instances)
def test_all_solvers_equal_the_enumerator_with_all_decisions_open_long(instance):
    test_all_solvers_equal_the_enumerator_with_all_decisions_open.hypothesis.inner_test(instance)


# ---- the subsets searched in processes beside the whole cluster's (--processes) ----

needs_two_cores = pytest.mark.skipif(
    not __import__("amp_opt.search.sidecar", fromlist=["x"]).can_fork()
    or __import__("amp_opt.search.sidecar", fromlist=["x"]).usable_cores() < 2,
    reason="forked helpers need Linux and two usable cores")


def three_classes():
    """Three nodes of three classes, searched by whole node classes: 7 subsets."""
    return by_classes(preset_doc(nodes=(("A100-80GB", 1, 4), ("A100-40GB", 1, 4), ("V100-32GB", 1, 4)), layers=4,
                                 global_batch=8))


@needs_two_cores
def test_subsets_searched_beside_the_whole_cluster_give_the_exact_optimum():
    """With a helper process the answer is the one subsets searched in turn give (and the brute
    force over every set of node classes), proven optimal."""
    inst = parse_instance(three_classes())
    alone = solve(inst, solver="enumerate", time_limit=60.0)
    beside = solve(inst, solver="enumerate", time_limit=60.0, processes=2)
    assert beside.solver.extra["processes"] == 2 and alone.solver.extra["processes"] == 1
    assert beside.solver.status == alone.solver.status == "OPTIMAL"
    assert beside.best.predicted_time == pytest.approx(alone.best.predicted_time, rel=1e-12)
    assert beside.solver.extra["subsets_searched"] + beside.solver.extra["subsets_cut_off"] >= 2


@needs_two_cores
def test_what_a_helper_process_proves_reaches_the_result():
    """The subsets' runs happen in the helper; their bounds come back: a bound above the whole
    cluster's plan proves it optimal, a bound of 0 leaves the result FEASIBLE."""
    from amp_opt.errors import NoPlanFound
    from amp_opt.search.options import solve_options
    from amp_opt.search.solve import run_builtin
    from amp_opt.search.subsets import solve_subsets

    inst = parse_instance(three_classes())
    pid = __import__("os").getpid()

    def run(sub, options, started, bound):
        if len(sub.nodes) == len(inst.nodes):
            assert __import__("os").getpid() == pid  # the whole cluster in this process
            return run_builtin(sub, options, started)
        assert __import__("os").getpid() != pid  # the other subsets beside it
        raise NoPlanFound("time limit of 0.1 s", bound=bound)

    options = dataclasses.replace(solve_options(solver="enumerate", time_limit=30.0), processes=2)
    whole = solve(dataclasses.replace(inst, search=dataclasses.replace(inst.search, idle=False)), solver="enumerate")
    high = solve_subsets(inst, options, lambda *a: run(*a, bound=10 * whole.best.predicted_time))
    assert high.solver.status == "OPTIMAL" and high.best.predicted_time == whole.best.predicted_time
    none = solve_subsets(inst, options, lambda *a: run(*a, bound=0.0))
    assert none.solver.status == "FEASIBLE" and none.solver.bound < whole.best.predicted_time
    assert none.solver.extra["subsets_searched"] == 2 ** 3 - 1  # every one of the 7 subsets ran


@needs_two_cores
def test_a_helper_that_overruns_is_not_waited_for():
    """A subset's run that ignores its limit does not hold the answer past the time limit: the
    helper is killed and the whole cluster's plan is returned, its bound not claimed proven."""
    import time

    from amp_opt.search.clock import Clock
    from amp_opt.search.options import solve_options
    from amp_opt.search.solve import run_builtin
    from amp_opt.search.subsets import solve_subsets

    inst = parse_instance(three_classes())

    def run(sub, options, started):
        if len(sub.nodes) == len(inst.nodes):
            return run_builtin(sub, options, started)
        time.sleep(600)

    began = time.perf_counter()
    result = solve_subsets(inst, dataclasses.replace(solve_options(solver="enumerate", time_limit=3.0), processes=2),
                           run, Clock.of(3.0, began))
    assert time.perf_counter() - began < 3.0
    assert result.solver.status == "FEASIBLE" and result.solver.extra["subsets_searched"] == 1


@needs_two_cores
def test_a_failing_helper_is_an_error_with_its_traceback():
    from amp_opt.search.options import solve_options
    from amp_opt.search.solve import run_builtin
    from amp_opt.search.subsets import solve_subsets

    inst = parse_instance(three_classes())

    def run(sub, options, started):
        if len(sub.nodes) == len(inst.nodes):
            return run_builtin(sub, options, started)
        raise ZeroDivisionError("a bug in a subset's search")

    with pytest.raises(RuntimeError, match="(?s)beside this one failed.*ZeroDivisionError: a bug"):
        solve_subsets(inst, dataclasses.replace(solve_options(solver="enumerate", time_limit=10.0), processes=2), run)


def test_helpers_only_under_a_time_limit_and_never_more_than_cores_or_subsets(monkeypatch):
    """Without a time limit the search repeats exactly, so it stays in one process."""
    from amp_opt.search import sidecar
    from amp_opt.search.options import solve_options
    from amp_opt.search.subsets import _helpers

    monkeypatch.setattr(sidecar, "usable_cores", lambda: 4)
    monkeypatch.setattr(sidecar, "can_fork", lambda: True)
    opts = solve_options(time_limit=10.0, processes=8)
    assert _helpers(opts, 7) == 3 and _helpers(opts, 2) == 1 and _helpers(opts, 1) == 0
    assert _helpers(solve_options(processes=8), 7) == 0
    assert _helpers(solve_options(time_limit=10.0), 7) == 0  # the library's default: one process
    monkeypatch.setattr(sidecar, "usable_cores", lambda: 1)
    assert _helpers(opts, 7) == 0


def test_processes_must_be_a_positive_whole_number():
    from amp_opt.errors import InputError
    from amp_opt.search.options import solve_options

    with pytest.raises(InputError, match="--processes"):
        solve_options(processes=0)
