"""The command line: outputs, exit codes (0 ok, 2 bad input, 3 infeasible), one-line errors."""

import json
import subprocess
import sys

import pytest

from conftest import INSTANCES, instance_dict


def run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "amp_opt", *args], capture_output=True, text=True, cwd=cwd)


def test_solve_json_shape():
    out = run("solve", str(INSTANCES / "amp_het_cluster.json"), "--cost-model", "amp", "--json", "--top-k", "3")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert set(doc["plan"]) == {"tp", "dp", "pp", "micro_batch", "partition", "stages", "cp", "sequence_parallel",
                                "recompute", "zero_stage", "virtual_stages"}
    assert doc["feasible"] is True
    assert set(doc["breakdown"]) == {"pipeline_bottleneck", "stage_compute", "p2p", "allreduce"}
    assert doc["predicted_time"] == pytest.approx(sum(doc["breakdown"].values()))
    for key in ("name", "status", "wall_time", "objective", "bound", "gap"):
        assert key in doc["solver"]
    assert doc["solver"]["status"] == "OPTIMAL" and doc["solver"]["gap"] == 0
    assert [t["predicted_time"] for t in doc["top"]] == sorted(t["predicted_time"] for t in doc["top"])
    assert len(doc["top"]) == 3 and doc["top"][0]["plan"] == doc["plan"]


def test_solve_report_is_readable():
    out = run("solve", str(INSTANCES / "amp_homogeneous.json"), "--cost-model", "amp")
    assert out.returncode == 0, out.stderr
    assert "predicted time per iteration" in out.stdout and "solver enumerate: OPTIMAL" in out.stdout


def test_evaluate_object_and_list(tmp_path):
    plan = {"tp": 1, "dp": 4, "pp": 4, "micro_batch": 1, "partition": [0, 7, 14, 20, 30]}
    (tmp_path / "one.json").write_text(json.dumps(plan))
    (tmp_path / "two.json").write_text(json.dumps([plan, dict(plan, partition=[0, 8, 14, 20, 30])]))
    inst = str(INSTANCES / "amp_het_cluster.json")
    one = run("evaluate", inst, str(tmp_path / "one.json"), "--cost-model", "amp", "--json")
    assert one.returncode == 0, one.stderr
    doc = json.loads(one.stdout)
    assert isinstance(doc, dict) and doc["predicted_time"] == pytest.approx(1.0859, abs=5e-5)
    two = json.loads(run("evaluate", inst, str(tmp_path / "two.json"), "--cost-model", "amp", "--json").stdout)
    assert [d["plan"]["partition"] for d in two] == [[0, 7, 14, 20, 30], [0, 8, 14, 20, 30]]
    assert two[1]["predicted_time"] < two[0]["predicted_time"]


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d["training"].pop("global_batch"), "training"),
        (lambda d: d["nodes"][0].update(devices=0), "nodes[0].devices"),
        (lambda d: d["nodes"][0].update(inter_bandwidth="fast"), "nodes[0].inter_bandwidth"),
        (lambda d: d["nodes"][0].update(device_type="B200X"), "nodes[0].device_type"),
        (lambda d: d["profiles"][0]["layer_times"].pop(), "profiles[0].layer_times"),
        (lambda d: d.update(version=7), "version"),
        (lambda d: d["model"]["layers"][3].update(params=-5), "model.layers[3].params"),
        # attention scores are part of what a layer keeps (selective recomputation frees them)
        (lambda d: d["model"]["layers"][3].update(activation_memory_bytes=10, attention_memory_bytes=11),
         "model.layers[3].attention_memory_bytes"),
    ],
)
def test_bad_instance_exits_2_with_one_line(tmp_path, mutate, field):
    doc = instance_dict("amp_het_cluster")
    mutate(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    out = run("solve", str(path))
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr
    assert field in lines[0], lines[0]


@pytest.mark.parametrize(
    "plan, field",
    [
        ({"tp": 1, "dp": 4, "pp": 4, "micro_batch": 1, "partition": [0, 7, 14, 30]}, "partition"),
        ({"tp": 1, "dp": 4, "pp": 4, "micro_batch": 3, "partition": [0, 7, 14, 20, 30]}, "micro_batch"),
        ({"tp": 2, "dp": 4, "pp": 4, "micro_batch": 1, "partition": [0, 7, 14, 20, 30]}, "tp*cp*dp*pp"),
        ({"tp": 1, "dp": 4, "pp": 4, "micro_batch": 1, "partition": [0, 7, 7, 20, 30]}, "partition"),
        ({"tp": 2, "dp": 8, "pp": 1, "micro_batch": 1, "partition": [0, 30],
          "stages": [[[0, 1], [0, 1], [2, 3], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]]]}, "stages[0][1]"),
        ({"tp": 1, "dp": 4, "pp": 4, "micro_batch": 1, "partition": [0, 7, 14, 20, 30], "speed": 1}, "plan.speed"),
        ([{"tp": 1}], "plan[0].dp"),
        ({"tp": 1, "dp": 4, "pp": 4, "micro_batch": 1}, "plan.partition: required"),
    ],
)
def test_bad_plan_exits_2(tmp_path, plan, field):
    (tmp_path / "p.json").write_text(json.dumps(plan))
    out = run("evaluate", str(INSTANCES / "amp_het_cluster.json"), str(tmp_path / "p.json"))
    assert out.returncode == 2, out.stdout
    assert len(out.stderr.strip().splitlines()) == 1 and field in out.stderr


def test_malformed_json_and_missing_file(tmp_path):
    (tmp_path / "x.json").write_text("{not json")
    out = run("solve", str(tmp_path / "x.json"))
    assert out.returncode == 2 and "not valid JSON" in out.stderr
    out = run("solve", str(tmp_path / "missing.json"))
    assert out.returncode == 2 and "not found" in out.stderr


def test_bad_option_exits_2():
    out = run("solve", str(INSTANCES / "amp_het_cluster.json"), "--top-k", "0")
    assert out.returncode == 2


def test_infeasible_exits_3_naming_the_stage(tmp_path):
    doc = instance_dict("amp_het_cluster")
    doc["device_types"] = [dict(t, memory="1.2 GiB") for t in doc["device_types"]]
    (tmp_path / "small.json").write_text(json.dumps(doc))
    out = run("solve", str(tmp_path / "small.json"))
    assert out.returncode == 3, out.stdout + out.stderr
    assert "stage" in out.stderr and "GiB" in out.stderr and "capacity" in out.stderr
    out = run("solve", str(tmp_path / "small.json"), "--json")  # --json readers get the verdict too
    assert out.returncode == 3 and json.loads(out.stdout)["status"] == "INFEASIBLE"


def test_divisibility_infeasible_exits_3(tmp_path):
    doc = instance_dict("amp_homogeneous")
    doc["search"] = {"tp": [8]}  # more devices than a node has
    (tmp_path / "t.json").write_text(json.dumps(doc))
    out = run("solve", str(tmp_path / "t.json"))
    assert out.returncode == 3 and "divides" in out.stderr, out.stderr


def test_generate_writes_valid_instance(tmp_path):
    out = run("generate", "--seed", "5", "-o", str(tmp_path / "g.json"))
    assert out.returncode == 0, out.stderr
    again = run("generate", "--seed", "5", "-o", "-")
    assert json.loads(again.stdout) == json.loads((tmp_path / "g.json").read_text())
    solved = run("solve", str(tmp_path / "g.json"), "--json")
    assert solved.returncode in (0, 3), solved.stderr


def test_non_finite_numbers_are_rejected(tmp_path):
    doc = instance_dict("amp_het_cluster")
    doc["profiles"][0]["layer_times"][0] = float("nan")
    (tmp_path / "nan.json").write_text(json.dumps(doc))  # Python writes the non-standard NaN literal
    out = run("solve", str(tmp_path / "nan.json"))
    assert out.returncode == 2 and "NaN" in out.stderr
