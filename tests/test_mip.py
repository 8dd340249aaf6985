"""The MIPs equal the enumerator: same optimum, same verdict, and each plan re-scores to its objective."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amp_opt import InfeasibleError, parse_instance, solve
from amp_opt.model.generate import generate_instance

# CP-SAT counts time in units of ~1e-8 of the plan time and rounds each coefficient;
# with at most (n+1)*L + p rounded terms on the objective's path that is well under 1e-5.
REL = 1e-5


def outcome(instance, solver, **kw):
    try:
        return solve(instance, solver=solver, **kw)
    except InfeasibleError:
        return None


def check_agreement(instance, cost_model="hetero", placement=None):
    found = {s: outcome(instance, s, cost_model=cost_model, placement=placement) for s in ("enumerate", "cpsat", "cbc")}
    verdicts = {s: r is not None for s, r in found.items()}
    assert len(set(verdicts.values())) == 1, verdicts
    if found["enumerate"] is None:
        return None
    ref = found["enumerate"].best.predicted_time
    for name, result in found.items():
        assert result.solver.status == "OPTIMAL", name
        assert result.best.feasible
        assert result.best.predicted_time == pytest.approx(ref, rel=REL), name
        # The solver's own objective is the evaluator's score of the plan it returns.
        assert result.solver.objective == pytest.approx(result.best.predicted_time, rel=REL), name
        assert result.solver.gap <= REL
    return ref


@pytest.mark.parametrize("name", ["amp_homogeneous", "amp_het_cluster", "amp_het_model"])
@pytest.mark.parametrize("cost_model, placement", [("amp", "rank-order"), ("hetero", "rank-order"), ("hetero", "free")])
def test_paper_instances_all_solvers_agree(paper_instances, name, cost_model, placement):
    exp = {"amp_homogeneous": "homogeneous", "amp_het_cluster": "het_cluster", "amp_het_model": "het_model"}[name]
    if name == "amp_het_cluster" and placement == "free":
        pytest.skip("CBC needs ~50 s here; covered by the slow test below")
    assert check_agreement(paper_instances[exp], cost_model, placement) is not None


@pytest.mark.slow
def test_het_cluster_free_grouping_all_solvers_agree(paper_instances):
    assert check_agreement(paper_instances["het_cluster"], "hetero", "free") is not None


def small_instance(seed, nodes, devices, types, layers):
    return parse_instance(generate_instance(seed, nodes=nodes, devices_per_node=devices, device_types=min(types, nodes),
                                            layers=layers, global_batch=8))


instances = st.builds(small_instance, seed=st.integers(0, 10**6), nodes=st.integers(2, 3),
                      devices=st.sampled_from([1, 2, 4]), types=st.integers(2, 3), layers=st.integers(5, 10))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instance=instances)
def test_random_instances_all_solvers_agree(instance):
    check_agreement(instance)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instance=instances)
def test_random_instances_amp_model_agree(instance):
    check_agreement(instance, "amp", "rank-order")


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instance=instances)
def test_random_instances_all_solvers_agree_long(instance):
    check_agreement(instance)


def test_infeasible_instance_same_verdict():
    """Shrink memory until nothing fits: every solver says infeasible (exit 3 in the CLI)."""
    doc = generate_instance(3, nodes=2, devices_per_node=2, device_types=2, layers=6, global_batch=8)
    doc["device_types"] = [{"name": t["name"], "memory": "1.01 GiB"} for t in doc["device_types"]]
    inst = parse_instance(doc)
    for solver in ("enumerate", "cpsat", "cbc"):
        with pytest.raises(InfeasibleError, match="GiB"):
            solve(inst, solver=solver)


def test_time_limit_returns_best_found_with_gap(paper_instances):
    result = solve(paper_instances["het_cluster"], solver="cbc", time_limit=2.0)
    assert result.solver.status in ("OPTIMAL", "FEASIBLE")
    assert result.solver.wall_time < 2.0 + 6.0  # CBC is killed 5 s after the limit at worst
    assert result.solver.bound <= result.solver.objective
    assert result.best.feasible


def test_cpsat_is_deterministic(paper_instances):
    inst = paper_instances["het_model"]
    a = solve(inst, solver="cpsat", seed=3)
    b = solve(inst, solver="cpsat", seed=3)
    assert a.best.plan == b.best.plan and a.solver.objective == b.solver.objective


def test_auto_hands_large_free_grouping_to_cpsat():
    """64 GPUs of two types: too many free groupings to enumerate, so auto picks CP-SAT up front."""
    from conftest import INSTANCES

    from amp_opt import InputError, load_instance

    inst = load_instance(INSTANCES / "suite" / "scale" / "s0064-gpt3-2.7b-a100-v100.json")
    with pytest.raises(InputError, match="too large for the enumerator"):
        solve(inst, solver="enumerate")
    result = solve(inst, time_limit=60)
    assert result.solver.name == "cpsat" and "chosen up front" in result.solver.extra["auto"]
    assert result.best.feasible and result.solver.status == "OPTIMAL"
