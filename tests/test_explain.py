"""explain: why a plan or an instance does not fit in memory, and which changes make it fit."""

import json
import subprocess
import sys

import pytest

from conftest import INSTANCES, instance_dict

import amp_opt
from amp_opt.commands.explain import explain_instance, explain_plan
from amp_opt.model.evaluate import memory_parts
from amp_opt.model.plan import parse_plan

GIB = 2**30
PLAN = {"tp": 1, "dp": 4, "pp": 4, "micro_batch": 1, "partition": [0, 7, 14, 20, 30]}


def shrunk(tmp_path, memory: str):
    """het_cluster with every device type's memory set to `memory`, written as a file; the
    search space AMP's of 2022 (no recomputation, ZeRO or sequence parallelism), so that the
    relaxations have something to relax."""
    doc = instance_dict("amp_het_cluster")
    for t in doc["device_types"]:
        t["memory"] = memory
    doc["search"] = {"recompute": ["none"], "zero_stages": [0], "sequence_parallel": [False]}
    path = tmp_path / f"het_cluster_{memory.replace(' ', '')}.json"
    path.write_text(json.dumps(doc))
    return path


def test_memory_parts_add_up(paper_instances):
    inst = paper_instances["het_cluster"]
    ev = amp_opt.evaluate(inst, parse_plan(PLAN))
    for part, stage in zip(memory_parts(inst, ev), ev.stages):
        assert part.model_state + part.activations + part.reserve == pytest.approx(stage.memory)
        assert part.model_state > 0 and part.activations > 0 and part.reserve == inst.training.memory_reserve


def test_infeasible_plan(tmp_path):
    inst = amp_opt.load_instance(shrunk(tmp_path, "4 GiB"))
    doc = explain_plan(inst, parse_plan(PLAN))
    assert doc["fits"] is False
    over = {o["stage"]: o for o in doc["overflows"]}
    assert set(over) == {0, 1}  # stages 2 and 3 need less than 4 GiB
    ev = amp_opt.evaluate(inst, parse_plan(PLAN))
    for s, o in over.items():
        assert o["device_type"] == "V100-16GB" and o["capacity"] == 4 * GIB
        assert o["over_bytes"] == pytest.approx(ev.stages[s].memory - 4 * GIB)
        assert o["dominant"] == "activations"
    changes = {a["change"]: a for a in doc["alternatives"]}
    zero = next(a for c, a in changes.items() if c.startswith("ZeRO"))
    assert zero["fits"]  # 12 optimizer bytes/param over dp = 4 frees enough
    assert any(c.startswith("pp 4 -> 8") and a["fits"] for c, a in changes.items())
    assert any(c.startswith("tp 1 -> 2") for c in changes)
    for a in doc["alternatives"]:  # every alternative that claims to fit really does
        if a["fits"] and a["change"].startswith(("pp", "tp", "micro")):
            assert amp_opt.evaluate(inst, parse_plan(a["plan"])).feasible


def test_block_method_alternative_is_the_fastest_count_that_fits(tmp_path):
    inst = amp_opt.load_instance(shrunk(tmp_path, "4 GiB"))
    doc = explain_plan(inst, parse_plan(PLAN))
    block = [a for a in doc["alternatives"] if "block method" in a["change"]]
    assert len(block) == 1 and block[0]["fits"]
    scored = {r: amp_opt.evaluate(inst, parse_plan(dict(PLAN, recompute="full", recompute_layers=r))) for r in range(1, 8)}
    fitting = {r: ev.predicted_time for r, ev in scored.items() if ev.feasible}
    best = min(fitting, key=fitting.get)
    assert block[0]["plan"]["recompute_layers"] == best
    assert block[0]["predicted_time"] == pytest.approx(fitting[best])
    full = next(a for a in doc["alternatives"] if a["change"] == "recompute full")
    assert block[0]["predicted_time"] < full["predicted_time"]  # fewer layers run twice


def test_per_stage_alternative_recomputes_only_the_stages_that_need_it(tmp_path):
    """On DeepSpeed, stages 0 and 1 of the plan are over 4 GiB and stages 2 and 3 are not: the
    per-stage alternative recomputes on the first two only, fits, and beats recomputing on all."""
    doc = json.loads(shrunk(tmp_path, "4 GiB").read_text())
    doc["search"]["engine"] = "deepspeed"
    path = tmp_path / "deepspeed.json"
    path.write_text(json.dumps(doc))
    inst = amp_opt.load_instance(path)
    out = explain_plan(inst, parse_plan(PLAN))
    chosen = [a for a in out["alternatives"] if a["change"].startswith("recompute per stage")]
    assert len(chosen) == 1 and chosen[0]["fits"]
    assert chosen[0]["plan"]["recompute"] == ["full", "full", "none", "none"]
    full = next(a for a in out["alternatives"] if a["change"] == "recompute full")
    assert chosen[0]["predicted_time"] < full["predicted_time"]
    assert chosen[0]["predicted_time"] == pytest.approx(amp_opt.evaluate(inst, parse_plan(chosen[0]["plan"])).predicted_time)


def test_smaller_micro_batch_alternative(tmp_path):
    inst = amp_opt.load_instance(shrunk(tmp_path, "4 GiB"))
    plan = dict(PLAN, micro_batch=2)
    doc = explain_plan(inst, parse_plan(plan))
    micro = [a for a in doc["alternatives"] if a["change"].startswith("micro_batch 2 -> 1")]
    assert len(micro) == 1 and micro[0]["plan"]["partition"] == PLAN["partition"]


def test_feasible_plan_reports_headroom(paper_instances):
    inst = paper_instances["het_cluster"]
    doc = explain_plan(inst, parse_plan(PLAN))
    assert doc["fits"] and "alternatives" not in doc
    for s in doc["stages"]:
        assert s["headroom"] == pytest.approx(s["capacity"] - s["memory"]) and s["headroom"] > 0


def test_infeasible_instance_and_relaxations(tmp_path):
    inst = amp_opt.load_instance(shrunk(tmp_path, "1.5 GiB"))
    doc = explain_instance(inst)
    assert doc["solvable"] is False and "tightest" in doc["reason"]
    by_change = {r["change"]: r for r in doc["relaxations"]}
    assert by_change["allow ZeRO stages 0-3"]["fits"] is False
    assert by_change["allow activation recomputation"]["fits"] is True
    reserve = next(r for c, r in by_change.items() if c.startswith("memory_reserve"))
    assert reserve["fits"] is True
    assert amp_opt.evaluate(inst, parse_plan(reserve["plan"])).stages  # a valid plan for the instance


def test_solvable_instance(paper_instances):
    doc = explain_instance(paper_instances["homogeneous"])
    assert doc["solvable"] is True and doc["predicted_time"] > 0


def run(*args):
    return subprocess.run([sys.executable, "-m", "amp_opt", *args], capture_output=True, text=True)


def test_cli_text_and_json(tmp_path):
    path = shrunk(tmp_path, "4 GiB")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    out = run("explain", str(path), str(plan))
    assert out.returncode == 0, out.stderr
    assert "does NOT fit" in out.stdout and "stage 0 on V100-16GB" in out.stdout and "FITS" in out.stdout
    out = run("explain", str(path), str(plan), "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["fits"] is False
    plan.write_text(json.dumps(dict(PLAN, tp=2, dp=2, sequence_parallel=True, recompute="full")))
    out = run("explain", str(path), str(plan))  # the header names every setting of the plan
    assert "tp=2 dp=2 pp=4 micro_batch=1 sequence_parallel recompute=full" in out.stdout.splitlines()[0], out.stdout + out.stderr
    out = run("explain", str(INSTANCES / "amp_homogeneous.json"))
    assert out.returncode == 0 and "solvable" in out.stdout
    out = run("explain", str(path), str(tmp_path / "missing.json"))
    assert out.returncode == 2 and "not found" in out.stderr
