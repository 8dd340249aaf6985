"""The terms of formulations/hetero.md H14 (framework memory) and H15 (optimizer step): their
values, their inputs, and that every search prices them as the evaluator does."""

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_brute import cases, check, tiny
from test_strategies import plan, preset_doc, single_stage, stage_params, times

from amp_opt import InputError, evaluate, parse_instance
from amp_opt.model.catalog import CATALOG, MEMORY_BANDWIDTH
from amp_opt.model.costs.terms import communicator_sizes, framework_bytes

MB = 1e6


# -- H14: framework memory ------------------------------------------------------------------------
def test_communicators_a_rank_uses():
    """tp, cp, the gradient group of dp*cp replicas and the pipeline's pair; groups of one need none."""
    assert communicator_sizes(plan(tp=1, dp=1, pp=1, partition=[0, 6]).candidate) == ()
    assert communicator_sizes(plan(tp=4, dp=2, pp=3, partition=[0, 2, 4, 6]).candidate) == (4, 2, 2)
    assert communicator_sizes(plan(tp=2, dp=2, pp=1, cp=2, partition=[0, 6]).candidate) == (2, 2, 4)


def test_communicator_buffers_and_fragmentation_enter_memory():
    """M = (1 + fragmentation) x (what the allocator holds) + reserve + NCCL buffers per communicator."""
    base = parse_instance(preset_doc())
    parts = parse_instance(preset_doc(communicator_bytes={"pair": "500 MB", "group": "700 MB"}, fragmentation=0.25))
    p = single_stage(base, tp=4, dp=1, micro_batch=1, zero_stage=0)  # one communicator of 4 ranks
    before, after = evaluate(base, p).stages[0].memory, evaluate(parts, p).stages[0].memory
    reserve = base.training.memory_reserve
    assert after == pytest.approx(1.25 * (before - reserve) + reserve + 700 * MB, rel=1e-12)
    two = plan(tp=1, dp=2, pp=2, micro_batch=1, partition=[0, 3, 6], zero_stage=0)  # dp pair and pipeline pair
    assert framework_bytes(parts.training, two.candidate) == reserve + 2 * 500 * MB
    # by default the reserve stands for all of it: today's numbers
    assert base.training.communicator_bytes == (0.0, 0.0) and base.training.fragmentation == 0.0


def test_framework_memory_inputs_are_checked():
    with pytest.raises(InputError, match="fragmentation"):
        parse_instance(preset_doc(fragmentation=1.5))
    with pytest.raises(InputError, match="communicator_bytes"):
        parse_instance(preset_doc(communicator_bytes={"pair": "lots"}))


def test_communicator_buffers_make_a_plan_infeasible_that_fit():
    """A plan within 1 GB of a device's memory fits without the buffers and not with two of them."""
    doc = preset_doc()
    inst = parse_instance(doc)
    p = plan(tp=1, dp=2, pp=2, micro_batch=1, partition=[0, 3, 6], zero_stage=0)
    need = max(s.memory for s in evaluate(inst, p).stages)
    doc["device_types"] = [{"name": "A100-80GB", "memory": need + 0.9e9}]
    assert evaluate(parse_instance(doc), p).feasible
    doc["training"]["communicator_bytes"] = {"pair": "500 MB"}
    assert not evaluate(parse_instance(doc), p).feasible


def _with_framework_parts(inst, fraction):
    """The instance with NCCL buffers of ``fraction`` of its smallest capacity and 20% fragmentation."""
    cap = min(t.capacity for t in inst.device_types.values())
    tr = dataclasses.replace(inst.training, communicator_bytes=(fraction * cap, 1.5 * fraction * cap), fragmentation=0.2)
    return dataclasses.replace(inst, training=tr)




@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases, fraction=st.floats(0.0, 0.3))
def test_every_search_prices_the_framework_memory_as_the_brute_force(case, fraction):
    """The DP, the MIP rows (M8 with H14) and the bounds equal the brute force with the buffers on."""
    inst = _with_framework_parts(tiny(**case), fraction)
    truth = check(inst, "enumerate")
    for solver in ("cpsat", "highs", "cpsat-nodp", "highs-nokinds"):
        check(inst, solver, truth=truth)


# -- H15: the optimizer step ----------------------------------------------------------------------
def test_every_catalog_gpu_states_its_memory_bandwidth_and_source():
    for name, spec in CATALOG.items():
        assert spec.memory_bandwidth == MEMORY_BANDWIDTH[name][0] > 1e11, name
        assert "GB/s" in MEMORY_BANDWIDTH[name][1] or "TB/s" in MEMORY_BANDWIDTH[name][1], name


def _step(inst, params, replicas=1, device="A100-80GB"):
    tr = inst.training
    return params * (2 * tr.optimizer_bytes + tr.gradient_bytes + tr.weight_bytes) / replicas \
        / inst.device_types[device].memory_bandwidth


@pytest.mark.parametrize("zero", [0, 1, 3])
def test_the_optimizer_step_is_a_pass_over_the_states_at_memory_bandwidth(zero):
    inst = parse_instance(preset_doc())
    p = single_stage(inst, dp=4, micro_batch=1, zero_stage=zero)
    costs_step = _step(inst, stage_params(inst), replicas=4 if zero >= 1 else 1)
    ev = evaluate(inst, p)
    bare = dataclasses.replace(inst, device_types={n: dataclasses.replace(t, memory_bandwidth=None)
                                                   for n, t in inst.device_types.items()})
    assert ev.stages[0].allreduce - evaluate(bare, p).stages[0].allreduce == pytest.approx(costs_step, rel=1e-9)
    assert ev.predicted_time - evaluate(bare, p).predicted_time == pytest.approx(costs_step, rel=1e-9)


def test_a_stage_of_two_device_types_steps_at_the_slower_memory():
    inst = parse_instance(preset_doc(nodes=(("A100-80GB", 1, 1), ("T4", 1, 1))))
    p = single_stage(inst, dp=2, micro_batch=1, zero_stage=0, stages=[[[0], [1]]])
    bare = dataclasses.replace(inst, device_types={n: dataclasses.replace(t, memory_bandwidth=None)
                                                   for n, t in inst.device_types.items()})
    extra = evaluate(inst, p).stages[0].allreduce - evaluate(bare, p).stages[0].allreduce
    assert extra == pytest.approx(_step(inst, stage_params(inst), device="T4"), rel=1e-9)


def test_memory_bandwidth_is_read_and_overridden():
    doc = preset_doc()
    doc["device_types"] = [{"name": "A100-80GB", "memory_bandwidth": "1 TB/s"}]
    assert parse_instance(doc).device_types["A100-80GB"].memory_bandwidth == 1e12
    doc["device_types"] = [{"name": "mine", "memory": "8 GiB", "peak_flops": 1e12}]
    doc["nodes"][0]["device_type"] = "mine"
    assert parse_instance(doc).device_types["mine"].memory_bandwidth is None  # not priced


# -- H16: tensor-parallel groups across nodes -----------------------------------------------------
def test_a_tensor_parallel_group_across_two_nodes_is_priced_on_the_inter_node_link():
    """Megatron runs tp 16 over two nodes of 8: evaluate accepts it and prices the group's
    collectives (H2's analytic term) over the slowest inter-node link, the stage's ring too."""
    from amp_opt.model.profiles import layer_times

    inst = parse_instance(preset_doc(nodes=(("A100-80GB", 2, 8),), global_batch=8))
    node = inst.nodes[0]
    ev = evaluate(inst, single_stage(inst, tp=16, micro_batch=1, zero_stage=0))
    across = layer_times(inst, node.device_type, node.inter_bandwidth, 16, 1).seconds
    within = layer_times(inst, node.device_type, node.intra_bandwidth, 16, 1).seconds
    assert float(across.sum()) > float(within.sum())
    assert ev.stages[0].compute == pytest.approx(float(across.sum()), rel=1e-12)
    assert ev.stages[0].nodes == ("n0-0", "n0-1")
    # a pipeline whose stage groups span both nodes sends its boundary over the inter-node link
    two = evaluate(inst, plan(tp=8, pp=2, micro_batch=1, partition=[0, 3, 6], zero_stage=0,
                              stages=[[[0, 1, 2, 3, 8, 9, 10, 11]], [[4, 5, 6, 7, 12, 13, 14, 15]]]))
    volume = inst.layers[2].activation_bytes.at(8)
    assert two.stages[0].p2p == pytest.approx(volume / node.inter_bandwidth, rel=1e-12)


# -- H17: the NIC shared by the rings that leave a node -------------------------------------------
def _reduction(nics, tp: int, global_batch: int):
    """Seconds of the gradient reduction of one stage over two nodes of 8 A100s with ``nics`` NICs
    each (no optimizer step), and the instance."""
    doc = preset_doc(nodes=(("A100-80GB", 2, 8),), global_batch=global_batch)
    if nics is not None:
        doc["nodes"][0]["nics"] = nics
    inst = parse_instance(doc)
    p = single_stage(inst, tp=tp, dp=16 // tp, micro_batch=1, zero_stage=0)
    bare = dataclasses.replace(inst, device_types={n: dataclasses.replace(t, memory_bandwidth=None)
                                                   for n, t in inst.device_types.items()})
    return evaluate(bare, p).stages[0].allreduce, inst


def test_rings_share_the_nics_of_their_nodes():
    """tp 8 over two nodes of 8: the 8 rings of a stage leave each node at once; with 2 NICs each
    ring gets a quarter of one (the gradient reduction takes 4 times as long), with 8 NICs or
    none stated one each (as before)."""
    times = {nics: _reduction(nics, 8, 8)[0] for nics in (None, 2, 8)}
    assert times[8] == pytest.approx(times[None], rel=1e-12)
    assert times[2] == pytest.approx(4 * times[None], rel=1e-12)


def test_a_ring_uses_every_nic_of_its_nodes():
    """tp 2 over two nodes of 8 with 8 NICs: each of the 2 rings of a stage gets 4 NICs' worth (a
    communicator's channels leave through different NICs), so the reduction takes a quarter of the
    time with one NIC's worth (nics 2: one each); never faster than the node's own link."""
    times = {nics: _reduction(nics, 2, 16)[0] for nics in (2, 8, 64)}
    node = _reduction(2, 2, 16)[1].nodes[0]
    assert times[2] == pytest.approx(4 * times[8], rel=1e-12)
    assert times[64] == pytest.approx(times[8] * 4 * node.inter_bandwidth / node.intra_bandwidth, rel=1e-12)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1))
def test_every_search_prices_shared_nics_as_the_brute_force(seed):
    """Two nodes of two GPUs, one NIC each: a tp-2 stage across them reduces at half the link."""
    from amp_opt.model.generate import generate_instance

    doc = generate_instance(seed, nodes=2, devices_per_node=2, device_types=2, layers=3, global_batch=4)
    for node in doc["nodes"]:
        node["nics"] = 1
    doc["search"].update({"tp": [1, 2], "micro_batches": [1, 2], "zero_stages": [0, 1], "virtual_stages": [1],
                          "recompute": ["none"], "cp": [1], "idle": False})
    inst = parse_instance(doc)
    truth = check(inst, "enumerate")
    for solver in ("cpsat", "highs"):
        check(inst, solver, truth=truth)


# -- eager attention: the s x s tensors per head ---------------------------------------------------
def test_eager_attention_keeps_its_scores_from_a_hugging_face_config_too():
    """The presets count 5 a s^2 bytes of scores, softmax and dropout per layer under eager attention
    (tests/test_presets.py); a model from a config.json takes the run's kernel from model.attention."""
    config = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1000,
              "max_position_embeddings": 512, "tie_word_embeddings": False}
    doc = preset_doc()
    doc["model"] = {"hf_config": config, "seq_len": 128}
    flash = parse_instance(doc)
    doc["model"]["attention"] = "eager"
    eager = parse_instance(doc)
    s, a = 128, 4
    body = [i for i, layer in enumerate(eager.layers) if layer.kind == "transformer"]
    for i in body:
        extra = eager.layers[i].activation_memory_bytes.at(1) - flash.layers[i].activation_memory_bytes.at(1)
        assert extra == pytest.approx(2 * a * s * s - 4 * a * s, rel=1e-12)  # bf16 softmax output, not the LSE
        assert eager.layers[i].attention_memory_bytes.at(1) == 2 * a * s * s


# -- H18: the reduction overlapped with the last backward pass -------------------------------------
def test_an_overlapped_reduction_exposes_only_what_the_backward_pass_does_not_hide():
    """exposed = max(0, reduction - 2/3 x the stage's layer seconds), then the optimizer step."""
    doc = preset_doc(nodes=(("A100-80GB", 2, 1),), global_batch=8)
    doc["model"].update(hidden=1024, layers=2)
    doc["nodes"][0]["inter_bandwidth"] = "1 Gbit/s"  # a slow link: the reduction outlasts the backward
    for overlap in (False, True):
        doc["training"]["overlap_grad_reduce"] = overlap
        inst = parse_instance(doc)
        p = single_stage(inst, dp=2, micro_batch=1, zero_stage=0)
        ev = evaluate(inst, p)
        if not overlap:
            plain = ev
    step = _step(inst, stage_params(inst))
    window = 2 / 3 * float(times(inst).sum())
    reduction = plain.stages[0].allreduce - step
    assert reduction > window > 0
    assert ev.stages[0].allreduce == pytest.approx(reduction - window + step, rel=1e-9)
    assert plain.predicted_time - ev.predicted_time == pytest.approx(window, rel=1e-9)
    doc["nodes"][0]["inter_bandwidth"] = "1000 GB/s"  # a fast one: the backward hides all of it
    fast = evaluate(parse_instance(doc), p)
    assert fast.stages[0].allreduce == pytest.approx(step, rel=1e-9)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases, slow=st.booleans())
def test_every_search_prices_the_overlapped_reduction_as_the_brute_force(case, slow):
    """H18 in the DP, the MIP rows (fixed and free grouping), the kinds and the bounds."""
    inst = tiny(**case)
    nodes = tuple(dataclasses.replace(n, inter_bandwidth=n.inter_bandwidth / 100) for n in inst.nodes) if slow \
        else inst.nodes
    inst = dataclasses.replace(inst, nodes=nodes, training=dataclasses.replace(inst.training, overlap_grad_reduce=True))
    truth = check(inst, "enumerate")
    for solver in ("cpsat", "highs"):
        check(inst, solver, truth=truth)


def test_tensor_parallel_groups_across_nodes_are_in_the_space_only_when_the_instance_says_so():
    """H16: evaluate prices a group that spans nodes; the plan space holds such plans only with
    search.tp_across_nodes, and then the search, which keeps groups inside a node, says so."""
    from amp_opt import evaluate, parse_instance, parse_plan, solve
    from amp_opt.bench.brute import raw_plans
    from amp_opt.model.generate import generate_instance

    doc = generate_instance(3, nodes=2, devices_per_node=1, device_types=1, layers=3, global_batch=4)
    doc["search"].update(tp=[1, 2], cp=[1], virtual_stages=[1], sequence_parallel=[False], recompute=["none"],
                         zero_stages=[0], micro_batches=[1])
    across = {"tp": 2, "dp": 1, "pp": 1, "micro_batch": 1, "partition": [0, 3], "stages": [[[0, 1]]]}
    plain = parse_instance(doc)
    assert evaluate(plain, parse_plan(across)).predicted_time > 0
    assert not any(p["tp"] == 2 for p in raw_plans(plain))  # each group's two devices sit on two nodes
    doc["search"]["tp_across_nodes"] = True
    wide = parse_instance(doc)
    assert any(p["tp"] == 2 for p in raw_plans(wide))
    assert solve(plain).solver.within is None
    assert "tensor-parallel groups sit inside one node" in solve(wide).solver.within
