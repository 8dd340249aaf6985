"""``solve(top_k=K)`` lists the K best distinct plans: equal, value by value, to the brute force's
(amp_opt.bench.brute.brute_top, written apart from the search) on random tiny instances."""

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from amp_opt import InfeasibleError, solve
from amp_opt.bench.brute import brute_top
from tests.test_brute import REL, cases, tiny


def listed(inst, k, objective="time", solver="enumerate"):
    try:
        result = solve(inst, solver=solver, top_k=k, objective=objective)
    except InfeasibleError:
        return [], None
    values = [ev.cost if objective == "cost" else ev.predicted_time for ev in result.top]
    return values, result


def check_top(inst, k, objective="time", solver="enumerate"):
    truth = brute_top(inst, k, objective=objective)
    values, result = listed(inst, k, objective, solver)
    assert values == pytest.approx(truth, rel=REL), (values, truth)
    if result is not None:
        assert result.solver.status == "OPTIMAL"
        assert "--top-k" not in (result.solver.within or "")  # no part of the space listed one plan per candidate
        assert len({str(ev.plan.to_json()) for ev in result.top}) == len(values)  # distinct plans




@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases, k=st.integers(2, 6), objective=st.sampled_from(["time", "cost"]))
def test_the_k_best_plans_equal_the_brute_forces(case, k, objective):
    check_top(tiny(**case), k, objective)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases, k=st.integers(2, 12), objective=st.sampled_from(["time", "cost"]))
def test_the_k_best_plans_equal_the_brute_forces_slow(case, k, objective):
    check_top(tiny(**case), k, objective)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases, k=st.integers(2, 6), objective=st.sampled_from(["time", "cost"]),
       solver=st.sampled_from(["cpsat", "cbc", "highs"]))
@example(case={"seed": 0, "devices": 2, "layers": 3, "engine": "megatron", "idle": False}, k=2, objective="time",
         solver="cpsat")  # two plans tie at the best value: a candidate's own plan must not cut it off
def test_the_mip_solvers_list_the_k_best_plans_too(case, k, objective, solver):
    """On the MIP path the candidates the enumerator can walk are listed exactly (search/mip/listing.py)."""
    check_top(tiny(**case), k, objective, solver)


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases, k=st.integers(2, 12), objective=st.sampled_from(["time", "cost"]),
       solver=st.sampled_from(["cpsat", "cbc", "highs"]))
def test_the_mip_solvers_list_the_k_best_plans_too_slow(case, k, objective, solver):
    check_top(tiny(**case), k, objective, solver)


def test_a_candidate_too_large_to_list_is_named(monkeypatch):
    """With no candidate small enough to list, the programs give one plan per candidate: the
    result says so whenever that may miss a plan, and is the K best whenever it does not."""
    from amp_opt.search.mip import listing
    monkeypatch.setattr(listing, "MAX_TRANSITIONS", 0)
    named = 0
    for seed in range(6):
        inst = tiny(seed * 5 + 2, devices=3, layers=4, engine="megatron", idle=False)
        truth = brute_top(inst, 4)
        values, result = listed(inst, 4, solver="cpsat")
        if result is None:
            continue
        if result.solver.within is not None:
            assert "too large to list" in result.solver.within
            named += 1
        else:
            assert values == pytest.approx(truth, rel=REL)
    assert named > 0


def _block_instance(seed):
    from amp_opt import parse_instance
    from amp_opt.model.generate import generate_instance
    doc = generate_instance(seed, nodes=3, devices_per_node=1, device_types=2, layers=4, global_batch=4)
    doc["search"].update({"micro_batches": [1, 2], "recompute": ["none", "full"], "recompute_layers": [1, 2], "idle": True})
    return parse_instance(doc)


def test_a_block_count_that_covers_every_stage_is_plain_full_recomputation():
    check_top(_block_instance(9), 8)  # its 6th plan is listed once, not as full and as 2 layers


def _first_mismatch(instances, k):
    for inst in instances:
        if listed(inst, k)[0] != pytest.approx(brute_top(inst, k), rel=REL):
            return inst
    return None


def test_a_definition_without_its_rules_is_caught(monkeypatch):
    """The checks can fail: a brute force that keeps dominated plans, or tells apart plans that
    differ only by interchangeable devices or by how they write the same recomputation, disagrees."""
    from amp_opt.bench import brute
    insts = [tiny(s * 7 + 1, devices=3, layers=4, engine="megatron", idle=True) for s in range(3)]
    with monkeypatch.context() as m:
        m.setattr(brute, "_replacements", lambda inst, doc: iter(()))
        assert _first_mismatch(insts, 6) is not None
    with monkeypatch.context() as m:
        m.setattr(brute, "_symmetries", lambda inst: [{d: d for d in range(inst.num_devices)}])
        assert _first_mismatch(insts, 6) is not None
    original = brute._identity
    with monkeypatch.context() as m:
        m.setattr(brute, "_identity", lambda inst, doc, sym: original(inst, doc, sym) + str(doc.get("recompute_layers")))
        assert _first_mismatch([_block_instance(9)], 8) is not None
