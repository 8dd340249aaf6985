"""The hetero cost model term by term, against numbers worked out by hand (formulations/hetero.md)."""

import json
import subprocess
import sys

import pytest

from amp_opt import evaluate, parse_instance, parse_plan, solve
from amp_opt.model.profiles import layer_times
from amp_opt.model.schedule import path_bound, schedule_of

GB = 1e9


def tiny(**training):
    """Two nodes of two devices: GA (fast, 10 GB) on node A, GB (slow, 8 GB) on node B; four equal layers."""
    layer = {"params": 1_000_000, "activation_bytes": 1_000_000, "activation_memory_bytes": 10_000_000}
    return {
        "version": 1,
        "name": "tiny",
        "model": {"layers": [dict(layer, name=f"l{i}") for i in range(4)]},
        "device_types": [{"name": "GA", "memory": 10 * GB, "peak_flops": 1e14},
                         {"name": "GB", "memory": 8 * GB, "peak_flops": 5e13}],
        "nodes": [{"name": "A", "device_type": "GA", "devices": 2, "intra_bandwidth": 100 * GB, "inter_bandwidth": 10 * GB},
                  {"name": "B", "device_type": "GB", "devices": 2, "intra_bandwidth": 50 * GB, "inter_bandwidth": 5 * GB}],
        "profiles": [
            {"device_type": "GA", "tp": 1, "micro_batch": 1, "layer_times": [0.01, 0.02, 0.03, 0.04]},
            {"device_type": "GA", "tp": 1, "micro_batch": 4, "layer_times": [0.03, 0.06, 0.09, 0.12]},
            {"device_type": "GB", "tp": 1, "micro_batch": 1, "layer_times": [0.02, 0.04, 0.06, 0.08]},
        ],
        "training": {"global_batch": 8, "gradient_allreduce_bytes_per_param": 2, "memory_reserve": 1 * GB, **training},
        "search": {"tp": [1], "micro_batches": [1, 2]},
    }


def test_layer_time_interpolation_and_per_sample_extrapolation():
    inst = parse_instance(tiny())
    # micro-batch 2 lies between the measured 1 and 4: weight 1/3 on the b=4 row.
    assert layer_times(inst, "GA", 100 * GB, 1, 2).seconds == pytest.approx([0.05 / 3, 0.1 / 3, 0.05, 0.2 / 3])
    # beyond the largest measurement: per sample from b = 4.
    assert layer_times(inst, "GA", 100 * GB, 1, 8).seconds == pytest.approx([0.06, 0.12, 0.18, 0.24])
    # one measurement only: per sample.
    assert layer_times(inst, "GB", 50 * GB, 1, 2).seconds == pytest.approx([0.04, 0.08, 0.12, 0.16])
    assert not layer_times(inst, "GB", 50 * GB, 1, 2).estimated


def test_analytic_fallback_formula():
    doc = tiny()
    for layer in doc["model"]["layers"]:
        layer.update(flops=1e12, tp_comm_bytes=1e8)
    doc["profiles"] = [p for p in doc["profiles"] if p["device_type"] != "GA"]
    inst = parse_instance(doc)
    # Nothing measured on GA: b * flops / (tp * peak * 0.4) + 2 (tp-1)/tp * b * comm / intra.
    t = layer_times(inst, "GA", 100 * GB, 2, 1)
    assert t.estimated
    assert t.seconds == pytest.approx([1e12 / (2 * 1e14 * 0.4) + 1e8 / 1e11] * 4)


def test_mixed_stages_straggler_and_slowest_links():
    inst = parse_instance(tiny())
    # dp 2, pp 2, micro-batch 2 -> n = 2; every stage has one GA and one GB replica.
    plan = parse_plan({"tp": 1, "dp": 2, "pp": 2, "micro_batch": 2, "partition": [0, 1, 4],
                       "stages": [[[0], [2]], [[1], [3]]]})
    ev = evaluate(inst, plan, "hetero")
    s0, s1 = ev.stages
    assert s0.compute == pytest.approx(0.04)  # max(GA 0.01667, GB 0.04): the straggler
    assert s1.compute == pytest.approx(0.36)  # GB: 2 * (0.04 + 0.06 + 0.08)
    assert s0.p2p == pytest.approx(2e6 / (5 * GB))  # 2 samples x 1 MB over the slower NIC
    assert s1.p2p == 0
    assert s0.allreduce == pytest.approx(2 * 1 / 2 * 1e6 * 2 / (5 * GB))  # ring over two nodes: slowest NIC
    assert s1.allreduce == pytest.approx(3e6 * 2 / (5 * GB))
    # H13: the last stage weighs n - 1 = 1 (stage 0 weighs 2/3), and the boundary is crossed
    # both ways by the first micro-batch.
    assert ev.predicted_time == pytest.approx(1 * 0.36 + 0.40 + 2 * 4e-4 + 1.2e-3)
    assert ev.breakdown == pytest.approx({"pipeline_bottleneck": 0.36, "stage_compute": 0.40, "p2p": 8e-4,
                                          "allreduce": 1.2e-3})
    # memory: params x 16 B + min(p - s, n) x b x activation memory + reserve
    assert s0.memory == pytest.approx(1e6 * 16 + 2 * 2 * 1e7 + GB)
    assert s1.memory == pytest.approx(3e6 * 16 + 1 * 2 * 3e7 + GB)
    assert s0.capacity == 8 * GB and ev.feasible


def test_intra_node_links_when_stages_share_a_node():
    inst = parse_instance(tiny())
    plan = parse_plan({"tp": 1, "dp": 1, "pp": 4, "micro_batch": 1, "partition": [0, 1, 2, 3, 4]})  # rank order
    ev = evaluate(inst, plan, "hetero")
    assert [s.compute for s in ev.stages] == pytest.approx([0.01, 0.02, 0.06, 0.08])
    # stages 0,1 share node A; 1 -> 2 crosses to B; 2,3 share node B
    assert [s.p2p for s in ev.stages] == pytest.approx([1e6 / (100 * GB), 1e6 / (5 * GB), 1e6 / (50 * GB), 0])
    assert all(s.allreduce == 0 for s in ev.stages)  # dp = 1
    # n = 8: weights 7 - (3, 2, 1, 0) / 3 (H13); the last stage is the slowest and weighs 7.
    assert ev.predicted_time == pytest.approx(7 * 0.08 + 0.17 + 2 * (1e-5 + 2e-4 + 2e-5))
    assert [s.memory for s in ev.stages] == pytest.approx([1.6e7 + k * 1e7 + GB for k in (4, 3, 2, 1)])


def test_a_slow_first_stage_is_weighed_by_its_position_as_the_schedule_runs_it():
    inst = parse_instance(tiny())
    # n = 8; stage 0 (GB, layers 0-2: 0.12 s) is the slowest, stage 1 (GA, layer 3: 0.04 s) last.
    plan = parse_plan({"tp": 1, "dp": 1, "pp": 2, "micro_batch": 1, "partition": [0, 3, 4], "stages": [[[2]], [[0]]]})
    ev = evaluate(inst, plan, "hetero")
    assert [s.compute for s in ev.stages] == pytest.approx([0.12, 0.04])
    p2p = 1e6 / (5 * GB)
    # H13: stage 0 runs its n - 1 backwards and the n - 1 - 1 forwards left after its one warm-up
    # forward on the critical path: (7 - 1/3) x 0.12, not H6's 7 x 0.12.
    assert ev.breakdown["pipeline_bottleneck"] == pytest.approx((7 - 1 / 3) * 0.12)
    assert ev.predicted_time == pytest.approx((7 - 1 / 3) * 0.12 + 0.16 + 2 * p2p)
    # It is the schedule's own lower bound (its b path), and the event simulation ends within 1% of it.
    makespan = schedule_of(inst, ev).makespan
    assert ev.predicted_time == pytest.approx(path_bound([0.12, 0.04], [p2p, 0.0], 8))
    assert ev.predicted_time <= makespan * (1 + 1e-12) and makespan <= 1.01 * ev.predicted_time
    # AMP's closed form charges the whole steady state to the slowest stage wherever it sits.
    assert evaluate(inst, plan, "amp").breakdown["pipeline_bottleneck"] == pytest.approx(
        7 * evaluate(inst, plan, "amp").stages[0].compute)


def test_zero1_divides_optimizer_state_by_dp():
    inst = parse_instance(tiny(zero_stage=1))
    plan = parse_plan({"tp": 1, "dp": 2, "pp": 2, "micro_batch": 2, "partition": [0, 1, 4],
                       "stages": [[[0], [2]], [[1], [3]]]})
    s0 = evaluate(inst, plan, "hetero").stages[0]
    assert s0.memory == pytest.approx(1e6 * (2 + 2 + 12 / 2) + 2 * 2 * 1e7 + GB)


def test_a_stated_gradient_buffer_is_held_by_stages_with_replicas_only():
    """training.gradient_buffer_bytes_per_param (H9): a stage with data-parallel replicas holds it per
    parameter beside its state, whatever its ZeRO stage; a stage without replicas reduces nothing."""
    plan = {"tp": 1, "pp": 2, "micro_batch": 2, "partition": [0, 1, 4]}
    two = parse_plan(dict(plan, dp=2, stages=[[[0], [2]], [[1], [3]]]))
    one = parse_plan(dict(plan, dp=1, micro_batch=1, stages=[[[0]], [[1]]]))
    for zero in (0, 1):
        base, held = (evaluate(parse_instance(tiny(zero_stage=zero, **extra)), two, "hetero").stages[0]
                      for extra in ({}, {"gradient_buffer_bytes_per_param": 4}))
        assert held.memory - base.memory == pytest.approx(4 * 1e6)  # stage 0 holds one layer of 1e6 parameters
    alone, held_alone = (evaluate(parse_instance(tiny(**extra)), one, "hetero").stages[0]
                         for extra in ({}, {"gradient_buffer_bytes_per_param": 4}))
    assert held_alone.memory == pytest.approx(alone.memory)


def test_memory_violation_makes_plan_infeasible_and_names_the_stage():
    doc = tiny()
    doc["device_types"][1]["memory"] = 1.03 * GB  # GB now holds 1.03 GB
    inst = parse_instance(doc)
    ev = evaluate(inst, parse_plan({"tp": 1, "dp": 1, "pp": 4, "micro_batch": 1, "partition": [0, 1, 2, 3, 4]}))
    assert not ev.feasible
    assert [s.fits for s in ev.stages] == [True, True, False, True]  # stage 2 keeps 2 micro-batches
    assert len(ev.violations) == 1 and ev.violations[0].startswith("stage 2 (GB)")
    # the amp model reports the same footprint but does not enforce it
    amp = evaluate(inst, parse_plan({"tp": 1, "dp": 1, "pp": 4, "micro_batch": 1, "partition": [0, 1, 2, 3, 4]}), "amp")
    assert amp.feasible and any("does not enforce memory" in n for n in amp.notes)


def test_solve_never_returns_an_infeasible_plan_and_free_beats_rank_order():
    doc = tiny()
    doc["device_types"][1]["memory"] = 1.03 * GB
    inst = parse_instance(doc)
    free = solve(inst, placement="free")
    ranked = solve(inst, placement="rank-order")
    assert free.best.feasible and ranked.best.feasible
    assert free.best.predicted_time <= ranked.best.predicted_time + 1e-12


def test_infeasible_instance_exit_3_with_reason(tmp_path):
    doc = tiny()
    for t in doc["device_types"]:
        t["memory"] = 1.001 * GB
    path = tmp_path / "tight.json"
    path.write_text(json.dumps(doc))
    out = subprocess.run([sys.executable, "-m", "amp_opt", "solve", str(path)], capture_output=True, text=True)
    assert out.returncode == 3
    assert "needs" in out.stderr and "capacity" in out.stderr and "stage" in out.stderr


@pytest.mark.parametrize("name", ["homogeneous", "het_cluster", "het_model"])
def test_paper_instances_solve_to_memory_feasible_plans(paper_instances, name):
    result = solve(paper_instances[name])
    assert result.best.feasible and all(s.fits for s in result.best.stages)


def test_every_ranked_paper_plan_evaluates_under_hetero(paper_instances, rankings):
    verdicts = []
    for exp, entries in rankings.items():
        for entry in entries:
            plan = parse_plan({k: entry[k] for k in ("tp", "dp", "pp", "micro_batch", "partition")})
            ev = evaluate(paper_instances[exp], plan, "hetero")
            assert ev.predicted_time > 0 and set(ev.breakdown) == {"pipeline_bottleneck", "stage_compute", "p2p",
                                                                   "allreduce"}
            verdicts.append(ev.feasible)
    assert len(verdicts) == 171 and any(verdicts)


def test_free_grouping_at_least_as_good_as_rank_order_on_paper(paper_instances):
    for name in ("homogeneous", "het_model"):
        inst = paper_instances[name]
        assert solve(inst).best.predicted_time <= solve(inst, placement="rank-order").best.predicted_time + 1e-12


def test_a_long_model_is_listed_and_scored_without_tables_over_every_range():
    """With 30,000 layers a table over every range [k, l) would hold 9e8 cells (7 GB): listing the
    candidates and scoring one plan (with full recomputation, whose rebuilt-layer term takes a
    maximum over the stage) must not build one, and must not scan the layers per candidate
    (10^5 layers took minutes before)."""
    from amp_opt.model.candidates import candidates
    from amp_opt.model.generate import generate_instance

    inst = parse_instance(generate_instance(1, nodes=1, devices_per_node=2, device_types=1, layers=30000,
                                            global_batch=4))
    assert candidates(inst)
    ev = evaluate(inst, parse_plan({"tp": 1, "dp": 1, "pp": 2, "micro_batch": 1, "recompute": "full",
                                    "partition": [0, 15000, 30000]}))
    assert ev.predicted_time > 0 and len(ev.stages) == 2


def test_a_long_generated_layer_list_takes_the_fast_schema_check():
    """A layer list of 1000 or more entries is checked by a strict fast test, not item by item by
    jsonschema (0.2 ms a layer: loading 10^5 layers took 32 s, under a 20 s time limit, when the fast test did
    not know the layer fields of flash attention and context parallelism); it keeps every field
    of the schema's layer and still rejects what the schema rejects."""
    from amp_opt.errors import InputError
    from amp_opt.model import load
    from amp_opt.model.generate import generate_instance

    schema = json.loads(load.SCHEMA_PATH.read_text())
    assert load.LAYER_KEYS == set(schema["$defs"]["layer"]["properties"])
    doc = generate_instance(3, nodes=2, devices_per_node=2, device_types=1, layers=2000, global_batch=4)
    assert "kv_bytes" in doc["model"]["layers"][5]
    assert len(load._shortened(doc)["model"]["layers"]) == 1
    doc["model"]["layers"][5]["kv_bytes"] = -1
    with pytest.raises(InputError, match=r"layers\[5\]"):
        parse_instance(doc)
