"""profile, run and calibrate from the command line on a tiny model: profile -> solve -> run -> calibrate,
and the bad input each refuses before any process starts."""

import importlib.util
import json
import subprocess
import sys

import pytest

from amp_opt.model.load import load_instance

MODEL = {"preset": "gpt", "hidden": 64, "layers": 2, "heads": 4, "seq_len": 32, "vocab": 128, "dropout": False,
         "dtype_bytes": 4, "attention": "eager"}


def document(devices=2, model=MODEL, device_type="cpu"):
    return {"version": 1, "name": "tiny", "model": dict(model),
            "device_types": [{"name": device_type, "memory": "8 GiB"}],
            "nodes": [{"name": "host", "device_type": device_type, "devices": devices, "intra_bandwidth": "1 GB/s",
                       "inter_bandwidth": "1 GB/s"}],
            "training": {"global_batch": 8}}


def cli(*args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "amp_opt", *args], capture_output=True, text=True, cwd=cwd, env=env)


def main(capsys, monkeypatch, cwd, *args):
    """The command line in this process (refusals come before any process starts): (code, stderr)."""
    from amp_opt.commands.cli import main as cli_main

    monkeypatch.chdir(cwd)
    code = cli_main(list(args))
    return code, capsys.readouterr().err


def test_without_torch_one_line_and_exit_2(tmp_path):
    """A torch that cannot be imported (a stand-in package on the path) gives the install hint."""
    import os

    blocker = tmp_path / "blocked" / "torch"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('no torch here')\n")
    (tmp_path / "tiny.json").write_text(json.dumps(document()))
    (tmp_path / "plan.json").write_text(json.dumps({"tp": 1, "dp": 1, "pp": 1, "micro_batch": 1, "partition": [0, 4]}))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "blocked"), *sys.path]))
    for args in (("profile", "tiny.json", "-o", "out.json"), ("run", "tiny.json", "plan.json")):
        out = cli(*args, cwd=tmp_path, env=env)
        assert out.returncode == 2
        assert out.stderr.strip() == 'amp-opt: error: PyTorch is not installed: pip install "amp_opt[torch]"'


needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs amp_opt[torch]")


@pytest.fixture(scope="module")
def workflow(tmp_path_factory):
    """profile -> solve -> run (two plans) -> calibrate, each as a user types it."""
    tmp = tmp_path_factory.mktemp("workflow")
    (tmp / "tiny.json").write_text(json.dumps(document()))
    steps = {"profile": cli("profile", "tiny.json", "-o", "profiled.json", "--device", "cpu", "--micro-batches", "1,2",
                            "--repeats", "2", "--warmup", "0", "--runnable", cwd=tmp)}
    steps["solve"] = cli("solve", "profiled.json", "--json", cwd=tmp)
    if steps["solve"].returncode == 0:
        (tmp / "best.json").write_text(json.dumps(json.loads(steps["solve"].stdout)["plan"]))
    (tmp / "pipe.json").write_text(json.dumps({"tp": 1, "dp": 1, "pp": 2, "micro_batch": 1, "partition": [0, 2, 4]}))
    steps["run"] = cli("run", "profiled.json", "best.json", "-o", "runs.json", "--iterations", "2", "--warmup", "1",
                       cwd=tmp)
    steps["run2"] = cli("run", "profiled.json", "pipe.json", "-o", "runs.json", "--append", "--iterations", "2",
                        "--warmup", "1", cwd=tmp)
    steps["calibrate"] = cli("calibrate", "profiled.json", "runs.json", "-o", "calibrated.json", cwd=tmp)
    steps["again"] = cli("solve", "calibrated.json", cwd=tmp)
    return tmp, steps


@needs_torch
def test_profile_writes_a_solvable_instance(workflow):
    tmp, steps = workflow
    assert steps["profile"].returncode == 0, steps["profile"].stderr
    assert "tp=1 micro_batch=2" in steps["profile"].stdout
    doc = json.loads((tmp / "profiled.json").read_text())
    entries = {(p["device_type"], p["tp"], p["micro_batch"]): p for p in doc["profiles"]}
    assert set(entries) == {("cpu", 1, 1), ("cpu", 1, 2)}
    for p in entries.values():
        assert p["layer_names"] == ["embedding", "layer_0", "layer_1", "head"]
        assert len(p["layer_times"]) == 4 and all(t > 0 for t in p["layer_times"])
        assert all(lo <= t <= hi for lo, t, hi in zip(p["spread"]["min"], p["layer_times"], p["spread"]["max"]))
        assert p["provenance"]["torch"] and p["provenance"]["repeats"] == 2
        assert p["provenance"]["warmup"] == 0  # --warmup 0 is accepted, as by run
        assert len(p["activation_memory_bytes"]) == 4
    assert doc["training"]["model_state_bytes_per_param"] == {"weights": 4, "gradients": 4, "optimizer": 8}
    assert doc["training"]["gradient_buffer_bytes_per_param"] == 4  # the flat copy the runtime reduces
    assert doc["search"]["recompute"] == ["none", "selective", "full"] and doc["search"]["zero_stages"] == [0, 1]
    assert doc["search"]["virtual_stages"] == [1] and doc["search"]["sequence_parallel"] == [False, True]
    instance = load_instance(tmp / "profiled.json")  # the schema takes what profile writes
    assert not any(p.device_type != "cpu" for p in instance.profiles)
    assert steps["solve"].returncode == 0, steps["solve"].stderr


@needs_torch
def test_run_prints_measured_against_predicted_and_writes_runs(workflow):
    tmp, steps = workflow
    for key in ("run", "run2"):
        assert steps[key].returncode == 0, steps[key].stderr
        out = steps[key].stdout
        assert "iteration time: measured" in out and "predicted" in out and "pipeline compute" in out
    records = json.loads((tmp / "runs.json").read_text())
    assert len(records) == 2  # -o, then --append
    for r in records:
        assert r["iteration_time"] > 0 and r["peak_memory"] > 0 and r["instance"] == "profiled.json"
    assert records[1]["plan"]["pp"] == 2


@needs_torch
def test_calibrate_reads_what_run_writes(workflow):
    tmp, steps = workflow
    assert steps["calibrate"].returncode == 0, steps["calibrate"].stderr
    assert "calibrated from 2 runs (2 finished" in steps["calibrate"].stdout
    section = json.loads((tmp / "calibrated.json").read_text())["calibration"]
    assert section["fit"]["runs"]["instances"] == []  # the records name the instance being calibrated
    assert steps["again"].returncode == 0, steps["again"].stderr


@needs_torch
def test_run_json_predicts_the_peak_the_text_prints(workflow):
    """run --json pairs the measured peak with the calibrated model's predicted peak (eq. C5': the stage's
    memory less the reserve, plus memory_overhead), the figure the text prints."""
    tmp, _ = workflow
    doc = json.loads((tmp / "profiled.json").read_text())
    doc["calibration"] = {"device_types": {"cpu": {"memory_overhead": 2**20}}}
    (tmp / "overhead.json").write_text(json.dumps(doc))
    out = cli("run", "overhead.json", "pipe.json", "--iterations", "1", "--warmup", "0", "--json", cwd=tmp)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    reserve = load_instance(tmp / "overhead.json").training.memory_reserve
    expected = [s["memory"] - reserve + 2**20 for s in result["predicted"]["stages"]]
    assert [s["memory"]["predicted"] for s in result["comparison"]["stages"]] == pytest.approx(expected, rel=1e-12)


@needs_torch
def test_a_run_out_of_memory_is_a_record(workflow):
    tmp, _ = workflow
    (tmp / "one.json").write_text(json.dumps({"tp": 1, "dp": 1, "pp": 1, "micro_batch": 2, "partition": [0, 4]}))
    out = cli("run", "profiled.json", "one.json", "-o", "oom.json", "--iterations", "1", "--warmup", "0",
              "--memory-limit", "1000", cwd=tmp)
    assert out.returncode == 6, out.stderr
    assert "run FAILED (oom)" in out.stderr and "run FAILED" not in out.stdout
    [record] = json.loads((tmp / "oom.json").read_text())
    assert record["failed"] == "oom" and record["plan"]["micro_batch"] == 2
    assert record["memory_limit"] == 1000  # what calibrate compares the plan's peak with


@needs_torch
@pytest.mark.parametrize("mutate, plan, expected", [
    (lambda d: (d["nodes"][0].update(devices=64), d["training"].update(global_batch=64)), {"tp": 1, "dp": 64, "pp": 1, "micro_batch": 1, "partition": [0, 4]},
     "processes, this machine has"),
    (lambda d: (d["device_types"][0].update(name="T4"), d["nodes"][0].update(device_type="T4")),
     {"tp": 1, "dp": 1, "pp": 1, "micro_batch": 1, "partition": [0, 4]}, "'T4' is a GPU"),
    (lambda d: (d["device_types"][0].update(name="mygpu", catalog="T4"), d["nodes"][0].update(device_type="mygpu")),
     {"tp": 1, "dp": 1, "pp": 1, "micro_batch": 1, "partition": [0, 4]},
     "instance.device_types[0].catalog: 'mygpu' is a GPU (T4)"),
    (lambda d: d.update(model={"layers": [{"name": "a", "params": 10, "activation_bytes": 4},
                                          {"name": "b", "params": 10, "activation_bytes": 4}]}),
     {"tp": 1, "dp": 1, "pp": 1, "micro_batch": 1, "partition": [0, 2]}, "has no dimensions"),
    (lambda d: None, {"tp": 1, "dp": 1, "pp": 1, "micro_batch": 1, "partition": [0, 4], "zero_stage": 3},
     "plan.zero_stage: the runtime does not run ZeRO stage 3 (it runs 0, 1)"),
    (lambda d: None, {"tp": 1, "dp": 1, "pp": 1, "micro_batch": 3, "partition": [0, 4]}, "plan.micro_batch"),
    (lambda d: None, {"plan": {"tp": 1, "dp": 1, "pp": 1, "micro_batch": 1, "partition": [0, 4]},
                      "predicted_time": 0.1, "breakdown": {}, "feasible": True},
     'plan.breakdown: unknown field (a plan has tp, dp, pp, micro_batch, partition, stages, cp, sequence_parallel, '
     'recompute, recompute_layers, zero_stage, virtual_stages, shares); this is a result (solve --json, evaluate --json), '
     'not a plan: take its "plan" member'),
])
def test_run_refuses_before_starting(tmp_path, capsys, monkeypatch, mutate, plan, expected):
    doc = document()
    mutate(doc)
    (tmp_path / "inst.json").write_text(json.dumps(doc))
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    code, err = main(capsys, monkeypatch, tmp_path, "run", "inst.json", "plan.json", "-o", "runs.json")
    assert code == 2, err
    assert expected in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "runs.json").exists()


@needs_torch
@pytest.mark.parametrize("args, expected", [
    (["--device-type", "A100"], "--device-type: 'A100' is not a device type"),
    (["--tp", "4"], "--tp: tp 4 is more than the 2 devices"),
    (["--micro-batches", "0"], "expected comma-separated positive integers"),
    (["--warmup", "-1"], "--warmup: must be 0 or more, got -1"),
])
def test_profile_refuses_bad_options(tmp_path, capsys, monkeypatch, args, expected):
    (tmp_path / "inst.json").write_text(json.dumps(document()))
    try:
        code, err = main(capsys, monkeypatch, tmp_path, "profile", "inst.json", "-o", "out.json", *args)
    except SystemExit as exc:  # argparse refuses malformed option values itself, with exit 2
        code, err = exc.code, capsys.readouterr().err
    assert code == 2 and expected in err, err
    assert not (tmp_path / "out.json").exists()


@needs_torch
@pytest.mark.parametrize("name, catalog, expected", [
    ("T4", None, "device_type: 'T4' is a GPU (T4)"),
    ("mygpu", "T4", "instance.device_types[0].catalog: 'mygpu' is a GPU (T4)"),
])
def test_profile_refuses_a_gpu_type_on_cpu(tmp_path, capsys, monkeypatch, name, catalog, expected):
    """A type is a GPU by its name or by its catalog field; on CPU it is refused either way, naming the field."""
    doc = document(device_type=name)
    if catalog:
        doc["device_types"][0]["catalog"] = catalog
    (tmp_path / "inst.json").write_text(json.dumps(doc))
    code, err = main(capsys, monkeypatch, tmp_path, "profile", "inst.json", "-o", "out.json", "--device", "cpu")
    assert code == 2 and expected in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out.json").exists()


@needs_torch
def test_run_oversubscribe_is_a_flag(workflow, capsys, monkeypatch):
    """More processes than usable cores: refused, with the flag that runs it anyway, which does."""
    import amp_opt.runtime.run as engine_run

    tmp, _ = workflow
    monkeypatch.setattr(engine_run, "usable_cores", lambda: 1)
    (tmp / "dp2.json").write_text(json.dumps({"tp": 1, "dp": 2, "pp": 1, "micro_batch": 1, "partition": [0, 4]}))
    code, err = main(capsys, monkeypatch, tmp, "run", "profiled.json", "dp2.json")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "plan: needs tp*dp*pp = 2 processes, this machine has 1 usable cores (run --oversubscribe" in err
    code, err = main(capsys, monkeypatch, tmp, "run", "profiled.json", "dp2.json", "--oversubscribe",
                     "--iterations", "1", "--warmup", "0")
    assert code == 0, err


@needs_torch
def test_run_refuses_negative_warmup(tmp_path, capsys, monkeypatch):
    (tmp_path / "inst.json").write_text(json.dumps(document()))
    (tmp_path / "plan.json").write_text(json.dumps({"tp": 1, "dp": 1, "pp": 1, "micro_batch": 1, "partition": [0, 4]}))
    code, err = main(capsys, monkeypatch, tmp_path, "run", "inst.json", "plan.json", "--warmup", "-1")
    assert code == 2 and err.strip() == "amp-opt: error: --warmup: must be 0 or more, got -1", err


@needs_torch
def test_profile_warns_of_sizes_no_plan_can_use(tmp_path):
    """A micro-batch larger than the global batch (8 here) is profiled, with a one-line warning."""
    (tmp_path / "tiny.json").write_text(json.dumps(document()))
    out = cli("profile", "tiny.json", "-o", "out.json", "--device", "cpu", "--micro-batches", "1,16",
              "--repeats", "1", "--warmup", "0", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stderr.strip() == ("amp-opt: warning: --micro-batches 16: more than the global batch of 8, so no plan "
                                  "can use it (profiled anyway)")


@needs_torch
def test_run_refuses_a_plan_the_model_cannot_price_before_starting(workflow, capsys, monkeypatch):
    """Nothing measured on cpu (and no peak_flops): bad input before any process starts."""
    tmp, _ = workflow
    doc = json.loads((tmp / "profiled.json").read_text())
    doc.pop("profiles")
    (tmp / "unprofiled.json").write_text(json.dumps(doc))
    (tmp / "tp2.json").write_text(json.dumps({"tp": 2, "dp": 1, "pp": 1, "micro_batch": 1, "partition": [0, 4]}))
    started = []
    import amp_opt.runtime.run as engine_run

    monkeypatch.setattr(engine_run, "launch", lambda *a, **k: started.append(1))
    code, err = main(capsys, monkeypatch, tmp, "run", "unprofiled.json", "tp2.json", "-o", "tp2_runs.json")
    assert code == 2 and "instance.profiles: no measured profile for device type 'cpu'" in err, err
    assert not started and not (tmp / "tp2_runs.json").exists()
