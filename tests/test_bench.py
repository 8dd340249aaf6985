"""Benchmark infrastructure: baselines on the paper instances, the suites, and run_bench's files."""

import csv
import json
import os
import time

import pytest

from conftest import INSTANCES

import amp_opt
from amp_opt.bench.baselines import amp_pick, even_partition, expert_default, ideal_bound
from amp_opt.bench.rows import COLUMNS, BaselineRun, SolveRun, make_row
from amp_opt.bench.run import run_bench
from amp_opt.bench.runner import run_in_child, solve_child
from amp_opt.bench.suites import describe, suite_paths
from amp_opt.model.evaluate import evaluate
from amp_opt import solve


@pytest.fixture(scope="module")
def baselines(paper_instances):
    return {exp: (amp_pick(inst), expert_default(inst), ideal_bound(inst)) for exp, inst in paper_instances.items()}


def test_amp_pick_is_the_amp_optimum_rescored(paper_instances, baselines):
    for exp, inst in paper_instances.items():
        amp, _, _ = baselines[exp]
        best = solve(inst, cost_model="amp", placement="rank-order")
        assert amp.amp_time == pytest.approx(best.best.predicted_time, rel=1e-12)
        assert amp.pick.plan == best.best.plan
        assert amp.pick.cost_model == "hetero"
        assert amp.pick.predicted_time == pytest.approx(evaluate(inst, best.best.plan, "hetero").predicted_time)
        # the paper instances' picks fit, so they are also what AMP would deploy
        assert amp.pick.feasible and amp.fitting is amp.pick and amp.fitting_rank == 1


def test_amp_pick_walks_the_ranking_when_the_pick_does_not_fit(paper_instances):
    import dataclasses

    inst = paper_instances["het_cluster"]
    # Shrink memory so that AMP's (memory-blind) pick overflows but some ranked plan still fits.
    small = dataclasses.replace(inst, device_types={k: dataclasses.replace(v, memory=3.4 * 2**30)
                                                    for k, v in inst.device_types.items()})
    amp = amp_pick(small)
    assert not amp.pick.feasible
    if amp.fitting is not None:
        assert amp.fitting.feasible and amp.fitting_rank > 1
        ranked = solve(small, cost_model="amp", placement="rank-order", top_k=amp.fitting_rank)
        assert ranked.top[-1].plan == amp.fitting.plan
        assert not any(evaluate(small, e.plan, "hetero").feasible for e in ranked.top[:-1])
    else:
        assert amp.reason


def test_expert_default_on_4_gpu_nodes(paper_instances, baselines):
    for exp, inst in paper_instances.items():
        _, expert, _ = baselines[exp]
        ev = expert.evaluation
        assert ev is not None, expert.reason
        assert ev.plan.tp == 4 and ev.feasible
        assert ev.plan.tp * ev.plan.dp * ev.plan.pp == inst.num_devices
        assert ev.plan.partition == even_partition(inst, ev.plan.pp)
        assert inst.training.global_batch % (ev.plan.dp * ev.plan.micro_batch) == 0


def test_even_partition_splits_transformers_and_keeps_embedding_and_head_outside(paper_instances):
    inst = paper_instances["het_cluster"]  # embed2h, noop0, 24 blocks, noop1, noop2, embed2v, noop3
    assert even_partition(inst, 1) == (0, 30)
    assert even_partition(inst, 4) == (0, 8, 14, 20, 30)  # 2 + 6 | 6 | 6 | 6 + 4
    bounds = even_partition(inst, 5)  # 24 blocks over 5 stages: 5 5 5 5 4
    assert bounds == (0, 7, 12, 17, 22, 30)
    assert even_partition(inst, 31) is None


def test_ideal_bound_is_below_every_plan(paper_instances, baselines):
    for exp, inst in paper_instances.items():
        amp, expert, ideal = baselines[exp]
        best = solve(inst)  # the optimum: below it means below every hetero plan
        times = [best.best.predicted_time, amp.pick.predicted_time, expert.evaluation.predicted_time]
        assert 0 < ideal.time < min(times)
        assert ideal.time == pytest.approx(
            inst.training.global_batch / sum(n / ideal.per_sample[g] for g, n in ideal.devices.items()))


def test_scale_suite_loads_and_covers_every_size():
    pairs = suite_paths("scale")
    sizes = {}
    for _, path in pairs:
        inst = amp_opt.load_instance(path)
        sizes.setdefault(inst.num_devices, []).append(inst)
        assert 1 <= len(inst.devices_by_type) <= 4
        assert 26 <= inst.num_layers <= 130
    assert set(sizes) == {16, 64, 256, 1024, 4096}
    assert any(len(i.nodes) == 128 and len(i.devices_by_type) == 4 and i.num_layers == 96 for i in sizes[1024])
    assert any(len(i.nodes) == 512 and all(n.devices == 8 for n in i.nodes) for i in sizes[4096])
    assert [p for _, p in suite_paths("paper")] == [INSTANCES / f"amp_{n}.json"
                                                   for n in ("homogeneous", "het_cluster", "het_model")]


def test_run_bench_paper_writes_consistent_files(tmp_path):
    rows = run_bench("paper", ["enumerate"], 60.0, tmp_path, progress=False)
    assert [r["instance"] for r in rows] == ["amp_homogeneous", "amp_het_cluster", "amp_het_model"]
    for row in rows:
        assert tuple(row) == COLUMNS
        assert row["status"] == "OPTIMAL" and row["gap"] == 0
        assert row["objective_s"] == pytest.approx(row["amp_opt_s"])
        assert row["ideal_s"] < row["amp_opt_s"] <= row["amp_fit_s"] * (1 + 1e-9)
        assert row["amp_opt_s"] <= row["expert_s"]
        assert row["speedup_vs_amp"] >= 1 - 1e-9 and row["ratio_to_ideal"] > 1
        assert row["peak_rss_mib"] > 0 and row["wall_s"] >= 0

    with open(tmp_path / "results.csv") as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == 3 and tuple(table[0]) == COLUMNS
    assert [r["instance"] for r in table] == [r["instance"] for r in rows]
    markdown = (tmp_path / "results.md").read_text()
    assert "Command: `run_bench(suite='paper'" in markdown and "Machine:" in markdown
    assert sum(line.startswith("| amp_") for line in markdown.splitlines()) == 3
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["columns"] == list(COLUMNS) and len(doc["rows"]) == 3


def test_a_failing_run_is_a_row_not_a_crash(tmp_path):
    # A child that raises, one that dies and one that hangs: each becomes a row.
    raised = run_in_child(solve_child, (str(tmp_path / "missing.json"), "enumerate", 5.0), 60)
    assert raised["status"] == "INPUT_ERROR" and "missing.json" in raised["error"]
    assert run_in_child(os._exit, (3,), 60)["status"] == "CRASHED"
    hung = run_in_child(time.sleep, (60,), 2.0)
    assert hung["status"] == "TIMEOUT" and hung["wall_s"] < 30
    inst = describe("paper", INSTANCES / "amp_homogeneous.json")
    run = SolveRun(status="ERROR", wall_s=0.1, peak_rss_mib=40.0, error="ImportError: no amp_opt.mip")
    base = BaselineRun(wall_s=0.1, peak_rss_mib=40.0, amp_fit_s=1.0, expert_s=2.0, ideal_s=0.5)
    row = make_row(inst, "cpsat", run, base)
    assert row["status"] == "ERROR" and row["amp_opt_s"] is None and row["speedup_vs_amp"] is None
    assert row["error"].startswith("ImportError")
