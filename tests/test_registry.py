"""The solver registry: built-in variants documented and dispatched by name; plug-ins registered,
re-scored by the evaluator, and every bad one reported in one line with exit code 2."""

import re
import subprocess
import sys
import textwrap

import pytest

from conftest import INSTANCES, ROOT

import amp_opt
from amp_opt import InputError
from amp_opt.errors import SolverFailed
from amp_opt.search import registry
from amp_opt.search.options import solve_options

# The target: a plug-in defined in a 10-line file in the current folder.
PLUGIN = textwrap.dedent('''\
    import amp_opt


    def rank_order(instance, options):
        """the exact enumerator restricted to Megatron's rank order"""
        return amp_opt.solve(instance, solver="enumerate", cost_model=options.cost_model, placement="rank-order",
                             time_limit=options.time_limit, top_k=options.top_k)


    amp_opt.register_solver("rank-order-demo", rank_order)
''')


def run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "amp_opt", *args], capture_output=True, text=True, cwd=cwd)


@pytest.fixture
def clean_registry():
    before = dict(registry._PLUGINS)
    yield
    registry._PLUGINS.clear()
    registry._PLUGINS.update(before)


def test_every_builtin_name_is_documented_with_its_line():
    doc = (ROOT / "formulations" / "variants.md").read_text()
    names = doc.split("## The names", 1)[1].split("\n## ", 1)[0]
    listed = dict(re.findall(r"^\| `([a-z0-9-]+)` \| (.*) \|$", names, flags=re.M))
    assert set(listed) == set(registry.BUILTIN), set(registry.BUILTIN) ^ set(listed)
    for name, entry in registry.BUILTIN.items():
        assert entry.description == listed[name] and entry.builtin


def test_a_variant_is_a_name_bound_to_option_values():
    assert solve_options(solver="cpsat-nokinds").kinds is False
    opts = solve_options(solver="highs-assign-nokinds")
    assert (opts.backend, opts.layers, opts.kinds, opts.warm_start) == ("highs", "assignment", False, True)
    full = solve_options(solver="cbc")
    assert (full.kinds, full.incumbents, full.warm_start, full.cutoffs, full.symmetry, full.layers) == \
        (True, True, True, True, True, "prefix")
    for suffix, field in [("nodp", "incumbents"), ("nowarm", "warm_start"), ("nocutoff", "cutoffs"),
                          ("nosym", "symmetry")]:
        assert getattr(solve_options(solver=f"cpsat-{suffix}"), field) is False


def test_unknown_solver_lists_the_known_ones():
    with pytest.raises(InputError, match="unknown solver 'nope'; known solvers: auto, enumerate, cpsat"):
        amp_opt.solve(None, solver="nope")
    out = run("solve", str(INSTANCES / "amp_homogeneous.json"), "--solver", "nope")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "highs-assign" in out.stderr and "--solver" in out.stderr


def test_register_solver_checks_its_arguments(clean_registry):
    with pytest.raises(InputError, match="must be callable"):
        amp_opt.register_solver("x", 3)
    with pytest.raises(InputError, match="built-in"):
        amp_opt.register_solver("cpsat", lambda i, o: None)
    with pytest.raises(InputError, match="no commas"):
        amp_opt.register_solver("a,b", lambda i, o: None)


def test_a_plugin_runs_by_name_and_is_rescored(clean_registry, paper_instances):
    inst = paper_instances["het_cluster"]
    calls = []

    def fixed(instance, options):
        """always the same plan"""
        calls.append((options.cost_model, options.placement, options.time_limit, options.seed, options.top_k))
        plan = amp_opt.parse_plan({"tp": 1, "dp": 4, "pp": 4, "micro_batch": 1, "partition": [0, 7, 14, 20, 30]})
        result = amp_opt.result_from_plans(instance, [plan], options)
        # A plug-in that misreports its own objective: the evaluator's score is what counts.
        stats = amp_opt.SolverStats("fixed", "FEASIBLE", 0.0, 1.0, 0.5)
        return amp_opt.SolveResult(result.best, result.top, stats)

    amp_opt.register_solver("fixed", fixed)
    assert registry.solvers()["fixed"].description == "always the same plan"
    result = amp_opt.solve(inst, solver="fixed", time_limit=7, seed=3)
    assert calls == [("hetero", "free", 7.0, 3, 1)]
    expected = amp_opt.evaluate(inst, result.best.plan).predicted_time
    assert result.solver.objective == expected and result.best.predicted_time == expected
    assert result.solver.extra["claimed_objective"] == 1.0 and result.solver.name == "fixed"
    assert result.solver.bound == 0.5 and result.solver.status == "FEASIBLE"


@pytest.mark.parametrize("body, message", [
    ("raise RuntimeError('solver exploded')", "raised RuntimeError: solver exploded"),
    ("return 42", "returned int, not an amp_opt.SolveResult"),
    ("return bad_plan(instance, options)", "invalid plan"),
    ("return too_big(instance, options)", "evaluator rejects"),
    ("return high_bound(instance, options)", "lower bound .* above its best plan"),
])
def test_a_plugin_that_fails_is_a_solver_failure(clean_registry, paper_instances, body, message):
    def bad_plan(instance, options):
        good = amp_opt.solve(instance, solver="enumerate", placement="rank-order")
        plan = amp_opt.parse_plan({"tp": 1, "dp": 4, "pp": 4, "micro_batch": 1, "partition": [0, 7, 14, 20, 31]})
        ev = good.best.__class__(**{**good.best.__dict__, "plan": plan})
        return amp_opt.SolveResult(ev, (ev,), good.solver)

    def too_big(instance, options):  # a plan that needs far more memory than a 16 GiB device has
        plan = amp_opt.parse_plan({"tp": 1, "dp": 1, "pp": 16, "micro_batch": 32,
                                   "partition": [0, 2, 4, 6, 8, 10, 12, 14, 16, 17, 18, 19, 20, 21, 22, 23, 30]})
        return amp_opt.result_from_plans(instance, [plan], options)

    def high_bound(instance, options):
        good = amp_opt.solve(instance, solver="enumerate", placement="rank-order")
        import dataclasses
        return dataclasses.replace(good, solver=dataclasses.replace(good.solver, bound=2 * good.solver.objective))

    namespace = {"amp_opt": amp_opt, "bad_plan": bad_plan, "too_big": too_big, "high_bound": high_bound}
    exec(f"def plug(instance, options):\n    {body}\n", namespace)
    amp_opt.register_solver("plug", namespace["plug"])
    with pytest.raises(SolverFailed, match=message):
        amp_opt.solve(paper_instances["het_cluster"], solver="plug")


def test_ten_line_plugin_in_the_current_folder_runs_through_solve_and_bench(tmp_path):
    (tmp_path / "myplug.py").write_text(PLUGIN)
    assert len(PLUGIN.splitlines()) <= 10
    inst = str(INSTANCES / "amp_het_model.json")
    out = run("solve", inst, "--plugin", "myplug", "--solver", "rank-order-demo", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    import json
    doc = json.loads(out.stdout)
    assert doc["solver"]["name"] == "rank-order-demo" and doc["solver"]["status"] == "OPTIMAL"
    reference = amp_opt.solve(amp_opt.load_instance(inst), solver="enumerate", placement="rank-order")
    assert doc["predicted_time"] == pytest.approx(reference.best.predicted_time, rel=1e-12)
    listed = run("bench", "--plugin", "myplug", "--list-solvers", cwd=tmp_path)
    assert listed.returncode == 0 and re.search(r"^rank-order-demo +the exact enumerator .*\[plug-in: myplug\]$",
                                                listed.stdout, flags=re.M)
    bench = run("bench", inst, "--plugin", "myplug", "--solvers", "rank-order-demo,enumerate", "--time-limit", "30",
                "--no-baselines", "--quiet", "--out", "out", cwd=tmp_path)
    assert bench.returncode == 0, bench.stderr
    import csv
    rows = list(csv.DictReader(open(tmp_path / "out" / "results.csv")))
    assert [(r["solver"], r["status"]) for r in rows] == [("rank-order-demo", "OPTIMAL"), ("enumerate", "OPTIMAL")]
    assert float(rows[0]["objective"]) == pytest.approx(reference.best.predicted_time, rel=1e-12)


@pytest.mark.parametrize("source, problem", [
    ("import amp_opt\namp_opt.register_solver('broken', 'not a function')\n",
     "module 'plug': solver 'broken': solve_fn must be callable, got str"),
    ("raise ImportError('needs gurobipy')\n", "module 'plug' failed to import: ImportError: needs gurobipy"),
    ("x = 1\n", "module 'plug' registered no solver"),
    ("def broken(:\n", "module 'plug' failed to import: SyntaxError"),
])
def test_a_bad_plugin_is_one_line_naming_the_module_exit_2(tmp_path, source, problem):
    (tmp_path / "plug.py").write_text(source)
    for command in (["solve", str(INSTANCES / "amp_homogeneous.json"), "--solver", "broken"],
                    ["bench", "--solvers", "broken"]):
        out = run(*command, "--plugin", "plug", cwd=tmp_path)
        assert out.returncode == 2, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1 and problem in out.stderr, out.stderr
    missing = run("bench", "--plugin", "nosuchplugin", cwd=tmp_path)
    assert missing.returncode == 2 and "module 'nosuchplugin' not found" in missing.stderr


def test_highs_keeps_json_output_clean():
    """highspy prints a banner on stdout when constructed; `--json` must stay parseable."""
    pytest.importorskip("highspy")
    import json

    out = run("solve", str(INSTANCES / "amp_het_cluster.json"), "--solver", "highs", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["plan"]["tp"] >= 1
