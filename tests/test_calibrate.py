"""Calibration (formulations/calibration.md): RUNS.json, the fit, never worse, leave-one-out, memory,
the section copied to other instances, and that every solver still optimises the calibrated model."""

import copy
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from amp_opt import InputError, evaluate, parse_instance, parse_plan, solve
from amp_opt.calibrate.fit import fit_calibration
from amp_opt.calibrate.predict import peak_of_stage
from amp_opt.calibrate.metrics import errors, spearman
from amp_opt.calibrate.runs import bind_runs, load_runs, parse_runs
from amp_opt.commands.cli import main
from amp_opt.model.calibration import apply_calibration

MODEL = {"preset": "gpt", "hidden": 128, "layers": 4, "heads": 4, "seq_len": 64, "vocab": 512, "dropout": False,
         "dtype_bytes": 4, "attention": "eager"}
LAYER_TIMES = [1e-4, 2e-3, 2.1e-3, 1.9e-3, 2e-3, 6e-4]  # one micro-batch of 1 sample
TRUTH = {"device_types": {"cpu": {"compute_scale": 1.4, "step_overhead": 0.002, "batch_exponent": 0.8}},
         "links": {"intra": 0.3, "inter": 0.2}}


def document(nodes=2, devices=2, global_batch=16, model=MODEL, name="syn", device_type="cpu"):
    return {"version": 1, "name": name, "model": dict(model),
            "device_types": [{"name": device_type, "memory": "8 GiB", "peak_flops": 1e11}],
            "nodes": [{"name": "host", "count": nodes, "device_type": device_type, "devices": devices,
                       "intra_bandwidth": "200 MB/s", "inter_bandwidth": "100 MB/s"}],
            "profiles": [{"device_type": device_type, "tp": 1, "micro_batch": 1, "layer_times": LAYER_TIMES}],
            "training": {"global_batch": global_batch, "memory_reserve": 0,
                         "model_state_bytes_per_param": {"weights": 4, "gradients": 4, "optimizer": 8},
                         "gradient_allreduce_bytes_per_param": 4}}


def plans():
    """24 plans of the 6-layer model on 2 nodes x 2 devices: pipelines, replicas, both, several sizes."""
    out = []
    for mb in (1, 2, 4):
        for dp, pp, parts in ((1, 2, [[0, 3, 6], [0, 2, 6]]), (2, 1, [[0, 6]]), (4, 1, [[0, 6]]),
                              (2, 2, [[0, 3, 6]]), (1, 4, [[0, 2, 3, 4, 6], [0, 1, 3, 5, 6]])):
            if 16 % (dp * mb) == 0:
                for p in parts:
                    out.append({"tp": 1, "dp": dp, "pp": pp, "micro_batch": mb, "partition": p})
    return out


def timed(instance, section, plan_list, noise=0.0, seed=0):
    truth = apply_calibration(instance, section)
    rng = np.random.default_rng(seed)
    return [{"plan": p, "iteration_time": evaluate(truth, parse_plan(p)).predicted_time * math.exp(rng.normal(0, noise))}
            for p in plan_list] if noise else [{"plan": p, "iteration_time": evaluate(truth, parse_plan(p)).predicted_time}
                                              for p in plan_list]


@pytest.fixture(scope="module")
def base():
    return parse_instance(document())


def fitted(instance, records, **kw):
    return fit_calibration(bind_runs(parse_runs(records), instance), **kw)


@pytest.fixture
def two_instances(tmp_path):
    """Two clusters of the same device type: "one" (one node, returned parsed, with its plans) and
    "two" (two nodes, written to ``tmp_path / "two.json"`` for the runs that name it, with its plans).
    Returns (the instance "one", its plans, the plans run on "two")."""
    (tmp_path / "two.json").write_text(json.dumps(document(nodes=2, devices=2, global_batch=16, name="two")))
    small = parse_instance(document(nodes=1, devices=2, global_batch=8, name="one"))
    local = [{"tp": 1, "dp": dp, "pp": pp, "micro_batch": mb, "partition": part}
             for mb in (1, 2, 4) for dp, pp, part in ((1, 2, [0, 3, 6]), (2, 1, [0, 6]), (1, 2, [0, 2, 6]))]
    remote = [{"tp": 1, "dp": dp, "pp": pp, "micro_batch": mb, "partition": part}
              for mb in (1, 2) for dp, pp, part in ((4, 1, [0, 6]), (2, 2, [0, 3, 6]), (1, 4, [0, 2, 3, 4, 6]))]
    return small, local, remote


# ---------------------------------------------------------------- the time fit

def test_fit_recovers_known_corrections(base):
    all_plans = plans()
    train, held = all_plans[::2] + all_plans[1::4], all_plans[3::4]
    cal = fitted(base, timed(base, TRUTH, train), cv=False)
    values = cal.time.values
    assert set(values) == {"compute_scale[cpu]", "step_overhead[cpu]", "links.intra", "links.inter",
                           "batch_exponent[cpu]"}
    assert values["compute_scale[cpu]"] == pytest.approx(1.4, rel=0.05)
    assert values["step_overhead[cpu]"] == pytest.approx(0.002, rel=0.1)
    assert values["links.intra"] == pytest.approx(0.3, rel=0.1)
    assert values["links.inter"] == pytest.approx(0.2, rel=0.1)
    assert values["batch_exponent[cpu]"] == pytest.approx(0.8, abs=0.03)
    # Plans the fit never saw are predicted as the truth has them.
    truth = timed(base, TRUTH, held)
    model = apply_calibration(base, cal.section)
    for rec in truth:
        assert evaluate(model, parse_plan(rec["plan"])).predicted_time == pytest.approx(rec["iteration_time"], rel=0.02)
    e = cal.time.errors()
    assert e["calibrated"].median_abs_error < 0.01 < e["uncalibrated"].median_abs_error


def test_fit_with_noise_ranks_held_out_plans(base):
    all_plans = plans()
    train, held = all_plans[::2], all_plans[1::2]
    cal = fitted(base, timed(base, TRUTH, train, noise=0.05, seed=1), cv=False)
    truth = timed(base, TRUTH, held)
    model = apply_calibration(base, cal.section)
    predicted = [evaluate(model, parse_plan(r["plan"])).predicted_time for r in truth]
    measured = [r["iteration_time"] for r in truth]
    before = [evaluate(base, parse_plan(r["plan"])).predicted_time for r in truth]
    assert errors(predicted, measured).median_abs_error < 0.05
    assert spearman(predicted, measured) > 0.95 > spearman(before, measured)


def test_few_runs_fit_few_parameters(base):
    cal = fitted(base, timed(base, TRUTH, plans()[:3]), cv=False)
    assert len(cal.time.solution.parameters) <= 2
    cal = fitted(base, timed(base, TRUTH, plans()[:1]), cv=False)
    assert len(cal.time.solution.parameters) == 1


def test_never_worse_in_sample(base):
    # Two runs exact under the uncalibrated model, one 3x slower for no reason the model has:
    # any correction that helps the third hurts the two, so the median may not get worse.
    same = [{"tp": 1, "dp": 1, "pp": 2, "micro_batch": 2, "partition": p} for p in ([0, 3, 6], [0, 2, 6], [0, 4, 6])]
    records = timed(base, {}, same)
    records[2]["iteration_time"] *= 3
    cal = fitted(base, records, cv=False)
    e = cal.time.errors()
    assert e["calibrated"].median_abs_error <= e["uncalibrated"].median_abs_error
    assert e["calibrated"].rms_log_error <= e["uncalibrated"].rms_log_error
    assert cal.time.solution.shrink < 1
    # Random times: whatever the fit does, it is never worse on the runs it was given.
    rng = np.random.default_rng(3)
    records = [dict(r, iteration_time=r["iteration_time"] * math.exp(rng.normal(0, 0.5))) for r in timed(base, {}, plans())]
    e = fitted(base, records, cv=False).time.errors()
    assert e["calibrated"].median_abs_error <= e["uncalibrated"].median_abs_error
    assert e["calibrated"].rms_log_error <= e["uncalibrated"].rms_log_error


def test_cross_validation_holds_each_run_out(base):
    records = timed(base, TRUTH, plans()[:10])
    records[4]["iteration_time"] *= 1.5  # one run off the model
    part = fitted(base, records).time
    assert part.held_out is not None and len(part.held_out) == 10
    rel = [abs(p / m - 1) for p, m in zip(part.held_out, part.measured)]
    inside = [abs(p / m - 1) for p, m in zip(part.after, part.measured)]
    assert rel[4] > inside[4]  # predicted without it, the odd run is further off than when fitted with it
    consistent = fitted(base, timed(base, TRUTH, plans()[:16])).time
    assert errors(consistent.held_out, consistent.measured).median_abs_error < 0.02
    assert fitted(base, records[:2]).time.cv is None  # too few runs to hold any out


def test_fit_is_deterministic(base):
    records = timed(base, TRUTH, plans()[:8], noise=0.05, seed=2)
    a, b = fitted(base, records, cv=False), fitted(base, records, cv=False)
    assert a.section == b.section


def test_joint_fit_across_instances_sharing_a_device_type(tmp_path, base, two_instances):
    """Small runs on one node say nothing about inter-node links; runs on a second instance (two
    nodes, another batch) do.  Both feed one fit through the records' "instance" paths."""
    small, local, remote = two_instances
    records = timed(small, TRUTH, local) + [dict(r, instance="two.json") for r in timed(base, TRUTH, remote)]
    (tmp_path / "RUNS.json").write_text(json.dumps(records))
    runs = bind_runs(load_runs(tmp_path / "RUNS.json"), small)
    assert set(runs.instances) == {None, str(tmp_path / "two.json")}
    cal = fit_calibration(runs, cv=False)
    assert cal.time.values["links.inter"] == pytest.approx(0.2, rel=0.15)
    alone = fitted(small, timed(small, TRUTH, local), cv=False)
    assert "links.inter" not in alone.time.values  # one node: nothing to learn about inter-node links


# ---------------------------------------------------------------- the section applies to any instance with the hardware

def test_section_copied_to_another_instance_calibrates_it_identically(base):
    cal = fitted(base, timed(base, TRUTH, plans()), cv=False)
    section = dict(cal.section, device_types=dict(cal.section["device_types"], **{"H100": {"compute_scale": 9.0}}))
    bigger = document(nodes=4, devices=2, global_batch=32, name="bigger",
                      model=dict(MODEL, layers=4, hidden=128))
    copied = parse_instance(dict(bigger, calibration=section))  # H100 is not in this instance: ignored
    direct = apply_calibration(parse_instance(bigger), cal.section)
    assert copied.device_types == direct.device_types
    assert copied.nodes == direct.nodes and copied.training == direct.training
    # Same hardware, so the same corrections: the bigger cluster's plans come out as the truth has them.
    truth = apply_calibration(parse_instance(bigger), TRUTH)
    for raw in ({"tp": 1, "dp": 4, "pp": 2, "micro_batch": 2, "partition": [0, 3, 6]},
                {"tp": 1, "dp": 2, "pp": 4, "micro_batch": 4, "partition": [0, 2, 3, 4, 6]}):
        plan = parse_plan(raw)
        assert evaluate(copied, plan).predicted_time == pytest.approx(evaluate(truth, plan).predicted_time, rel=0.03)


def test_every_solver_optimises_the_calibrated_model():
    """The corrections keep the programs linear: CP-SAT, CBC and the enumerator agree on it."""
    doc = document(nodes=2, devices=2, global_batch=8)
    doc["calibration"] = {"device_types": {"cpu": {"compute_scale": 1.3, "step_overhead": 0.004,
                                                   "memory_overhead": 2**20, "memory_headroom": 2**20}},
                          "links": {"intra": 0.2, "inter": 0.1}, "activation_factor": 1.2,
                          "gradient_buffer_bytes_per_param": 4}
    doc["search"] = {"recompute": ["none"], "cp": [1], "virtual_stages": [1], "zero_stages": [0]}
    instance = parse_instance(doc)
    found = {s: solve(instance, solver=s) for s in ("enumerate", "cpsat", "cbc")}
    ref = found["enumerate"].best.predicted_time
    for name, result in found.items():
        assert result.best.predicted_time == pytest.approx(ref, rel=1e-5), name
        assert result.solver.objective == pytest.approx(result.best.predicted_time, rel=1e-5), name
    # and the calibration changed the answer's price
    assert ref != pytest.approx(solve(parse_instance(document(nodes=2, devices=2, global_batch=8) | {
        "search": doc["search"]}), solver="enumerate").best.predicted_time, rel=1e-3)


# ---------------------------------------------------------------- memory

def _peaks(instance, section, plan_list):
    truth = apply_calibration(instance, section)
    out = []
    for p in plan_list:
        ev = evaluate(truth, parse_plan(p))
        out.append({"plan": p, "iteration_time": ev.predicted_time,
                    "peak_memory": max(peak_of_stage(truth, s) for s in ev.stages)})
    return out


def test_memory_fit_recovers_activation_factor_and_buffers(base):
    truth = {"activation_factor": 1.25, "gradient_buffer_bytes_per_param": 4.0}
    cal = fitted(base, _peaks(base, truth, plans()), cv=False)
    values = cal.memory.values
    assert values["activation_factor"] == pytest.approx(1.25, rel=0.02)
    assert values["gradient_buffer_bytes_per_param"] == pytest.approx(4.0, rel=0.05)
    e = cal.memory.errors()
    assert e["calibrated"].max_abs_error < 0.01 < e["uncalibrated"].max_abs_error


MEMORY_TRUTH = {"activation_factor": 1.25, "gradient_buffer_bytes_per_param": 4.0}
WHOLE = {"tp": 1, "dp": 1, "pp": 1, "micro_batch": 16, "partition": [0, 6]}  # needs the most memory


def _predicted_peaks(instance, section, records):
    calibrated = apply_calibration(instance, section)
    return [max(peak_of_stage(calibrated, s) for s in evaluate(calibrated, parse_plan(r["plan"])).stages)
            for r in records]


def _without_headroom(section):
    out = copy.deepcopy(section)
    for entry in out.get("device_types", {}).values():
        entry.pop("memory_headroom", None)
    return out


def test_out_of_memory_under_its_limit_tightens_capacity_not_peaks(base):
    """A run out of memory under a limit (--memory-limit on CPU): the calibrated model predicts it
    does not fit under that limit, while every finished run's predicted peak is what the memory fit
    made it (no worse than uncalibrated) and it still fits, and the plan that failed still fits the
    instance's 8 GiB devices (it ran out of 1.02 times its peak, not of 8 GiB)."""
    finished = _peaks(base, MEMORY_TRUTH, plans()[:12])
    [whole] = _peaks(base, MEMORY_TRUTH, [WHOLE])
    limit = 1.02 * whole["peak_memory"]  # the calibrated model predicts it fits: it did not (2% it does not know)
    records = finished + [{"plan": WHOLE, "failed": "oom", "memory_limit": limit}]
    cal = fitted(base, records, cv=False)
    measured = [r["peak_memory"] for r in finished]
    after = _predicted_peaks(base, cal.section, finished)
    assert after == pytest.approx(_predicted_peaks(base, _without_headroom(cal.section), finished), rel=1e-12)
    assert errors(after, measured).max_abs_error < 0.02
    assert errors(after, measured).rms_log_error <= errors(_predicted_peaks(base, {}, finished), measured).rms_log_error
    # the scores reported are those of the section written
    assert cal.memory.after == pytest.approx(after, rel=1e-12)
    assert [(a.device_type, a.records, a.unexplained) for a in cal.headroom] == [("cpu", (12,), ())]
    assert 0 < cal.section["device_types"]["cpu"]["memory_headroom"] < 0.05 * limit
    assert cal.section["device_types"]["cpu"].get("memory_overhead", 0) < 0.01 * limit  # what F5 fitted, no more
    doc = document()
    doc["device_types"][0]["memory"] = limit
    assert not evaluate(apply_calibration(parse_instance(doc), cal.section), parse_plan(WHOLE)).feasible
    calibrated = apply_calibration(base, cal.section)
    assert all(evaluate(calibrated, parse_plan(r["plan"])).feasible for r in records)
    assert cal.wrong == {"uncalibrated": (12,), "calibrated": ()}
    report = cal.fit_report(date="2026-01-01")
    assert report["out_of_memory"][0]["runs"] == [12] and report["outcomes_predicted_wrong"]["calibrated"] == []


def test_out_of_memory_without_a_limit_is_compared_with_the_device_memory(base):
    """Records without memory_limit (other tools') keep working: the plan that failed is predicted not
    to fit the instance's devices, the finished ones still fit, and no predicted peak moves."""
    finished = _peaks(base, MEMORY_TRUTH, plans()[:12])
    records = finished + [{"plan": WHOLE, "failed": "oom"}]
    cal = fitted(base, records, cv=False)
    after = _predicted_peaks(base, cal.section, finished)
    assert after == pytest.approx(_predicted_peaks(base, _without_headroom(cal.section), finished), rel=1e-12)
    assert errors(after, [r["peak_memory"] for r in finished]).max_abs_error < 0.02
    calibrated = apply_calibration(base, cal.section)
    assert not evaluate(calibrated, parse_plan(WHOLE)).feasible
    assert all(evaluate(calibrated, parse_plan(r["plan"])).feasible for r in finished)
    assert [(a.records, a.unexplained) for a in cal.headroom] == [((12,), ())]
    assert any("carry no memory_limit" in n for n in cal.notes)


def test_out_of_memory_contradicted_by_a_finished_run_is_reported_not_forced(base):
    """A finished run that needs more memory than the one that ran out bounds the headroom: it is
    still predicted to fit, the run out of memory is reported as predicted wrongly, nothing else moves."""
    small = {"tp": 1, "dp": 1, "pp": 2, "micro_batch": 4, "partition": [0, 3, 6]}
    finished = _peaks(base, MEMORY_TRUTH, plans()[:12] + [WHOLE])
    records = finished + [{"plan": small, "failed": "oom"}]
    cal = fitted(base, records, cv=False)
    calibrated = apply_calibration(base, cal.section)
    assert all(evaluate(calibrated, parse_plan(r["plan"])).feasible for r in finished)
    [a] = cal.headroom
    assert a.unexplained == (13,) and a.limited_by == 12 and a.headroom < a.wanted
    assert cal.wrong == {"uncalibrated": (13,), "calibrated": (13,)}
    assert _predicted_peaks(base, cal.section, finished) == pytest.approx(
        _predicted_peaks(base, _without_headroom(cal.section), finished), rel=1e-12)


def test_a_step_that_would_worsen_the_fit_is_shrunk_or_refused():
    """F7, on a scorer whose measures get worse beyond a quarter of the step."""
    from amp_opt.calibrate.scoring import Scores, guarded as _guarded

    before = Scores((0.1, 0.1), (0.1, 0.1), ())

    def score(section):
        t = section["t"]
        return Scores((0.1 - 0.1 * t, 0.1), (0.1, 0.1), (3,) if t > 0.25 else ())

    section, t, scores = _guarded(score, before, {"t": 0.0}, lambda t: {"t": t})
    assert t == 0.25 and section == {"t": 0.25} and scores.no_worse_than(before)
    section, t, scores = _guarded(lambda s: Scores((0.2, 0.2), (0.1, 0.1), ()), before, {"t": 0.0},
                                  lambda t: {"t": t})
    assert (section, t, scores) == ({"t": 0.0}, 0.0, before)


# ---------------------------------------------------------------- RUNS.json and the command

PLAN = {"tp": 1, "dp": 1, "pp": 2, "micro_batch": 2, "partition": [0, 3, 6]}


@pytest.mark.parametrize("records, field", [
    ([{"plan": PLAN, "iteration_time": 1.0}, {"plan": dict(PLAN, speed=3), "iteration_time": 1.0}],
     "RUNS.json[1].plan.speed"),
    ([{"plan": PLAN, "iteration_time": -0.5}], "RUNS.json[0].iteration_time"),
    ([{"plan": PLAN, "iteration_time": 0}], "RUNS.json[0].iteration_time"),
    ([{"plan": PLAN, "iteration_time": "fast"}], "RUNS.json[0].iteration_time"),
    ([{"plan": PLAN, "failed": "timeout"}], "RUNS.json[0].failed"),
    ([{"plan": PLAN}], "RUNS.json[0]"),
    ([{"iteration_time": 1.0}], "RUNS.json[0]"),
    ([{"plan": PLAN, "iteration_time": 1.0, "failed": "oom"}], "RUNS.json[0]"),
    ([{"plan": PLAN, "iteration_time": 1.0, "peak_memory": -1}], "RUNS.json[0].peak_memory"),
    ([{"plan": PLAN, "failed": "oom", "memory_limit": 0}], "RUNS.json[0].memory_limit"),
    ({"plan": PLAN, "iteration_time": 1.0}, "RUNS.json"),
])
def test_runs_validation(records, field):
    with pytest.raises(InputError) as err:
        parse_runs(records)
    assert err.value.field == field


def run_cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "amp_opt", *args], capture_output=True, text=True, cwd=cwd)


def test_calibrate_command(tmp_path, base):
    doc = document()
    doc["calibration"] = {"device_types": {"T4": {"compute_scale": 2.0}, "cpu": {"compute_scale": 5.0}}}
    (tmp_path / "inst.json").write_text(json.dumps(doc))
    records = timed(base, TRUTH, plans()[:12])
    records[0]["instance"] = "inst.json"  # the same file: one instance
    records.append({"plan": PLAN, "failed": "error", "error": "something", "measured": {"ignored": True}})
    (tmp_path / "RUNS.json").write_text(json.dumps(records))
    out = run_cli("calibrate", "inst.json", "RUNS.json", "-o", "sub/cal.json", cwd=tmp_path)
    assert out.returncode == 2 and "cannot write sub/cal.json" in out.stderr  # the folder does not exist
    out = run_cli("calibrate", "inst.json", "RUNS.json", "-o", "cal.json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "calibrated from 13 runs (12 finished, 0 out of memory, 1 failed" in out.stdout
    assert "on 1 instance(s)" in out.stdout and "held-out" in out.stdout
    section = json.loads((tmp_path / "cal.json").read_text())["calibration"]
    assert section["device_types"]["T4"] == {"compute_scale": 2.0}  # no run used T4: carried over
    assert section["device_types"]["cpu"]["compute_scale"] == pytest.approx(1.4, rel=0.1)  # refitted, not 5.0
    fit = section["fit"]
    assert fit["runs"]["finished"] == 12 and fit["time"]["held_out"]["runs"] == 12
    assert fit["time"]["in_sample"]["calibrated"]["median_abs_error"] < 0.02
    for command in (["solve", "cal.json"], ["evaluate", "cal.json", "plan.json"]):
        (tmp_path / "plan.json").write_text(json.dumps(PLAN))
        assert run_cli(*command, cwd=tmp_path).returncode == 0


def test_calibrate_command_bad_runs(tmp_path, capsys, monkeypatch):
    (tmp_path / "inst.json").write_text(json.dumps(document()))
    (tmp_path / "nan.json").write_text('[{"plan": %s, "iteration_time": 1.0}, {"plan": %s, "iteration_time": NaN}]'
                                       % (json.dumps(PLAN), json.dumps(PLAN)))
    (tmp_path / "lost.json").write_text(json.dumps([{"plan": PLAN, "iteration_time": 1.0, "instance": "gone.json"}]))
    (tmp_path / "wrong.json").write_text(json.dumps([{"plan": dict(PLAN, partition=[0, 3, 7]), "iteration_time": 1.0}]))
    (tmp_path / "empty.json").write_text("[]")
    monkeypatch.chdir(tmp_path)
    for name, expected in (("nan.json", "nan.json[1].iteration_time"), ("lost.json", "lost.json[0].instance"),
                           ("wrong.json", "wrong.json[0].plan.partition"), ("empty.json", "empty.json: holds no runs"),
                           ("missing.json", "runs file not found")):
        code = main(["calibrate", "inst.json", name, "-o", "cal.json"])
        err = capsys.readouterr().err
        assert code == 2, (name, err)
        assert expected in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "cal.json").exists()


def test_a_record_the_model_cannot_price_is_named(tmp_path, capsys, monkeypatch):
    """A record on a device type nothing was measured on (and no peak_flops to estimate from): the
    error names it.  (A tp degree the profiled device type was not measured at is derived.)"""
    doc = document()
    doc["device_types"].append({"name": "new", "memory": "8 GiB"})
    doc["nodes"].append({"name": "other", "device_type": "new", "devices": 2, "intra_bandwidth": "200 MB/s",
                         "inter_bandwidth": "100 MB/s"})
    (tmp_path / "inst.json").write_text(json.dumps(doc))
    tp2 = {"tp": 2, "dp": 1, "pp": 1, "micro_batch": 1, "partition": [0, 6]}
    on_new = dict(tp2, stages=[[[4, 5]]])
    (tmp_path / "runs.json").write_text(json.dumps([{"plan": PLAN, "iteration_time": 1.0},
                                                    {"plan": tp2, "iteration_time": 1.0},
                                                    {"plan": on_new, "iteration_time": 1.0}]))
    monkeypatch.chdir(tmp_path)
    assert main(["calibrate", "inst.json", "runs.json", "-o", "cal.json"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("amp-opt: error: runs.json[2]: instance.profiles: no measured profile for device type 'new', "
                           "and device type 'new' has no peak_flops to estimate it from"), err
    assert not (tmp_path / "cal.json").exists()


def test_profiles_measured_on_another_model_are_refused():
    doc = document()
    doc["profiles"][0]["layer_names"] = ["embedding", "layer_0", "layer_1", "layer_2", "layer_9", "head"]
    with pytest.raises(InputError, match=r"profiles\[0\].layer_names.*entry 4 is 'layer_9'"):
        parse_instance(doc)
    doc["profiles"][0]["layer_names"][4] = "layer_3"
    parse_instance(doc)


def test_schema_takes_what_the_fit_writes(base):
    cal = fitted(base, timed(base, TRUTH, plans()[:6]))
    section = copy.deepcopy(cal.section)
    section["fit"] = cal.fit_report(date="2026-01-01")
    json.dumps(section)  # JSON-ready
    parse_instance(dict(document(), calibration=section))


def test_calibrated_copy_elsewhere_keeps_its_hugging_face_config(tmp_path, capsys, monkeypatch):
    config = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 64}
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "config.json").write_text(json.dumps(config))
    doc = document(global_batch=8)
    doc["model"] = {"hf_config": "models/config.json", "seq_len": 32}
    doc.pop("profiles")
    doc["device_types"][0]["peak_flops"] = 1e11
    (tmp_path / "inst.json").write_text(json.dumps(doc))
    plan = {"tp": 1, "dp": 1, "pp": 2, "micro_batch": 1, "partition": [0, 2, 4]}
    (tmp_path / "runs.json").write_text(json.dumps([{"plan": plan, "iteration_time": 0.01}]))
    (tmp_path / "out").mkdir()
    monkeypatch.chdir(tmp_path)
    assert main(["calibrate", "inst.json", "runs.json", "-o", "out/cal.json"]) == 0, capsys.readouterr().err
    written = json.loads((tmp_path / "out" / "cal.json").read_text())
    assert written["model"]["hf_config"] == "../models/config.json"
    from amp_opt import load_instance

    assert load_instance(tmp_path / "out" / "cal.json").num_layers == 4


# ---------------------------------------------------------------- cross-validation across groups (F8), speed

def test_held_out_ranking_never_worse_than_uncalibrated():
    """F8's rule: a parameter count whose held-out error is smaller is still refused when it ranks
    the plans of some group worse than the uncalibrated model does."""
    from amp_opt.calibrate.crossval import cross_validate

    measured = np.array([1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0])
    before = 2 * measured  # right order, twice too slow everywhere
    groups = ["a"] * 4 + ["b"] * 4

    def refit_predict(k, train, test):  # k = 1 halves the error but swaps two plans of each group
        out = before[test] / 1.8 if k else before[test]
        return out[[1, 0, 2, 3]] if k else out

    cv = cross_validate(refit_predict, 1, measured, before, groups)
    assert cv.rms[1] < cv.rms[0] and cv.ranking_ok == (True, False) and cv.chosen == 0
    cv = cross_validate(lambda k, train, test: before[test] / (1.8 if k else 1.0), 1, measured, before, groups)
    assert cv.ranking_ok == (True, True) and cv.chosen == 1


def test_groups_are_held_out_whole_and_reported(tmp_path, base, two_instances):
    """Runs on two instances: each fold holds one instance's runs out; the report gives each group's
    held-out error and rank correlation next to the uncalibrated model's."""
    small, local, remote = two_instances
    records = (timed(small, TRUTH, local, noise=0.02, seed=4)
               + [dict(r, instance="two.json") for r in timed(base, TRUTH, remote, noise=0.02, seed=5)])
    (tmp_path / "RUNS.json").write_text(json.dumps(records))
    cal = fit_calibration(bind_runs(load_runs(tmp_path / "RUNS.json"), small))
    part = cal.time
    assert part.cv.scheme == "leave one group out"
    assert [g.group for g in part.groups] == ["one", "two"] and [len(g.runs) for g in part.groups] == [9, 6]
    for g in part.groups:  # calibrated on the other cluster only, and still better than uncalibrated
        assert g.held_out.median_abs_error < g.uncalibrated.median_abs_error
        assert g.held_out.spearman >= g.uncalibrated.spearman
    report = cal.fit_report(date="2026-01-01")["time"]
    assert [g["group"] for g in report["groups"]] == ["one", "two"]
    assert report["cross_validation"]["parameters_kept"] == len(part.solution.parameters) >= 1


def test_failed_runs_the_model_calls_feasible_are_misses(base):
    finished = timed(base, TRUTH, plans()[:6])
    records = finished + [{"plan": PLAN, "failed": "error"}, {"plan": PLAN, "failed": "oom", "memory_limit": 1e3}]
    cal = fitted(base, records, cv=False)
    assert cal.misses == {"uncalibrated": (6,), "calibrated": (6,)}  # 1 kB of memory: the oom run is no miss
    report = cal.fit_report(date="2026-01-01")
    assert report["failed_predicted_feasible"]["calibrated"] == [6]


def test_calibration_evaluates_each_run_a_bounded_number_of_times(base, monkeypatch):
    """Speed without a clock: 35 runs on two groups are fitted (time and memory, with
    cross-validation) in a bounded number of evaluations per run, one per plan and section."""
    import amp_opt.calibrate.predict as predict

    calls = []
    real = predict.evaluate
    monkeypatch.setattr(predict, "evaluate", lambda *a, **k: calls.append(1) or real(*a, **k))
    records = _peaks(base, MEMORY_TRUTH, plans()[:20]) + timed(base, TRUTH, plans()[:15], noise=0.03, seed=6)
    cal = fitted(base, records)
    assert cal.time is not None and cal.memory is not None
    assert len(calls) < 240 * len(records), len(calls)  # 217 a run; leave-one-out refits took 1510


def test_failed_runs_of_a_group_are_checked_against_a_headroom_fitted_without_it(tmp_path, base):
    (tmp_path / "two.json").write_text(json.dumps(document(name="two")))
    [whole] = _peaks(base, MEMORY_TRUTH, [WHOLE])
    finished = _peaks(base, MEMORY_TRUTH, plans()[:8])
    near = {"plan": WHOLE, "failed": "oom", "memory_limit": 1.02 * whole["peak_memory"]}
    far = {"plan": WHOLE, "failed": "oom", "memory_limit": 3 * whole["peak_memory"]}  # nothing known explains it
    two = [dict(r, instance="two.json") for r in finished[:6] + [near, far]]

    def held_out(records):
        (tmp_path / "RUNS.json").write_text(json.dumps(records))
        return fit_calibration(bind_runs(load_runs(tmp_path / "RUNS.json"), base))

    cal = held_out(finished + two)  # nothing ran out of memory in "syn": nothing to learn from it
    assert cal.held_out_misses == {"two": (14, 15)} and cal.misses["calibrated"] == ()
    cal = held_out(finished + [near] + two)  # what "syn" taught flags the like run of "two" (15), not 16
    assert cal.held_out_misses == {"syn": (), "two": (16,)}
    assert cal.fit_report(date="2026-01-01")["failed_predicted_feasible_held_out"] == {"syn": [], "two": [16]}
