"""Estimates anchored on measurements (formulations/hetero.md, eq. A1-A4): what a device type's
profiles measured carries over to the tp degrees and micro-batches it did not measure; the
datasheet peak is the fallback only where nothing was measured on the device type."""


import pytest

from amp_opt import evaluate, parse_plan
from amp_opt.errors import InputError
from amp_opt.model.load import parse_instance
from amp_opt.model.profiles import layer_times
from amp_opt.model.tables import Tables

INTRA = 1e9  # bytes/s
FLOPS, COMM = 1e7, 4e4  # per layer per sample
T1 = [0.004, 0.005, 0.006, 0.003]  # measured tp 1, micro-batch 1
T2 = [0.006, 0.008, 0.010, 0.005]  # measured tp 1, micro-batch 2 (a sublinear batch curve)


def doc(profiles=None, **device):
    layers = [{"name": f"l{i}", "params": 1000, "activation_bytes": 100, "flops": FLOPS, "tp_comm_bytes": COMM}
              for i in range(4)]
    return {
        "version": 1, "name": "anchored", "model": {"layers": layers},
        "device_types": [{"name": "cpu", "memory": "8 GiB", "peak_flops": 5e10, **device},
                         {"name": "new", "memory": "8 GiB", "peak_flops": 5e10}],
        "nodes": [{"name": "a", "device_type": "cpu", "devices": 4, "intra_bandwidth": INTRA, "inter_bandwidth": 1e8},
                  {"name": "b", "device_type": "new", "devices": 4, "intra_bandwidth": INTRA, "inter_bandwidth": 1e8}],
        "profiles": profiles if profiles is not None else [
            {"device_type": "cpu", "tp": 1, "micro_batch": 1, "layer_times": T1},
            {"device_type": "cpu", "tp": 1, "micro_batch": 2, "layer_times": T2}],
        "training": {"global_batch": 8},
        "search": {"tp": [1, 2, 4], "micro_batches": [1, 2, 4]},
    }


def comm(tp, b):
    return 2 * (tp - 1) / tp * b * COMM / INTRA


def test_tp2_from_a_tp1_profile_keeps_the_measured_efficiency():
    """The CPU repro: tp 1 measured only; tp 2 is the measured compute halved plus the tp allreduce,
    not FLOPs at 40% of the peak (which would be 100 x faster here)."""
    inst = parse_instance(doc())
    t = layer_times(inst, "cpu", INTRA, 2, 1)
    assert t.source == "derived" and not t.estimated
    assert t.seconds == pytest.approx([x / 2 + comm(2, 1) for x in T1])
    datasheet = FLOPS / (2 * 5e10 * 0.4) + comm(2, 1)
    assert all(s > 5 * datasheet for s in t.seconds)


def test_an_unmeasured_micro_batch_follows_the_measured_batch_curve_at_every_tp():
    inst = parse_instance(doc())
    assert layer_times(inst, "cpu", INTRA, 1, 2).source == "measured"
    mid = layer_times(inst, "cpu", INTRA, 1, 3)  # beyond the measured 2: per sample from b = 2
    assert mid.source == "derived" and mid.seconds == pytest.approx([1.5 * x for x in T2])
    tp2 = layer_times(inst, "cpu", INTRA, 2, 2)  # the tp-1 curve at b = 2, not 2 x the b = 1 time
    assert tp2.seconds == pytest.approx([x / 2 + comm(2, 2) for x in T2])


def test_two_measured_degrees_set_the_tp_scaling():
    """tp 1 and 2 measured: tp 4 extends the measured loss of efficiency (a power law in tp), and
    the compute of a measured degree is its time less its own tp allreduce."""
    t2 = [x * 1.2 / 2 + comm(2, 1) for x in T1]  # 20% more device-seconds at tp 2 than at tp 1
    profiles = [{"device_type": "cpu", "tp": 1, "micro_batch": 1, "layer_times": T1},
                {"device_type": "cpu", "tp": 2, "micro_batch": 1, "layer_times": t2}]
    inst = parse_instance(doc(profiles))
    t4 = layer_times(inst, "cpu", INTRA, 4, 1)
    assert t4.source == "derived"
    assert t4.seconds == pytest.approx([x * 1.2 ** 2 / 4 + comm(4, 1) for x in T1])
    # Between two measured degrees (1 and 4 measured, 2 asked): the geometric mean of their device-seconds.
    t4_measured = [x * 1.44 / 4 + comm(4, 1) for x in T1]
    profiles[1] = {"device_type": "cpu", "tp": 4, "micro_batch": 1, "layer_times": t4_measured}
    inst = parse_instance(doc(profiles))
    assert layer_times(inst, "cpu", INTRA, 2, 1).seconds == pytest.approx([x * 1.2 / 2 + comm(2, 1) for x in T1])


def test_efficiency_is_never_extrapolated_upward():
    """tp 2 measured faster than half of tp 1 (a cache effect): tp 4 keeps tp 2's efficiency."""
    t2 = [x / 2 * 0.8 + comm(2, 1) for x in T1]
    profiles = [{"device_type": "cpu", "tp": 1, "micro_batch": 1, "layer_times": T1},
                {"device_type": "cpu", "tp": 2, "micro_batch": 1, "layer_times": t2}]
    inst = parse_instance(doc(profiles))
    assert layer_times(inst, "cpu", INTRA, 4, 1).seconds == pytest.approx([x * 0.8 / 4 + comm(4, 1) for x in T1])


def test_the_datasheet_only_where_nothing_was_measured_on_the_device_type():
    inst = parse_instance(doc())
    t = layer_times(inst, "new", INTRA, 2, 1)
    assert t.source == "datasheet" and t.estimated
    assert t.seconds == pytest.approx([FLOPS / (2 * 5e10 * 0.4) + comm(2, 1)] * 4)
    # Without FLOPs a measured device type is still priced at any tp; an unmeasured one cannot be.
    d = doc()
    for layer in d["model"]["layers"]:
        del layer["flops"]
    inst = parse_instance(d)
    assert layer_times(inst, "cpu", INTRA, 4, 1).source == "derived"
    with pytest.raises(InputError, match="no measured profile for device type 'new'"):
        layer_times(inst, "new", INTRA, 1, 1)


def test_calibration_scales_derived_times_once():
    d = doc()
    d["calibration"] = {"device_types": {"cpu": {"compute_scale": 2.0}}}
    inst = parse_instance(d)
    assert layer_times(inst, "cpu", INTRA, 2, 1).seconds == pytest.approx([2 * (x / 2 + comm(2, 1)) for x in T1])


def plan(tp, b, devices):
    stages = [[list(range(devices[0], devices[0] + tp))], [list(range(devices[1], devices[1] + tp))]]
    return parse_plan({"tp": tp, "dp": 1, "pp": 2, "micro_batch": b, "partition": [0, 2, 4], "stages": stages})


@pytest.mark.parametrize("tp, b, devices, sources", [
    (1, 1, (0, 1), ["measured", "measured"]),
    (2, 1, (0, 2), ["derived", "derived"]),
    (1, 4, (0, 1), ["derived", "derived"]),
    (1, 1, (0, 4), ["measured", "datasheet"]),
])
def test_evaluate_says_where_each_stage_times_come_from(tp, b, devices, sources):
    inst = parse_instance(doc())
    ev = evaluate(inst, plan(tp, b, devices))
    assert [s.compute_source for s in ev.stages] == sources
    assert [s["compute_source"] for s in ev.to_json(inst)["stages"]] == sources
    assert any("datasheet" in n for n in ev.notes) == ("datasheet" in sources)
    assert any("derived from measurements" in n for n in ev.notes) == ("derived" in sources)


def test_a_stage_over_two_device_types_reports_the_least_measured():
    inst = parse_instance(doc())
    p = parse_plan({"tp": 1, "dp": 2, "pp": 2, "micro_batch": 1, "partition": [0, 2, 4],
                    "stages": [[[0], [4]], [[1], [2]]]})
    ev = evaluate(inst, p)
    assert [s.compute_source for s in ev.stages] == ["datasheet", "measured"]


def test_fully_profiled_paper_instances_are_all_measured():
    from amp_opt import load_instance

    inst = load_instance("instances/amp_het_cluster.json")
    tables = Tables(inst)
    for t in inst.device_types:
        for tp in (1, 2, 4):
            assert tables.layer_times(t, inst.nodes[0].intra_bandwidth, tp, 1).source == "measured"


def test_the_text_report_names_the_source(tmp_path, capsys):
    import json

    from amp_opt.commands.cli import main

    (tmp_path / "inst.json").write_text(json.dumps(doc()))
    (tmp_path / "plan.json").write_text(json.dumps({"tp": 2, "dp": 1, "pp": 2, "micro_batch": 1,
                                                    "partition": [0, 2, 4], "stages": [[[0, 1]], [[4, 5]]]}))
    assert main(["evaluate", str(tmp_path / "inst.json"), str(tmp_path / "plan.json")]) == 0
    table = capsys.readouterr().out
    header = next(line for line in table.splitlines() if "compute ms" in line)
    assert header.split()[-1] == "times" and "derived" in table and "datasheet" in table


def test_a_fully_measured_plan_keeps_the_plain_table(tmp_path, capsys):
    import json

    from amp_opt.commands.cli import main

    (tmp_path / "inst.json").write_text(json.dumps(doc()))
    (tmp_path / "plan.json").write_text(json.dumps({"tp": 1, "dp": 1, "pp": 2, "micro_batch": 1,
                                                    "partition": [0, 2, 4]}))
    assert main(["evaluate", str(tmp_path / "inst.json"), str(tmp_path / "plan.json")]) == 0
    header = next(line for line in capsys.readouterr().out.splitlines() if "compute ms" in line)
    assert header.split()[-1] == "GiB" and "measured" not in header


ALPHA = 2e-4  # seconds per message of the tp group's link (H19)


def test_each_tp_allreduce_pays_its_ring_steps_latency():
    """H2, A2-A3 with H19: every allreduce of a layer (``tp_comm_messages``) pays 2 (tp-1) ring steps
    at the link's latency; a measured time is kept as measured, and the compute part of a measured
    tp > 1 time is its time less its own bytes and steps."""
    inst = parse_instance(doc())
    assert [layer.tp_comm_messages for layer in inst.layers] == [1] * 4  # bytes, no kind: one message
    steps = 2 * ALPHA  # tp 2: 2 (tp-1) steps of ALPHA per allreduce
    assert layer_times(inst, "cpu", INTRA, 1, 1, latency=ALPHA).seconds == pytest.approx(T1)
    assert layer_times(inst, "cpu", INTRA, 2, 1, latency=ALPHA).seconds == pytest.approx(
        [x / 2 + comm(2, 1) + steps for x in T1])
    datasheet = FLOPS / (4 * 5e10 * 0.4) + comm(4, 1)
    assert layer_times(inst, "new", INTRA, 4, 1, latency=ALPHA).seconds == pytest.approx([datasheet + 6 * ALPHA] * 4)
    t2 = [x / 2 + comm(2, 1) + steps for x in T1]  # measured at tp 2 on a link of latency ALPHA
    measured = parse_instance(doc([{"device_type": "cpu", "tp": 2, "micro_batch": 1, "layer_times": t2}]))
    assert layer_times(measured, "cpu", INTRA, 4, 1, latency=ALPHA).seconds == pytest.approx(
        [x / 4 + comm(4, 1) + 6 * ALPHA for x in T1])
    assert layer_times(measured, "cpu", INTRA, 2, 1, latency=ALPHA).seconds == pytest.approx(t2)


def test_a_layer_says_how_many_allreduces_it_runs():
    d = doc()
    d["model"]["layers"][0]["kind"] = "transformer"  # Megatron's two forward, two backward
    d["model"]["layers"][1]["tp_comm_messages"] = 3
    d["model"]["layers"][2]["tp_comm_bytes"] = 0  # sends nothing: no message
    assert [layer.tp_comm_messages for layer in parse_instance(d).layers] == [4, 3, 0, 1]


def test_evaluate_prices_the_tp_allreduces_latency_on_the_group_s_node():
    """The same plan on nodes whose links differ only in latency: each tp-2 stage's compute per
    micro-batch grows by its layers' messages times 2 (tp-1) steps of its own node's latency."""
    base = evaluate(parse_instance(doc()), plan(2, 1, (0, 4)))
    d = doc()
    d["nodes"][0]["intra_latency"], d["nodes"][1]["intra_latency"] = ALPHA, 3 * ALPHA
    slow = evaluate(parse_instance(d), plan(2, 1, (0, 4)))
    added = [s.compute - b.compute for s, b in zip(slow.stages, base.stages)]
    assert added == pytest.approx([2 * 2 * ALPHA, 2 * 2 * 3 * ALPHA])  # 2 layers, one message each, 2 steps


@pytest.mark.parametrize("bad", [-1, 2.5, "four"])
def test_a_bad_message_count_is_refused_naming_the_field(bad):
    d = doc()
    d["model"]["layers"][1]["tp_comm_messages"] = bad
    with pytest.raises(InputError, match=r"instance\.model\.layers\[1\]\.tp_comm_messages"):
        parse_instance(d)
