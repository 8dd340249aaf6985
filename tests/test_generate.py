"""`generate`: valid, deterministic instances that always solve or are reported infeasible with a reason."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amp_opt import InfeasibleError, InputError, parse_instance, solve
from amp_opt.model.generate import generate_instance


def check_one(seed, nodes, devices, types, layers, batch):
    doc = generate_instance(seed, nodes=nodes, devices_per_node=devices, device_types=min(types, nodes), layers=layers,
                            global_batch=batch)
    assert doc == generate_instance(seed, nodes=nodes, devices_per_node=devices, device_types=min(types, nodes),
                                    layers=layers, global_batch=batch)  # deterministic
    inst = parse_instance(json.loads(json.dumps(doc)))  # valid after a JSON round trip
    assert inst.num_devices == nodes * devices and inst.num_layers == layers
    assert len({n.device_type for n in inst.nodes}) == min(types, nodes)
    try:
        result = solve(inst, time_limit=60)
    except InfeasibleError as exc:
        assert str(exc)  # the reason is stated
        return None
    assert result.best.feasible and all(s.fits for s in result.best.stages)
    return result


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), nodes=st.integers(1, 4), devices=st.sampled_from([1, 2, 4]),
       types=st.integers(1, 3), layers=st.integers(3, 12), batch=st.sampled_from([4, 8, 16, 32]))
def test_generated_instances_validate_and_solve_or_explain(seed, nodes, devices, types, layers, batch):
    check_one(seed, nodes, devices, types, layers, batch)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), nodes=st.integers(1, 6), devices=st.sampled_from([1, 2, 4, 8]),
       types=st.integers(1, 4), layers=st.integers(3, 24), batch=st.sampled_from([4, 16, 64]))
def test_generated_instances_many_seeds(seed, nodes, devices, types, layers, batch):
    check_one(seed, nodes, devices, types, layers, batch)


def test_some_seeds_are_infeasible_and_some_bind_memory():
    verdicts = [check_one(seed, 3, 2, 2, 7, 8) is not None for seed in range(30)]
    assert any(verdicts) and not all(verdicts)


def test_large_cluster_instance_builds_quickly():
    doc = generate_instance(1, nodes=128, devices_per_node=8, device_types=4, layers=96)
    inst = parse_instance(doc)
    assert inst.num_devices == 1024 and inst.num_layers == 96
    assert len(json.dumps(doc)) < 200_000  # identical nodes are written once with a count


@pytest.mark.parametrize("kwargs, flag", [({"nodes": 0}, "--nodes"), ({"layers": 2}, "--layers"),
                                          ({"device_types": 5, "nodes": 3}, "--device-types")])
def test_bad_generator_options(kwargs, flag):
    with pytest.raises(InputError, match=flag):
        generate_instance(0, **kwargs)
