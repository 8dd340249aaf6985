"""The program over stage graphs (formulations/uneven-search.md, S5): on random graphs it equals every
path listed by brute force, and in the uneven search every MIP backend's program equals the brute force
over the uneven plans alone, without the uniform search's cutoff to lean on."""

import math

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import amp_opt
from amp_opt.bench.brute import _score, uneven_plans
from amp_opt.model.tables import Tables
from amp_opt.search import uneven
from amp_opt.search.clock import Clock
from amp_opt.search.mip import graph_program
from amp_opt.search.mip.backends import BACKENDS, Settings
from amp_opt.search.options import solve_options
from amp_opt.search.partition import every_path, path_value
from amp_opt.search.uneven_space import configurations
from tests.test_partition import random_graph
from tests.test_uneven import tiny_uneven


def _least(graphs, scales):
    values = [scale * v for g, scale in zip(graphs, scales) for v, _ in every_path(g)]
    return min(values) if values else None


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), L=st.integers(1, 5), p=st.integers(1, 3), states=st.integers(1, 3),
       n=st.sampled_from([1, 2, 8]), schedule=st.sampled_from(["closed", "1f1b", "random"]),
       graphs=st.integers(1, 3), backend=st.sampled_from(sorted(BACKENDS)))
@example(seed=96601, L=2, p=2, states=1, n=1, schedule="closed", graphs=1, backend="cpsat")  # no first stage fits
@example(seed=313, L=2, p=2, states=2, n=1, schedule="closed", graphs=3, backend="cbc")  # bounds at a coefficient
def test_the_program_equals_every_path_of_every_graph(seed, L, p, states, n, schedule, graphs, backend):
    """Graphs of several states and transitions (free grouping's form), of different depths, weighed
    by different scales (the cost objective's rates): the program's optimum is the least scaled value
    over every path of every graph, and the path it returns has that value."""
    gs = [random_graph(seed + i, L, max(1, min(p - i % 2, L)), states, n, schedule) for i in range(graphs)]
    scales = [1.0 + 0.5 * i for i in range(graphs)]
    truth = _least(gs, scales)
    parts = [graph_program.columns(g, scale) for g, scale in zip(gs, scales)]
    out, solution, _ = graph_program.solve_graphs(parts, backend=backend, clock=Clock.of(None), settings=Settings())
    if truth is None:
        assert out.status == "INFEASIBLE" and solution is None
        return
    assert out.status == "OPTIMAL"
    g, path = solution
    assert scales[g] * path_value(gs[g], path) == pytest.approx(truth, rel=1e-7)


@pytest.mark.slow
@settings(max_examples=2000, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10**6), L=st.integers(1, 5), p=st.integers(1, 3), states=st.integers(1, 3),
       n=st.sampled_from([1, 2, 8]), schedule=st.sampled_from(["closed", "1f1b", "random"]),
       graphs=st.integers(1, 3), backend=st.sampled_from(sorted(BACKENDS)))
def test_the_program_equals_every_path_on_many_graphs(seed, L, p, states, n, schedule, graphs, backend):
    """The test above on many more examples (a bound at a coefficient showed on a few per thousand)."""
    test_the_program_equals_every_path_of_every_graph.hypothesis.inner_test(seed, L, p, states, n, schedule,
                                                                            graphs, backend)


def test_an_excluded_graph_is_not_chosen_and_a_cutoff_below_every_path_is_infeasible():
    gs = [random_graph(11, 5, 3, 1, 8, "1f1b"), random_graph(12, 5, 2, 1, 8, "1f1b")]
    parts = [graph_program.columns(g) for g in gs]
    best = [_least([g], [1.0]) for g in gs]
    first = min(range(2), key=lambda i: best[i])
    out, (g, _), _ = graph_program.solve_graphs(parts, backend="cpsat", clock=Clock.of(None), settings=Settings(),
                                                excluded=frozenset({first}))
    assert g == 1 - first and out.objective == pytest.approx(best[1 - first], rel=1e-7)
    out, solution, _ = graph_program.solve_graphs(parts, backend="cpsat", clock=Clock.of(None),
                                                  settings=Settings(), cutoff=0.5 * min(best))
    assert out.status == "INFEASIBLE" and solution is None


def _uneven_truth(inst, objective):
    tables = Tables(inst)
    values = [v for doc in uneven_plans(inst) if (v := _score(inst, doc, "hetero", tables, objective)) is not None]
    return min(values) if values else None


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.fixed_dictionaries({"seed": st.integers(0, 2**31 - 1), "devices": st.integers(2, 3),
                                   "layers": st.integers(3, 4), "batch": st.sampled_from([4, 8]),
                                   "idle": st.booleans()}),
       objective=st.sampled_from(["time", "cost"]), solver=st.sampled_from(["cpsat", "cbc", "highs"]))
def test_the_program_over_configurations_equals_the_brute_force_over_uneven_plans(case, objective, solver):
    """No cutoff from the uniform search: the program alone must find the best plan whose stages or
    replicas differ, as the brute force over those plans and the DP per configuration do."""
    inst = tiny_uneven(**case)
    truth = _uneven_truth(inst, objective)
    confs, complete = configurations(inst, limit=uneven.MAX_CONFIGURATIONS)
    assert complete
    got = {}
    for name in (solver, "auto"):
        options = solve_options(solver=name, objective=objective)
        found, done, by, _ = uneven.search_uneven(inst, options, Tables(inst), confs, cutoff=math.inf,
                                               clock=Clock.of(None))
        assert done and by == ("DP" if name == "auto" else "program")
        got[name] = None if not found else (found[0].cost if objective == "cost" else found[0].predicted_time)
    if truth is None:
        assert got == {solver: None, "auto": None}
    else:
        assert got[solver] == pytest.approx(truth, rel=1e-7) and got["auto"] == pytest.approx(truth, rel=1e-7)


def test_top_k_and_a_program_too_large_for_the_limit(monkeypatch):
    """top_k plans come one solve each, the graphs of the plans before excluded: the same values as the
    DP's one plan per configuration and setting; past PROGRAM_BINARIES the DP searches and says so."""
    inst = tiny_uneven(0)
    confs, _ = configurations(inst, limit=uneven.MAX_CONFIGURATIONS)

    def values(solver):
        found, done, by, _ = uneven.search_uneven(inst, solve_options(solver=solver, top_k=3), Tables(inst), confs,
                                               cutoff=math.inf, clock=Clock.of(None))
        return [e.predicted_time for e in found], by

    program, by = values("highs")
    assert by == "program" and len(program) == 3
    assert program == pytest.approx(values("auto")[0], rel=1e-7)
    monkeypatch.setattr(uneven, "PROGRAM_BINARIES", 10)
    dp, by = values("highs")
    assert by == "DP (a program of more than 10 binaries)" and dp == pytest.approx(program, rel=1e-7)
    result = amp_opt.solve(inst, solver="cpsat")
    assert result.solver.extra["uneven"]["by"].startswith("DP (a program")


def test_a_program_stopped_by_the_time_limit_keeps_a_bound_that_holds():
    """Stopped early, the program's proven bound (less CP-SAT's rounding, at most the cutoff) enters the
    solve's bound: FEASIBLE, and the bound no more than the optimum the DP finds without a limit (16
    layers on 4 GPUs: 228 configurations, a program of 36,707 binaries, uneven_program.md)."""
    from amp_opt.model.generate import generate_instance

    doc = generate_instance(2, nodes=4, devices_per_node=1, device_types=2, layers=16, global_batch=8)
    doc["search"].update({"engine": "amp_opt", "micro_batches": [1, 2, 4], "recompute": ["none", "full"],
                          "zero_stages": [0, 1], "sequence_parallel": [False], "virtual_stages": [1], "idle": True})
    inst = amp_opt.parse_instance(doc)
    optimum = amp_opt.solve(inst).best.predicted_time
    stopped = amp_opt.solve(inst, solver="cpsat", time_limit=2)  # the program alone takes about 5 s here
    assert stopped.solver.extra["uneven"]["by"] == "program"
    assert 0 <= stopped.solver.bound <= optimum * (1 + 1e-9) <= stopped.best.predicted_time * (1 + 2e-9)
    if not stopped.solver.extra["uneven"]["searched_whole"]:  # (a machine fast enough ends it in time)
        assert stopped.solver.status == "FEASIBLE"


def test_what_a_solve_proved():
    from amp_opt.search.mip.backends import Outcome
    from amp_opt.search.mip.linear import LinearModel

    form = graph_program.GraphProgram(LinearModel(), {}, 3, 1.0, cutoff=2.0)
    infeasible = Outcome("INFEASIBLE", None, None, None, 0.0)
    assert form.proven(infeasible) == 2.0  # no solution at most the cutoff
    assert form.proven(Outcome("FEASIBLE", {}, 3.0, 2.5, 0.0), tol=0.1) == 2.0  # it bounds only what is below 2
    assert form.proven(Outcome("FEASIBLE", {}, 3.0, 1.5, 0.0), tol=0.1) == pytest.approx(1.4)
    assert form.proven(Outcome("UNKNOWN", None, None, None, 0.0)) == 0.0
    form.cutoff = None
    assert form.proven(infeasible) == math.inf
