"""Benchmark infrastructure: baselines on the paper instances, the suites, run_bench's files, jobs
that fail, hang or crash, any instance paths, and the same rows whichever way the jobs ran."""

import csv
import importlib.util
import json
import math
import os
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import INSTANCES

import amp_opt
from amp_opt import InputError
from amp_opt.bench import stats
from amp_opt.bench.baselines import amp_optimum, even_partition, expert_default, ideal_bound
from amp_opt.bench.rows import COLUMNS, TIMING_COLUMNS, BaselineRun, SolveRun, make_row
from amp_opt.bench.run import run_bench
from amp_opt.bench.runner import instance_spec, plugin_specs, run_job, solve_job_spec
from amp_opt.bench.suites import describe, expand_paths, suite_paths
from amp_opt.model.evaluate import evaluate
from amp_opt.model.generate import generate_instance
from amp_opt import solve


@pytest.fixture(scope="module")
def baselines(paper_instances):
    return {exp: (amp_optimum(inst), expert_default(inst), ideal_bound(inst)) for exp, inst in paper_instances.items()}


def test_amp_optimum_is_the_amp_models_optimum_rescored(paper_instances, baselines):
    for exp, inst in paper_instances.items():
        amp, _, _ = baselines[exp]
        best = solve(inst, cost_model="amp", placement="rank-order")
        assert amp.amp_time == pytest.approx(best.best.predicted_time, rel=1e-12)
        assert amp.optimum.plan == best.best.plan
        assert amp.optimum.cost_model == "hetero"
        assert amp.optimum.predicted_time == pytest.approx(evaluate(inst, best.best.plan, "hetero").predicted_time)
        # the paper instances' amp-model optima fit, so they are also what AMP would deploy
        assert amp.optimum.feasible and amp.fitting is amp.optimum and amp.fitting_rank == 1


def test_amp_optimum_walks_the_ranking_when_the_optimum_does_not_fit(paper_instances):
    import dataclasses

    inst = paper_instances["het_cluster"]
    # Shrink memory so that the (memory-blind) amp-model optimum overflows but some ranked plan still fits.
    small = dataclasses.replace(inst, device_types={k: dataclasses.replace(v, memory=3.4 * 2**30)
                                                    for k, v in inst.device_types.items()})
    amp = amp_optimum(small)
    assert not amp.optimum.feasible
    if amp.fitting is not None:
        assert amp.fitting.feasible and amp.fitting_rank > 1
        ranked = solve(small, cost_model="amp", placement="rank-order", top_k=amp.fitting_rank, per_candidate=True)
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
    boundaries = even_partition(inst, 5)  # 24 blocks over 5 stages: 5 5 5 5 4
    assert boundaries == (0, 7, 12, 17, 22, 30)
    assert even_partition(inst, 31) is None


def test_ideal_bound_is_below_every_plan(paper_instances, baselines):
    for exp, inst in paper_instances.items():
        amp, expert, ideal = baselines[exp]
        best = solve(inst)  # the optimum: below it means below every hetero plan
        times = [best.best.predicted_time, amp.optimum.predicted_time, expert.evaluation.predicted_time]
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
    assert [p.name for _, p in suite_paths("paper")] == [f"amp_{n}.json"
                                                        for n in ("homogeneous", "het_cluster", "het_model")]


def test_run_bench_paper_writes_consistent_files(tmp_path):
    rows = run_bench("paper", ["enumerate"], 60.0, tmp_path, progress=False)
    assert [r["instance"] for r in rows] == ["amp_homogeneous", "amp_het_cluster", "amp_het_model"]
    for row in rows:
        assert tuple(row) == COLUMNS
        assert row["status"] == "OPTIMAL" and row["gap"] == 0 and row["solved"] is True and row["wrong"] == ""
        assert (row["repeat"], row["seed"], row["time_limit"]) == (0, 0, 60.0)
        assert row["objective"] == pytest.approx(row["amp_opt_s"])
        assert row["ideal_s"] < row["amp_opt_s"] <= row["amp_fit_s"] * (1 + 1e-9)
        assert row["amp_opt_s"] <= row["expert_s"]
        # the amp-model optimum (not AMP's own plan): the amp model's exact optimum, re-scored
        assert row["amp_optimum_fits"] is True and row["amp_fit_s"] == row["amp_optimum_s"]
        assert row["speedup_vs_amp"] >= 1 - 1e-9 and row["ratio_to_ideal"] > 1
        assert row["peak_rss_mib"] > 0 and row["wall_time"] >= 0
        assert 0 <= row["time_to_first"] <= row["time_to_1pct_gap"] <= row["wall_time"]
        # gap 1 until the first plan, then at most 1 (the first plan need not be the best: candidates
        # with virtual stages come after cheaper-bounded ones)
        assert row["time_to_first"] - 1e-9 <= row["primal_integral"] <= row["wall_time"] + 1e-9

    with open(tmp_path / "results.csv") as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == 3 and tuple(table[0]) == COLUMNS
    assert tuple(table[0])[:9] == ("instance", "solver", "repeat", "seed", "status", "objective", "bound", "gap",
                                   "wall_time")
    assert [r["instance"] for r in table] == [r["instance"] for r in rows]
    markdown = (tmp_path / "results.md").read_text()
    assert "Command: `run_bench(suite='paper'" in markdown and "Machine:" in markdown
    assert "| enumerate | 3 | 3 | 3 | 0 | 0 | 0 |" in markdown  # runs, solved, optimal, infeasible, wrong, failed
    assert sum(line.startswith("| amp_") for line in markdown.splitlines()) == 3
    assert "| amp fit s |" in markdown and "amp fit: the amp-model optimum if it fits" in markdown
    assert not any("pick" in c for c in COLUMNS)
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["columns"] == list(COLUMNS) and len(doc["rows"]) == 3
    assert all(r["trace"] and r["plan_json"]["partition"][-1] == 30 for r in doc["rows"][:2])
    assert doc["summary"][0]["solver"] == "enumerate" and doc["summary"][0]["solved"] == 3
    plots = ("profile.png", "primal.png", "results.png") if importlib.util.find_spec("matplotlib") else ()
    for name in plots + ("programs.csv",):  # the plots need the plot extra
        assert (tmp_path / name).exists(), name


# ------------------------------------------------------------------ jobs that fail, crash or hang

PLUGINS = textwrap.dedent('''\
    import os, subprocess, sys, time
    import amp_opt

    def raises(instance, options):
        raise RuntimeError("plug-in exploded")

    def too_big(instance, options):  # a plan no 16 GiB device can hold
        plan = amp_opt.parse_plan({"tp": 1, "dp": 1, "pp": 16, "micro_batch": 32,
                                   "partition": [0, 2, 4, 6, 8, 10, 12, 14, 16, 17, 18, 19, 20, 21, 22, 23, 30]})
        return amp_opt.result_from_plans(instance, [plan], options)

    def dies(instance, options):
        os._exit(3)

    def hangs(instance, options):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(os.environ["AMP_OPT_TEST_PID"], "w") as fh:
            fh.write(str(child.pid))
        time.sleep(600)

    for fn in (raises, too_big, dies, hangs):
        amp_opt.register_solver("test-" + fn.__name__.replace("_", "-"), fn)
''')


@pytest.fixture
def plugin_file(tmp_path):
    path = tmp_path / "failing_plugins.py"
    path.write_text(PLUGINS)
    yield str(path)
    from amp_opt.search import registry

    for name in [n for n in registry._PLUGINS if n.startswith("test-")]:
        del registry._PLUGINS[name]


def test_a_failing_run_is_a_row_and_the_sweep_goes_on(tmp_path, plugin_file):
    rows = run_bench(None, ["test-raises", "test-too-big", "test-dies", "enumerate"], 30, tmp_path / "out",
                     progress=False, paths=[str(INSTANCES / "amp_het_cluster.json")], baselines=False,
                     plugins=[plugin_file])
    by = {r["solver"]: r for r in rows}
    assert by["test-raises"]["status"] == "FAILED" and "raised RuntimeError: plug-in exploded" in by["test-raises"]["error"]
    assert by["test-too-big"]["status"] == "FAILED" and "evaluator rejects" in by["test-too-big"]["error"]
    assert "GiB" in by["test-too-big"]["error"] or "memory" in by["test-too-big"]["error"]
    assert by["test-dies"]["status"] == "CRASHED" and "exit code 3" in by["test-dies"]["error"]
    assert by["enumerate"]["status"] == "OPTIMAL" and by["enumerate"]["solved"]
    assert not any(by[s]["solved"] for s in ("test-raises", "test-too-big", "test-dies"))
    summary = {s["solver"]: s for s in stats.solver_summary(rows)}
    assert summary["test-raises"]["failed"] == 1 and summary["test-raises"]["sgm_time"] == pytest.approx(30.0)
    assert "FAILED" in (tmp_path / "out" / "results.md").read_text()


def test_a_hung_job_is_killed_with_everything_it_started(tmp_path, plugin_file, monkeypatch):
    pid_file = tmp_path / "grandchild.pid"
    monkeypatch.setenv("AMP_OPT_TEST_PID", str(pid_file))
    job = solve_job_spec(instance_spec(INSTANCES / "amp_homogeneous.json"), "test-hangs", 60,
                         plugins=plugin_specs([plugin_file]))
    start = time.perf_counter()
    answer = run_job(job, deadline_s=6.0)
    assert answer["status"] == "TIMEOUT" and time.perf_counter() - start < 20
    grandchild = int(pid_file.read_text())
    for _ in range(50):  # the process group was killed; give the kernel a moment to reap
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        with open(f"/proc/{grandchild}/stat") as fh:  # a zombie (killed, not yet reaped by init) is gone too
            assert fh.read().split()[2] == "Z"


# ------------------------------------------------------------------ instance paths and bad input

def test_paths_take_files_folders_and_globs(tmp_path):
    for seed in (1, 2):
        doc = generate_instance(seed, nodes=2, devices_per_node=2, device_types=2, layers=6, global_batch=8)
        (tmp_path / f"gen{seed}.json").write_text(json.dumps(doc))
    pairs = expand_paths([str(tmp_path), str(INSTANCES / "amp_het_model.json"), str(INSTANCES / "amp_h*.json")])
    assert [p.name for _, p in pairs] == ["gen1.json", "gen2.json", "amp_het_model.json", "amp_het_cluster.json",
                                          "amp_homogeneous.json"]  # each file once, in the order given
    assert pairs[0][0] == tmp_path.name


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "amp_opt", *args], capture_output=True, text=True, cwd=cwd)


@pytest.mark.parametrize("make, message", [
    (lambda d: (d / "empty").mkdir() or d / "empty", "folder holds no instance files"),
    (lambda d: (d / "notes.json").write_text(json.dumps({"hello": 1})) and d / "notes.json", "not a valid instance"),
    (lambda d: (d / "bad.json").write_text("{oops") and d / "bad.json", "not valid JSON"),
    (lambda d: d / "nothing-*.json", "no instance file matches"),
    (lambda d: d / "missing.json", "no such instance file or folder"),
])
def test_bad_paths_exit_2_naming_them(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(InputError, match=message):
        run_bench(None, ["enumerate"], 5, tmp_path / "out", progress=False, paths=[str(path)])
    out = run_cli("bench", str(path), "--out", str(tmp_path / "out"))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert str(path.name) in out.stderr and message in out.stderr, out.stderr


def test_unknown_solver_in_bench_lists_the_known_ones(tmp_path):
    out = run_cli("bench", "--solvers", "enumerate,gurobi", "--out", str(tmp_path))
    assert out.returncode == 2 and "unknown solver 'gurobi'; known solvers: auto, enumerate" in out.stderr


# ------------------------------------------------------------------ the same rows whichever way the jobs ran

def small_suite(tmp_path):
    folder = tmp_path / "suite"
    folder.mkdir()
    doc = generate_instance(5, nodes=3, devices_per_node=2, device_types=2, layers=7, global_batch=8)
    (folder / "small5.json").write_text(json.dumps(doc))
    return [str(folder), str(INSTANCES / "amp_het_model.json")]


SWEEP_SOLVERS = ["enumerate", "cbc-nowarm", "highs-assign"]


def comparable(rows):
    return [{k: v for k, v in row.items() if k not in TIMING_COLUMNS} for row in rows]


@pytest.fixture(scope="module")
def serial_sweep(tmp_path_factory):
    pytest.importorskip("highspy")
    tmp = tmp_path_factory.mktemp("serial")
    paths = small_suite(tmp)
    return paths, run_bench(None, SWEEP_SOLVERS, 60, tmp / "out", progress=False, paths=paths, repeats=2, seed=4,
                            baselines=False)


def test_repeats_run_with_consecutive_seeds(serial_sweep):
    _, rows = serial_sweep
    assert len(rows) == 2 * len(SWEEP_SOLVERS) * 2
    assert [(r["repeat"], r["seed"]) for r in rows[:2]] == [(0, 4), (1, 5)]
    assert all(r["status"] == "OPTIMAL" and r["solved"] for r in rows)
    var = {v["solver"]: v for v in stats.variability(rows)}
    assert var["cbc-nowarm"]["instances"] == 2 and var["cbc-nowarm"]["repeats"] == 2
    assert var["cbc-nowarm"]["plan_differs"] == 0


def test_parallel_jobs_give_the_same_rows(serial_sweep, tmp_path):
    paths, serial = serial_sweep
    parallel = run_bench(None, SWEEP_SOLVERS, 60, tmp_path / "out", progress=False, paths=paths,
                         repeats=2, seed=4, baselines=False, jobs=2)
    assert comparable(parallel) == comparable(serial)


def test_a_dask_cluster_gives_the_same_rows(serial_sweep, tmp_path):
    distributed = pytest.importorskip("distributed")
    paths, serial = serial_sweep
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, resources={"cores": 1},
                                  dashboard_address=None) as cluster:
        rows = run_bench(None, SWEEP_SOLVERS, 60, tmp_path / "out", progress=False, paths=paths,
                         repeats=2, seed=4, baselines=False, scheduler=cluster.scheduler_address)
    assert comparable(rows) == comparable(serial)
    assert "dask scheduler" in (tmp_path / "out" / "results.md").read_text()


def test_an_unreachable_scheduler_is_bad_input(tmp_path, monkeypatch):
    pytest.importorskip("distributed")
    from amp_opt.bench import executors

    monkeypatch.setattr(executors, "CONNECT_TIMEOUT", "1s")
    with pytest.raises(InputError, match="cannot connect to the Dask scheduler"):
        run_bench("paper", ["enumerate"], 5, tmp_path, progress=False, scheduler="tcp://127.0.0.1:9")


# ------------------------------------------------------------------ the field's statistics

def row(instance, solver, status, wall, value=None, repeat=0, limit=10.0, bound=None):
    return {"instance": instance, "solver": solver, "repeat": repeat, "status": status, "wall_time": wall,
            "amp_opt_s": value, "objective": value, "bound": bound if bound is not None else value,
            "time_limit": limit}


def test_shifted_geometric_mean_charges_unsolved_runs_the_limit():
    assert stats.shifted_geomean([0.0, 3.0]) == pytest.approx(math.sqrt(1 * 4) - 1)
    rows = [row("a", "x", "OPTIMAL", 1.0, 5.0), row("b", "x", "FEASIBLE", 2.0, 5.0), row("c", "x", "FAILED", 0.1)]
    stats.mark_wrong(rows)
    [summary] = stats.solver_summary(rows)
    assert summary["solved"] == 1 and summary["failed"] == 1
    assert summary["sgm_time"] == pytest.approx((2 * 11 * 11) ** (1 / 3) - 1)


def test_a_proof_contradicted_by_another_run_is_wrong():
    rows = [row("a", "x", "OPTIMAL", 1.0, 5.0), row("a", "y", "OPTIMAL", 1.0, 4.0),
            row("b", "x", "INFEASIBLE", 1.0), row("b", "y", "FEASIBLE", 1.0, 3.0, bound=1.0)]
    stats.mark_wrong(rows)
    assert [bool(r["wrong"]) for r in rows] == [True, False, True, False]
    assert [r["solved"] for r in rows] == [False, True, False, False]


def test_performance_profile_counts_every_problem():
    rows = [row("a", "x", "OPTIMAL", 1.0, 1.0), row("a", "y", "OPTIMAL", 4.0, 1.0),
            row("b", "x", "FEASIBLE", 10.0, 2.0), row("b", "y", "OPTIMAL", 2.0, 2.0),
            row("c", "x", "FEASIBLE", 10.0, 2.0), row("c", "y", "FEASIBLE", 10.0, 2.0)]
    stats.mark_wrong(rows)
    problems, ratios = stats.performance_profile(rows)
    assert len(problems) == 3 and ratios["x"] == [1.0, math.inf, math.inf] and ratios["y"] == [4.0, 1.0, math.inf]
    assert stats.profile_value(ratios["y"], 1.0) == pytest.approx(1 / 3)
    assert stats.profile_value(ratios["y"], 4.0) == pytest.approx(2 / 3)


def test_primal_integral_follows_berthold():
    # No plan for 1 s, then a plan 25% worse than the best known, then the best at 3 s; horizon 10 s.
    points = [(1.0, 5.0, -math.inf), (3.0, 4.0, 4.0)]
    assert stats.primal_integral(points, 4.0, 10.0) == pytest.approx(1.0 + 2.0 * (1.0 / 5.0))
    assert stats.primal_integral([], 4.0, 10.0) == pytest.approx(10.0)
    rows = [dict(row("a", "x", "OPTIMAL", 3.0, 4.0), time_to_first=None)]
    stats.mark_wrong(rows)
    stats.fill_primal_integrals(rows, {("a", "x", 0): points})
    assert rows[0]["primal_integral"] == pytest.approx(1.4)
    stats.fill_times(rows[0], points)
    assert (rows[0]["time_to_first"], rows[0]["time_to_1pct_gap"]) == (1.0, 3.0)


def test_make_row_without_baselines_leaves_them_empty():
    inst = describe("paper", INSTANCES / "amp_homogeneous.json")
    run = SolveRun(status="FAILED", wall_time=0.1, peak_rss_mib=40.0, error="ImportError: no highspy")
    made = make_row(inst, "highs", run, None, repeat=1, seed=7, time_limit=5.0)
    assert made["status"] == "FAILED" and made["amp_opt_s"] is None and made["speedup_vs_amp"] is None
    assert (made["repeat"], made["seed"], made["amp_fit_s"]) == (1, 7, None) and made["error"].startswith("ImportError")
    base = BaselineRun(wall_s=0.1, peak_rss_mib=40.0, amp_fit_s=1.0, expert_s=2.0, ideal_s=0.5)
    ok = make_row(inst, "x", SolveRun(status="OPTIMAL", wall_time=1, peak_rss_mib=1, plan_time=0.8), base)
    assert ok["speedup_vs_amp"] == pytest.approx(1.25) and ok["ratio_to_ideal"] == pytest.approx(1.6)


def test_a_worker_without_the_plugin_module_imports_the_source_the_job_carries(tmp_path, monkeypatch):
    """On a remote worker the plug-in's folder may not exist: the job carries a single-file module's source."""
    from amp_opt.bench.child import load_job_plugins
    from amp_opt.search import registry

    monkeypatch.chdir(tmp_path)  # the module is nowhere on the path
    source = "import amp_opt\namp_opt.register_solver('shipped-demo', lambda instance, options: None)\n"
    try:
        load_job_plugins({"plugins": [{"spec": "amp_opt_shipped_demo", "module": "amp_opt_shipped_demo",
                                       "source": source}]})
        assert "shipped-demo" in registry.solvers()
    finally:
        registry._PLUGINS.pop("shipped-demo", None)
        sys.modules.pop("amp_opt_shipped_demo", None)
