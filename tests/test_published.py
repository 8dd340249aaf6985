"""benchmarks/published.py keeps working: every complete row of benchmarks/published/configs.json
becomes an instance and a plan that validate and evaluate (the accuracy is the benchmark's business,
not this test's), and the script's FLOP formulas reproduce the numbers SOURCES.md derived."""

from __future__ import annotations

import importlib.util
import json
import math
import sys

import pytest

from conftest import ROOT

import amp_opt

SCRIPT = ROOT / "benchmarks" / "published.py"
ROWS = json.loads((ROOT / "benchmarks" / "published" / "configs.json").read_text())["rows"]
COMPLETE = [row for row in ROWS if row["complete"]]


@pytest.fixture(scope="module")
def published():
    spec = importlib.util.spec_from_file_location("published_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the script loads
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[spec.name]
        raise
    return module


def test_rows_are_there():
    assert len(ROWS) == 66
    assert len(COMPLETE) == 63


def test_every_row_has_a_source_and_a_system(published):
    for row in ROWS:
        src = published.source_of(row)
        assert src.convention in published.CONVENTIONS
        assert src.system in published.SYSTEMS


def test_every_complete_row_builds_validates_and_evaluates(published):
    """The published plan with every open field at its first (the engine's default) value."""
    for row in COMPLETE:
        instance = amp_opt.load_instance(published.instance_dict(row))
        assert instance.num_devices == row["gpus"], row["id"]
        fixed, open_, _ = published.plan_space(row, instance)
        plan = dict(fixed, **{key: values[0] for key, values in open_.items()})
        boundaries, _ = published.partition(instance, plan["pp"], plan.get("virtual_stages", 1))
        assert boundaries is not None, row["id"]
        plan["partition"] = list(boundaries)
        evaluation = amp_opt.evaluate(instance, amp_opt.parse_plan(plan), "hetero")
        assert math.isfinite(evaluation.predicted_time) and evaluation.predicted_time > 0, row["id"]
        assert evaluation.devices_used == row["gpus"], row["id"]


def test_flop_formulas_reproduce_the_derived_numbers(published):
    """SOURCES.md's own derivations (iteration times, model TFLOP/s, FLOPs per token) follow from the
    script's FLOP conventions: the script and the data count the same FLOPs."""
    checked = 0
    for row in COMPLETE:
        derived, measured = row["derived"], row["measured"]
        if "iteration_time_s_from_eq3" in derived and measured.get("tflops_per_gpu"):
            time = published.narayanan_eq3(row) / (row["gpus"] * measured["tflops_per_gpu"] * 1e12)
            assert time == pytest.approx(derived["iteration_time_s_from_eq3"], rel=2e-3), row["id"]
            checked += 1
        if "model_tflops_per_gpu_eq7" in derived:
            tflops = published.korthikanti_eq7(row) / (row["gpus"] * measured["iteration_time_s"]) / 1e12
            assert tflops == pytest.approx(derived["model_tflops_per_gpu_eq7"], rel=2e-3), row["id"]
            checked += 1
        if "model_flops_per_token" in derived:
            tokens = row["global_batch"] * row["model"]["seq_len"]
            assert published.megatron_flops(row) / tokens == pytest.approx(derived["model_flops_per_token"],
                                                                           rel=1e-6), row["id"]
            checked += 1
    assert checked >= 30


def test_published_tflops_of_the_formula_rows(published):
    """Where a source prints both a time and a TFLOP/s figure, the convention links them."""
    for row in COMPLETE:
        m = row["measured"]
        if m.get("tflops_per_gpu") and m.get("iteration_time_s"):
            flops = published.CONVENTIONS[published.source_of(row).convention][1](row)
            implied = flops / (m["iteration_time_s"] * row["gpus"]) / 1e12
            assert implied == pytest.approx(m["tflops_per_gpu"], rel=0.02), row["id"]
