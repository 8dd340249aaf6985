"""Per-message link latency (formulations/hetero.md H19): priced where messages are sent, 0 by
default, refused when negative, and written by ``profile`` from what it measured."""

import copy
import functools
import json

import pytest

from amp_opt import InputError, evaluate, parse_instance, parse_plan
from amp_opt.model.generate import generate_instance
from amp_opt.model.profile_instance import profiled_instance


def _doc(intra=0.0, inter=0.0):
    doc = generate_instance(3, nodes=4, devices_per_node=1, device_types=1, layers=4, global_batch=8)
    for node in doc["nodes"]:
        node["intra_latency"], node["inter_latency"] = intra, inter
    return doc


PLAN = {"tp": 1, "dp": 2, "pp": 2, "micro_batch": 1, "partition": [0, 2, 4], "stages": [[[0], [1]], [[2], [3]]]}


def test_latency_adds_one_message_per_crossing_and_2_r_minus_1_ring_steps():
    """pp 2, dp 2 on four one-device nodes (every link inter-node), 1F1B (each boundary crossed both
    ways, H13): the iteration gains 2 alpha of p2p and 2 (2-1) alpha at the end of the iteration."""
    alpha = 3e-3
    base = evaluate(parse_instance(_doc()), parse_plan(PLAN))
    slow = evaluate(parse_instance(_doc(intra=1.0, inter=alpha)), parse_plan(PLAN))  # intra: used by no link here
    assert slow.breakdown["p2p"] - base.breakdown["p2p"] == pytest.approx(2 * alpha)
    assert slow.breakdown["allreduce"] - base.breakdown["allreduce"] == pytest.approx(2 * alpha)
    assert slow.predicted_time - base.predicted_time == pytest.approx(4 * alpha)
    assert slow.stages[0].p2p - base.stages[0].p2p == pytest.approx(alpha)


def test_no_latency_is_the_default_and_changes_nothing():
    doc = _doc()
    for node in doc["nodes"]:
        del node["intra_latency"], node["inter_latency"]
    assert evaluate(parse_instance(doc), parse_plan(PLAN)).predicted_time == \
        evaluate(parse_instance(_doc()), parse_plan(PLAN)).predicted_time


@pytest.mark.parametrize("value", [-1e-6, "1 ms", float("inf"), True])
def test_a_bad_latency_is_refused_naming_the_field(value):
    doc = _doc()
    doc["nodes"][0]["inter_latency"] = value
    with pytest.raises(InputError, match=r"nodes\[0\]\.inter_latency"):
        parse_instance(doc)


def test_profile_writes_the_measured_latency_and_optimizer_bandwidth_with_notes():
    doc = copy.deepcopy(_doc())
    doc["device_types"] = [{"name": "cpu", "memory": "8 GiB"}]
    for node in doc["nodes"]:
        node["device_type"] = "cpu"
    doc["profiles"] = [dict(p, device_type="cpu") for p in doc["profiles"][:1]]
    instance = parse_instance(doc)
    links = {"allreduce": [{"bytes": 1 << 23, "seconds": 0.0108, "bandwidth": 2 * 0.5 * (1 << 23) / 0.0108}],
             "latency": {"bytes": 4, "p2p_seconds": 40e-6, "allreduce_seconds": 100e-6, "seconds": 50e-6,
                         "repeats": 200}}
    step = {"parameters": 1000, "seconds": 2e-3, "bytes_per_param": 24.0, "bandwidth": 1000 * 24 / 2e-3,
            "repeats": 20, "threads": 1}
    out, notes = profiled_instance(doc, instance, [], device_type="cpu", device="cpu", dtype_bytes=4,
                                   links=links, link_processes=2, optimizer=step)
    node = out["nodes"][0]
    assert node["intra_latency"] == 50e-6
    # The bandwidth net of the allreduce's 2 (p-1) = 2 steps of latency: 2 (p-1)/p x 8 MiB bus bytes in 10.7 ms.
    assert node["intra_bandwidth"] == pytest.approx((1 << 23) / (0.0108 - 2 * 50e-6))
    assert out["device_types"][0]["memory_bandwidth"] == 1.2e7
    assert any("intra_latency" in n and "50.0 us" in n for n in notes)
    assert any("memory_bandwidth of device type cpu" in n for n in notes)
    loaded = parse_instance(json.loads(json.dumps(out)))
    assert loaded.nodes[0].intra_latency == 50e-6 and loaded.device_types["cpu"].memory_bandwidth == 1.2e7


def _two_nodes(latency: float):
    """Two nodes of two GPUs whose node link is 100 times faster than the one inside a node but
    ``latency`` seconds per message: where latency decides, every message stays inside a node."""
    doc = generate_instance(11, nodes=2, devices_per_node=2, device_types=1, layers=4, global_batch=8)
    for node in doc["nodes"]:
        node.update(intra_bandwidth=2e8, inter_bandwidth=2e10, intra_latency=0.0, inter_latency=latency)
    doc["search"].update(idle=True)
    return parse_instance(doc)


def _priced_in_full(result) -> None:
    """Every program's own value of the plan it returned is no less than the evaluator's score of it: a
    row that leaves a latency out shows there even when re-scoring still picks the right plan."""
    for prog in result.solver.programs:
        if prog["plan_time"] is not None and prog["objective"] is not None:
            assert prog["objective"] >= prog["plan_time"] * (1 - 1e-5), prog


def _crosses_nodes(inst, plan) -> bool:
    """Whether a stage's replicas or two neighbouring stages use more than one node."""
    node = inst.device_node
    stages = [{int(node[d]) for group in stage for d in group} for stage in plan.stages]
    return any(len(s) > 1 for s in stages) or any(len(a | b) > 1 for a, b in zip(stages, stages[1:]))


@functools.cache
def _latency_truth():
    """The brute force's best plan with 50 ms per message on the node link (once for every solver)."""
    from amp_opt.bench.brute import brute_force
    return brute_force(_two_nodes(0.05))


@pytest.mark.parametrize("solver, placement", [("enumerate", "free"), ("cpsat", "free"), ("cbc", "free"),
                                               ("highs", "free"), ("enumerate", "rank-order"), ("cpsat", "rank-order")])
def test_every_search_keeps_messages_in_a_node_where_latency_decides(solver, placement):
    """Without latency the fast node link wins; with 50 ms per message on it, the brute force's best plan
    sends nothing across nodes (ZeRO-3's gathers included), and every search (the DP's hops and states,
    the programs' rows) finds it."""
    from amp_opt import solve

    if placement == "free":
        assert _crosses_nodes(_two_nodes(0.0), solve(_two_nodes(0.0), solver=solver).best.plan)
    inst = _two_nodes(0.05)
    truth = _latency_truth()
    result = solve(inst, solver=solver, placement=placement)
    _priced_in_full(result)
    best = result.best
    assert best.predicted_time == pytest.approx(truth.value, rel=1e-7)
    assert not _crosses_nodes(inst, best.plan)


@pytest.mark.parametrize("solver, placement", [("enumerate", "free"), ("enumerate", "rank-order"), ("cpsat", "free"),
                                               ("cpsat", "rank-order"), ("highs", "free")])
def test_every_search_crosses_the_node_link_least_where_latency_decides(solver, placement):
    """Memory for half the model per device, one setting per decision but the degrees, every device used:
    pipelines of 2 stages of 2 replicas or of 4 stages.  With 1 s per message across nodes and node links
    100 times faster than a node's own, the best plan crosses the node link once (the brute force's); a
    search that leaves the boundary's latency out, or merges states whose latency differs, crosses more."""
    from amp_opt import solve
    from amp_opt.bench.brute import brute_force

    doc = generate_instance(11, nodes=2, devices_per_node=2, device_types=1, layers=4, global_batch=8)
    doc["device_types"] = [{"name": "V100-16GB", "memory": 4.6e9}]  # a stage of half the model fits, all of it not
    for node in doc["nodes"]:
        node.update(intra_bandwidth=2e8, inter_bandwidth=2e10, intra_latency=0.0, inter_latency=1.0)
    doc["search"].update(tp=[1], zero_stages=[0], recompute=["none"], micro_batches=[1, 2], idle=False)
    inst = parse_instance(doc)
    truth = brute_force(inst)
    assert 1.0 < truth.value < 3.0  # one node crossing (2 s: both ways), not more
    result = solve(inst, solver=solver, placement=placement)
    _priced_in_full(result)
    assert result.best.predicted_time == pytest.approx(truth.value, rel=1e-7)


@functools.cache
def _tp_latency(latency: float):
    """Two nodes of two GPUs, tp 2 only, the first node's tp links ``latency`` seconds per message:
    the nodes differ in nothing else, so a search that keys a group's compute by its device type and
    bandwidth alone prices one node's layers at the other's latency.  Its brute force, once."""
    from amp_opt.bench.brute import brute_force

    doc = generate_instance(11, nodes=2, devices_per_node=2, device_types=1, layers=4, global_batch=8)
    (node,) = doc["nodes"]
    doc["nodes"] = [dict(node, count=1, name=f"n{i}", intra_latency=lat) for i, lat in enumerate((latency, 0.0))]
    doc["search"].update(tp=[2], idle=False)
    doc["profiles"] = []  # estimated: a measured tp-2 time already holds its node's latency
    inst = parse_instance(doc)
    return inst, brute_force(inst)


@pytest.mark.parametrize("solver, placement", [("enumerate", "free"), ("cpsat", "free"), ("cbc", "free"),
                                               ("highs", "free"), ("enumerate", "rank-order"), ("cpsat", "rank-order")])
def test_every_search_prices_the_tp_allreduces_at_their_own_node_s_latency(solver, placement):
    """H2 with H19: a tp group's allreduces pay its own node's latency per ring step; every search
    equals the brute force when the nodes differ only in that."""
    from amp_opt import solve

    inst, truth = _tp_latency(5e-3)
    assert truth.value > _tp_latency(0.0)[1].value * 1.01  # the latency matters here
    result = solve(inst, solver=solver, placement=placement)
    _priced_in_full(result)
    assert result.best.predicted_time == pytest.approx(truth.value, rel=1e-7)


@pytest.mark.parametrize("solver", ["enumerate", "cpsat", "highs"])
def test_stages_over_nodes_that_differ_only_in_their_tp_latency_are_priced_apart(solver):
    """Four nodes of two GPUs, tp 2, at most two stages (so each stage spans two nodes), the second
    node's tp links slow per message: a stage with that node and one without are different kinds
    of stage; a search that keys a stage's compute by device type and bandwidth alone merges them
    (the free-grouping walk did, and returned a slower plan than the brute force's)."""
    from amp_opt import solve
    from amp_opt.bench.brute import brute_force

    doc = generate_instance(11, nodes=4, devices_per_node=2, device_types=1, layers=4, global_batch=8)
    (node,) = doc["nodes"]
    doc["nodes"] = [dict(node, count=1, name=f"n{i}", intra_latency=lat) for i, lat in enumerate((0.0, 5e-3, 0.0, 0.0))]
    doc["search"].update(tp=[2], idle=False, micro_batches=[1], recompute=["none"], zero_stages=[0],
                         sequence_parallel=[False], virtual_stages=[1], max_pp=2)
    doc["profiles"] = []  # estimated, so that the tp links' latency is priced
    inst = parse_instance(doc)
    truth = brute_force(inst)
    result = solve(inst, solver=solver)
    _priced_in_full(result)
    assert result.best.predicted_time == pytest.approx(truth.value, rel=1e-7)


def test_every_free_grouping_path_prices_as_the_evaluator_when_latencies_differ():
    """Six one-GPU nodes of one type whose node links differ only in latency (two of them 5 ms per
    message): a pipeline of 3 stages of 2 replicas reaches the same groups left after stage 1 with
    that stage on the slow or on the fast nodes, and the next boundary's latency tells them apart.
    Every path of the free-grouping graph, in increasing value, is the evaluator's price of its
    plan (a state key that forgot the previous stage's latency merges them and misprices one)."""
    from itertools import islice

    from amp_opt.model.candidates import candidates
    from amp_opt.model.costs.hetero import HETERO
    from amp_opt.model.tables import Tables
    from amp_opt.search.free_grouping import candidate_graph
    from amp_opt.search.kbest import k_best_paths

    doc = generate_instance(5, nodes=6, devices_per_node=1, device_types=1, layers=5, global_batch=8)
    (entry,) = doc["nodes"]
    doc["nodes"] = [dict(entry, name=f"n{j}", count=2, intra_latency=0.0, inter_latency=5e-3 if j == 1 else 0.0)
                    for j in range(3)]
    doc["search"].update(tp=[1], micro_batches=[1], recompute=["none"], zero_stages=[0], idle=False)
    inst = parse_instance(doc)
    cand = next(c for c in candidates(inst) if (c.dp, c.pp, c.cp) == (2, 3, 1))
    graph, to_plan = candidate_graph(Tables(inst), cand, HETERO, "free")
    paths = list(islice(k_best_paths(graph), 300))
    assert len(paths) > 20
    for value, path in paths:
        assert value == pytest.approx(evaluate(inst, to_plan(path)).predicted_time, rel=1e-9)
