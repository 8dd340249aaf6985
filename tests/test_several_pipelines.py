"""P1 (formulations/exactness.md, X6): a plan of several pipelines is no faster than its slowest
pipeline alone, and ``solve --pipelines bound`` rules such plans out with it."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import amp_opt
from amp_opt import parse_instance, parse_plan, solve
from amp_opt.bench.brute import brute_force_pipelines, pipeline_plans
from amp_opt.errors import InputError
from amp_opt.model.generate import generate_instance
from amp_opt.search.uneven import ONE_PIPELINE

REL = 1e-9


def tiny(seed, *, devices=2, layers=3, batch=4, overlap=False, latency=(0.0, 0.0), idle=True):
    """Single-GPU nodes of two types, engine amp_opt, a few settings open."""
    doc = generate_instance(seed, nodes=devices, devices_per_node=1, device_types=2, layers=layers,
                            global_batch=batch)
    doc["search"].update({"engine": "amp_opt", "micro_batches": [1, 2, 4], "recompute": ["none", "full"],
                          "zero_stages": [0], "sequence_parallel": [False], "virtual_stages": [1], "idle": idle})
    doc["training"]["overlap_grad_reduce"] = overlap
    for node in doc["nodes"]:
        node["intra_latency"], node["inter_latency"] = latency
    return parse_instance(doc)


def at_batch(instance, samples):
    return dataclasses.replace(instance, training=dataclasses.replace(instance.training, global_batch=samples))


def alone(instance, doc, samples):
    """Pipeline ``doc`` as a plan of one pipeline on its samples (None when refused)."""
    plain = {k: v for k, v in doc.items() if k != "micro_batches"}
    try:
        return amp_opt.evaluate(at_batch(instance, samples), parse_plan(plain)).predicted_time
    except InputError:
        return None


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**31 - 1), overlap=st.booleans(),
       latency=st.sampled_from([(0.0, 0.0), (2e-4, 1e-3), (1e-3, 1e-3)]), pick=st.randoms(use_true_random=False))
def test_p1_a_plan_of_two_pipelines_is_no_faster_than_its_slowest_pipeline_alone(seed, overlap, latency, pick):
    inst = tiny(seed, devices=3, overlap=overlap, latency=latency)
    second = pipeline_plans(inst, 3)
    pairs = [(a, b) for ua, a in pipeline_plans(inst, 1) for ub, b in second if not ua & ub]
    checked = 0
    for a, b in pick.sample(pairs, 30):
        try:
            ev = amp_opt.evaluate(inst, parse_plan({"pipelines": [a, b]}))
        except InputError:
            continue
        ta, tb = alone(inst, a, 1), alone(inst, b, 3)
        assert ta is not None and tb is not None  # U6 refuses what a plan of one pipeline refuses
        assert ev.predicted_time >= max(ta, tb) * (1 - 1e-12)
        checked += 1
    assert checked  # three devices, one and two of them: disjoint pairs exist


def test_p1_one_percent_stronger_is_wrong():
    """Two pipelines on two GPUs of one type with a near-free link are within 1% of their
    slowest pipeline alone: a bound 1% above P1's would cut a plan that reaches it."""
    doc = generate_instance(0, nodes=2, devices_per_node=1, device_types=1, layers=3, global_batch=4)
    doc["search"]["engine"] = "amp_opt"
    for node in doc["nodes"]:
        node["intra_bandwidth"] = node["inter_bandwidth"] = 1e15
    inst = parse_instance(doc)
    one = {"tp": 1, "dp": 1, "pp": 1, "micro_batch": 1, "partition": [0, inst.num_layers]}
    plan = {"pipelines": [dict(one, stages=[[[0]]], micro_batches=2), dict(one, stages=[[[1]]], micro_batches=2)]}
    joint = amp_opt.evaluate(inst, parse_plan(plan)).predicted_time
    slowest = alone(inst, dict(one, stages=[[[0]]]), 2)
    assert slowest <= joint < slowest * 1.01


def check_ruled_out(inst, pipelines=2):
    result = solve(inst, pipelines="bound")
    proof = result.solver.extra["pipelines"]
    best = brute_force_pipelines(inst, pipelines=pipelines)
    value = result.best.predicted_time
    if proof["ruled_out"]:
        assert best is None or best.value >= value * (1 - REL), "P1 ruled out a faster plan of several pipelines"
        assert ONE_PIPELINE not in (result.solver.within or "")
    else:
        assert ONE_PIPELINE in result.solver.within
        assert proof["why"] is not None or proof["split_below"] < value
    return proof


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**31 - 1), layers=st.integers(3, 4), batch=st.sampled_from([2, 4]),
       idle=st.booleans(), overlap=st.booleans())
def test_a_result_that_rules_out_several_pipelines_beats_every_plan_of_two(seed, layers, batch, idle, overlap):
    try:
        check_ruled_out(tiny(seed, layers=layers, batch=batch, idle=idle, overlap=overlap))
    except amp_opt.InfeasibleError:
        pass


def test_the_bound_rules_out_some_and_not_others():
    """Not vacuous: on these seeds P1 proves the one-pipeline plan best over every plan, and on
    seed 2 the split of one GPU each comes below it (and a plan of two pipelines is slower still)."""
    assert check_ruled_out(tiny(0))["ruled_out"]
    assert check_ruled_out(tiny(4))["ruled_out"]
    proof = check_ruled_out(tiny(2))
    assert not proof["ruled_out"] and proof["why"] is None


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**31 - 1), idle=st.booleans())
def test_three_gpus_against_every_plan_of_two_and_three_pipelines(seed, idle):
    inst = tiny(seed, devices=3, batch=4, idle=idle)
    try:
        check_ruled_out(inst, pipelines=2)
        check_ruled_out(inst, pipelines=3)
    except amp_opt.InfeasibleError:
        pass


class _Solved:
    """A sub-cluster's search result as P1 reads it: a proven bound over its whole space."""

    def __init__(self, bound):
        self.solver = dataclasses.make_dataclass("S", ["within", "bound"])(None, bound)


def test_the_recursion_rules_out_exactly_at_the_least_split():
    """Sub-clusters whose optimum is samples squared / devices: on three single-GPU nodes and 6
    samples the least split is three pipelines of one GPU and 2 samples each, 4 (two pipelines reach
    8 at best), so P1 rules out a plan of 4 and not one of 4.04 (a bound 1% stronger would, and so
    would a recursion that stopped at two pipelines)."""
    from amp_opt.search.clock import Clock
    from amp_opt.search.several_pipelines import pipelines_bound

    doc = generate_instance(0, nodes=3, devices_per_node=1, device_types=1, layers=3, global_batch=6)
    doc["search"].update({"engine": "amp_opt", "idle": True})
    inst = parse_instance(doc)
    asked = []

    def sub_solve(sub, clock):
        asked.append((sub.num_devices, sub.training.global_batch))
        return _Solved(sub.training.global_batch ** 2 / sub.num_devices)

    options = amp_opt.search.options.solve_options()
    assert pipelines_bound(inst, options, 4.0, sub_solve, Clock.of(None)).ruled_out
    assert len(set(asked)) == len(asked)  # each sub-cluster and batch solved once per bound
    asked.clear()
    above = pipelines_bound(inst, options, 4.04, sub_solve, Clock.of(None))
    assert not above.ruled_out and above.split_below == pytest.approx(4.0)


def test_an_infeasible_verdict_says_whether_several_pipelines_fit():
    """Seed 1 on two GPUs: no plan of one pipeline fits; the default says plans of several pipelines
    were not searched, the bound proves none fits either (the brute force over them agrees)."""
    inst = tiny(1)
    with pytest.raises(amp_opt.InfeasibleError, match="plans of several pipelines are not searched"):
        solve(inst)
    with pytest.raises(amp_opt.InfeasibleError, match="nor does any plan of several pipelines"):
        solve(inst, pipelines="bound")
    assert brute_force_pipelines(inst) is None


def test_what_p1_does_not_try_says_why():
    inst = tiny(0)
    cost = solve(inst, pipelines="bound", objective="cost").solver
    assert not cost.extra["pipelines"]["ruled_out"] and "cost objective" in cost.extra["pipelines"]["why"]
    assert ONE_PIPELINE in cost.within
    slow_intra = solve(tiny(0, latency=(1e-3, 0.0)), pipelines="bound").solver.extra["pipelines"]
    assert "latency" in slow_intra["why"]
    ranked = solve(inst, pipelines="bound", placement="rank-order").solver.extra["pipelines"]
    assert "rank-order" in ranked["why"]
    assert "pipelines" not in solve(inst).solver.extra  # skip: the default
    with pytest.raises(InputError, match="--pipelines"):
        solve(inst, pipelines="all")
