"""Plans whose stages and replicas differ (docs/hetero-plans.md): the record, its JSON form
and its checks; the pricing of such plans by the one evaluator; the brute force and the search
over them on tiny instances."""

import json
from pathlib import Path

import jsonschema
import pytest

import amp_opt
from amp_opt import InputError, parse_instance, parse_plan
from amp_opt.model.generate import generate_instance
from amp_opt.model.plan import check_plan
from amp_opt.search.uneven import ONE_PIPELINE

from test_brute import space_left

SCHEMA = json.loads((Path(amp_opt.__file__).parent / "schema" / "plan.schema.json").read_text())


def two_types(engine="amp_opt", *, nodes=4, per_node=1, layers=4, batch=8, seed=3):
    doc = generate_instance(seed, nodes=nodes, devices_per_node=per_node, device_types=2, layers=layers,
                            global_batch=batch)
    doc["search"]["engine"] = engine
    return parse_instance(doc)


UNEVEN = {"tp": [1, 2], "dp": [2, 1], "pp": 2, "shares": [[3, 1], [4]], "partition": [0, 2, 4]}


# -- the record ---------------------------------------------------------------------------------
def test_a_uniform_plan_in_the_per_stage_form_normalises_to_todays_record():
    written = parse_plan({"tp": [2, 2], "dp": [2, 2], "pp": 2, "shares": [[2, 2], [2, 2]], "partition": [0, 2, 4]})
    today = parse_plan({"tp": 2, "dp": 2, "pp": 2, "micro_batch": 2, "partition": [0, 2, 4]})
    assert written == today and written.uniform and written.shares is None and written.to_json() == today.to_json()


def test_the_per_stage_accessors_and_the_json_round_trip():
    plan = parse_plan(UNEVEN)
    assert not plan.uniform
    assert [plan.tp_at(s) for s in range(2)] == [1, 2] and [plan.dp_at(s) for s in range(2)] == [2, 1]
    assert plan.shares_at(0) == (3, 1) and plan.shares_at(1) == (4,)
    assert plan.pipeline_micro_batch == 4 and plan.micro_batch == 4 and plan.devices == 4
    doc = plan.to_json()
    jsonschema.validate(doc, SCHEMA)
    assert parse_plan(doc) == plan
    with pytest.raises(InputError, match="no single candidate"):
        plan.candidate
    # without shares every replica takes micro_batch samples
    even = parse_plan({"tp": [1, 2], "dp": 2, "pp": 2, "micro_batch": 2, "partition": [0, 2, 4]})
    assert even.shares_at(1) == (2, 2) and even.pipeline_micro_batch == 4 and not even.uniform


@pytest.mark.parametrize("change, field, words", [
    ({"tp": [1, 2, 2]}, "plan.tp", "lists 3 degrees, pp is 2"),
    ({"dp": [2, 0]}, "plan.dp[1]", "positive integer"),
    ({"shares": None}, "plan.shares", "required when dp differs"),
    ({"shares": [[3, 1], [3]]}, "plan.shares[1]", "sums to 3, stage 0's shares to 4"),
    ({"shares": [[3], [4]]}, "plan.shares[0]", "one share per data-parallel replica"),
    ({"shares": [[4, 0], [4]]}, "plan.shares[0][1]", "positive integer"),
    ({"micro_batch": 2}, "plan.micro_batch", "largest share 4"),
])
def test_bad_per_stage_fields_are_named(change, field, words):
    doc = {**UNEVEN, **change}
    doc = {k: v for k, v in doc.items() if v is not None}
    with pytest.raises(InputError, match=words) as err:
        parse_plan(doc)
    assert str(err.value).startswith(field + ":")


def test_megatron_and_deepspeed_refuse_a_non_uniform_plan_in_one_line():
    for engine in ("megatron", "deepspeed"):
        inst = two_types(engine)
        for doc, field in ((UNEVEN, "tp"), ({**UNEVEN, "tp": 1}, "dp"),
                           ({"tp": 1, "dp": 2, "pp": 1, "shares": [[3, 1]], "partition": [0, 4]}, "shares")):
            with pytest.raises(InputError) as err:
                check_plan(inst, parse_plan(doc))
            text = str(err.value)
            assert text.startswith(f"plan.{field}:") and 'search.engine "amp_opt"' in text and "\n" not in text


def test_the_amp_opt_engine_checks_a_non_uniform_plan():
    inst = two_types(per_node=2, nodes=2)
    plan = check_plan(inst, parse_plan(UNEVEN))
    assert plan.stages == (((0,), (1,)), ((2, 3),))  # dealt in order, stage 0's groups first
    with pytest.raises(InputError, match="does not divide the global batch"):
        check_plan(inst, parse_plan({**UNEVEN, "shares": [[2, 1], [3]]}))
    with pytest.raises(InputError, match=r"plan.stages\[1\]\[0\]: has 1 devices, tp is 2"):
        check_plan(inst, parse_plan({**UNEVEN, "stages": [[[0], [1]], [[2]]]}))
    with pytest.raises(InputError, match="cluster has 4"):
        check_plan(inst, parse_plan({**UNEVEN, "dp": [3, 1], "shares": [[2, 1, 1], [4]]}))
    with pytest.raises(InputError, match=r"^plan.cp:"):
        check_plan(inst, parse_plan({"tp": [1, 2], "dp": 1, "cp": 2, "pp": 2, "micro_batch": 2,
                                     "partition": [0, 2, 4]}))
    # the engine's rules still hold on each stage's own degrees
    with pytest.raises(InputError, match="sequence_parallel"):
        check_plan(inst, parse_plan({**UNEVEN, "sequence_parallel": True}))


# -- pricing (eq. U1-U4) ----------------------------------------------------------------------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from amp_opt.model.costs import HETERO, hetero_link  # noqa: E402
from amp_opt.model.costs.terms import memory_bandwidth  # noqa: E402
from amp_opt.model.costs.stages import UnevenCosts  # noqa: E402
from amp_opt.model.tables import Tables  # noqa: E402

REL = 1e-12


def forced(inst, plan):
    """A checked plan priced by the non-uniform path (U1-U4) whatever its form: the time and,
    per stage, (compute, p2p, allreduce, memory, fits)."""
    costs = UnevenCosts(HETERO, Tables(inst), plan)
    b = plan.partition
    terms = [(float(costs.compute(s, b[s], b[s + 1])), float(costs.p2p(s, b[s + 1])),
              float(costs.allreduce(s, b[s], b[s + 1])), costs.memory(s, b[s], b[s + 1]),
              costs.fits(s, b[s], b[s + 1])) for s in range(plan.pp)]
    return costs.pipeline.time(*zip(*[t[:3] for t in terms])), terms


def same_as_uniform(inst, plan):
    """The uniform path and the non-uniform one price a uniform plan alike, term by term; and
    the plan written in the per-stage form is the same record and scores the same."""
    ev = amp_opt.evaluate(inst, plan)
    p = ev.plan
    doc = {**p.to_json(), "tp": [p.tp] * p.pp, "dp": [p.dp] * p.pp, "shares": [[p.micro_batch] * p.dp] * p.pp}
    again = amp_opt.evaluate(inst, parse_plan(doc))
    assert again.plan == ev.plan and again.predicted_time == ev.predicted_time
    if not priced_here(p):
        return ev
    time, terms = forced(inst, ev.plan)
    assert time == pytest.approx(ev.predicted_time, rel=REL, abs=1e-15)
    for r, (compute, p2p, allreduce, memory, fits) in zip(ev.stages, terms):
        assert (compute, p2p, allreduce) == pytest.approx((r.compute, r.p2p, r.allreduce), rel=REL, abs=1e-15)
        assert memory == pytest.approx(r.memory, rel=REL) and fits == r.fits
    return ev


def priced_here(plan) -> bool:
    """Whether the non-uniform path prices the plan's settings (cp 1, no interleaving, ZeRO <= 2)."""
    return plan.cp == 1 and plan.virtual_stages == 1 and (plan.zero_stage or 0) <= 2


@pytest.mark.parametrize("name", ["amp_het_model", "amp_homogeneous", "amp_het_cluster"])
def test_bundled_best_plans_price_alike_on_both_paths(name):
    from conftest import INSTANCES

    inst = amp_opt.load_instance(INSTANCES / f"{name}.json")
    best = amp_opt.solve(inst).best.plan
    same_as_uniform(inst, best)
    if not priced_here(best):  # the same degrees without the settings the non-uniform path leaves out
        from amp_opt.model.engines import even_partition

        assert best.cp == 1
        best = parse_plan({**best.to_json(), "virtual_stages": 1, "zero_stage": min(best.zero_stage or 0, 2),
                           "partition": list(even_partition(inst, best.pp))})
        assert priced_here(best)
        same_as_uniform(inst, best)


def random_uniform_plan(inst, rng):
    """A random uniform plan of a tiny instance in the space the non-uniform path prices."""
    n, L, G = inst.num_devices, inst.num_layers, inst.training.global_batch
    while True:
        tp = rng.choice([m for m in (1, 2) if all(node.devices % m == 0 for node in inst.nodes)])
        dp = rng.randint(1, n // tp)
        pp = rng.randint(1, min(L, n // (tp * dp)))
        mb = rng.choice([b for b in (1, 2, 4) if G % (dp * b) == 0] or [0])
        if mb:
            break
    devices = list(range(n))
    rng.shuffle(devices)
    # groups inside one node: tp consecutive devices of a node
    groups = [tuple(range(f, f + tp)) for f in range(0, n, tp)
              if len({int(inst.device_node[d]) for d in range(f, f + tp)}) == 1]
    rng.shuffle(groups)
    stages = [[list(groups.pop()) for _ in range(dp)] for _ in range(pp)]
    cuts = sorted(rng.sample(range(1, L), pp - 1))
    return parse_plan({"tp": tp, "dp": dp, "pp": pp, "micro_batch": mb, "partition": [0, *cuts, L], "stages": stages,
                       "recompute": rng.choice(["none", "selective", "full"]), "zero_stage": rng.choice([0, 1, 2]),
                       "sequence_parallel": tp > 1 and rng.random() < 0.5})


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), per_node=st.sampled_from([1, 2]), layers=st.integers(3, 6))
def test_uniform_plans_price_alike_on_both_paths(seed, per_node, layers):
    import random

    rng = random.Random(seed)
    inst = two_types(nodes=4 // per_node + rng.randint(0, 1), per_node=per_node, layers=layers, seed=seed % 1000,
                     batch=rng.choice([4, 8]))
    plan = random_uniform_plan(inst, rng)
    try:
        amp_opt.evaluate(inst, plan)
    except InputError:  # an engine rule (selective recomputation without scores, ...)
        return
    same_as_uniform(inst, plan)


def test_each_new_term_by_hand():
    """U1-U4 on a T4 + three A100s: stage 0 = a T4 replica (3 samples) and an A100 replica (1),
    stage 1 = one A100 (4 samples); every number recomputed here from the tables."""
    inst = two_types(seed=3)
    assert [n.device_type for n in inst.nodes] == ["T4", "A100-80GB", "A100-80GB", "A100-80GB"]
    plan = parse_plan({"tp": 1, "dp": [2, 1], "pp": 2, "shares": [[3, 1], [4]], "partition": [0, 2, 4],
                       "stages": [[[0], [1]], [[2]]], "zero_stage": 0})
    ev = amp_opt.evaluate(inst, plan)
    tables, tr = Tables(inst), inst.training
    assert ev.n_micro == 8 // 4

    def seconds(node, share, k, l):
        n = inst.nodes[node]
        times = tables.layer_times(n.device_type, n.intra_bandwidth, 1, share).seconds
        return float(times[k:l].sum()) + inst.device_types[n.device_type].step_overhead

    # U1: each replica at its own share, the stage at its slowest
    t4, a100 = seconds(0, 3, 0, 2), seconds(1, 1, 0, 2)
    assert ev.stages[0].replica_compute == pytest.approx((t4, a100), rel=REL)
    assert ev.stages[0].compute == pytest.approx(max(t4, a100), rel=REL)
    assert ev.stages[1].compute == pytest.approx(seconds(2, 4, 2, 4), rel=REL)
    # U2: the largest device's bytes (stage 1's 4 samples) over the slowest link of the two stages
    sent = tables.layer_arrays(1, False).sent[1]
    link = hetero_link(inst, [0, 1, 2])
    assert ev.stages[0].p2p == pytest.approx(4 * sent / link, rel=REL)
    # U3: stage 0's ring over its 2 replicas, on its own slowest link; then each stage's optimizer
    # step (H15: a pass over 2o + g + w bytes per parameter at its slowest device memory, ZeRO 0)
    params, rest = (float(tables.layer_sums(1).params_in(k, l)) for k, l in ((0, 2), (2, 4)))
    step = 2 * tr.optimizer_bytes + tr.gradient_bytes + tr.weight_bytes
    assert ev.stages[0].allreduce == pytest.approx(params * 2 * (2 - 1) / 2 * tr.allreduce_bytes_per_param
                                                   / hetero_link(inst, [0, 1])
                                                   + params * step / memory_bandwidth(inst, ["T4", "A100-80GB"]), rel=REL)
    assert ev.stages[1].allreduce == pytest.approx(rest * step / memory_bandwidth(inst, ["A100-80GB"]), rel=REL)
    # U4: the T4 replica keeps 3 samples' activations, the A100 one 1: the difference is 2 samples
    # times the micro-batches in flight (min(pp - s, n) = 2) times the bytes kept per sample
    costs = UnevenCosts(HETERO, tables, ev.plan)
    (m_t4, cap_t4), (m_a100, cap_a100) = costs.replica_memory(0, 0, 2)
    kept = float(tables.layer_arrays(1, False).activations[0:2].sum()) * tr.activation_factor
    assert m_t4 - m_a100 == pytest.approx(2 * 2 * kept, rel=1e-9)
    assert (cap_t4, cap_a100) == (inst.device_types["T4"].capacity, inst.device_types["A100-80GB"].capacity)
    assert ev.stages[0].memory == pytest.approx(max((m_t4, cap_t4), (m_a100, cap_a100),
                                                    key=lambda mc: mc[0] - mc[1])[0])
    assert ev.stages[0].fits == (m_t4 <= cap_t4 and m_a100 <= cap_a100)
    # the iteration: H13 with n = global batch / M
    pipe = costs.pipeline
    assert ev.predicted_time == pytest.approx(pipe.time([s.compute for s in ev.stages], [s.p2p for s in ev.stages],
                                                        [s.allreduce for s in ev.stages]), rel=REL)
    assert ev.to_json(inst)["stages"][0]["replica_compute"] == list(ev.stages[0].replica_compute)


def test_the_amp_model_refuses_a_non_uniform_plan():
    inst = two_types()
    with pytest.raises(InputError, match="amp cost model prices uniform plans only"):
        amp_opt.evaluate(inst, parse_plan({**UNEVEN, "tp": 1}), "amp")


def test_replicas_on_nodes_that_differ_only_in_their_tp_latency_are_priced_apart():
    """Two tp-2 replicas of a stage, each on its own node, the second node's tp links slower per
    message (H2 with H19): each replica's compute is its own node's, not the first replica's."""
    doc = generate_instance(3, nodes=3, devices_per_node=2, device_types=1, layers=4, global_batch=8)
    (node,) = doc["nodes"]
    doc["nodes"] = [dict(node, count=1, name=f"n{i}", intra_latency=lat) for i, lat in enumerate((0.0, 1e-3, 0.0))]
    doc["search"]["engine"] = "amp_opt"
    doc["profiles"] = []  # estimated: the tp allreduces' latency is priced
    inst = parse_instance(doc)
    plan = parse_plan({"tp": 2, "dp": [2, 1], "pp": 2, "shares": [[2, 2], [4]], "partition": [0, 2, 4],
                       "stages": [[[0, 1], [2, 3]], [[4, 5]]]})
    fast, slow = amp_opt.evaluate(inst, plan).stages[0].replica_compute
    steps = 2 * (2 - 1) * 1e-3 * sum(layer.tp_comm_messages for layer in inst.layers[:2])
    assert slow - fast == pytest.approx(steps, rel=1e-9)


def test_a_replica_whose_tp_group_spans_nodes_is_priced_on_its_own_link():
    """H16 in an uneven plan: replica A's tp group sits in a node, replica B's spans two nodes (its
    allreduces cross the slower node link). Each is priced on its own link, in either order (a
    replica took the view of the first replica of its device type and node link)."""
    doc = generate_instance(3, nodes=3, devices_per_node=2, device_types=1, layers=4, global_batch=8)
    doc["search"]["engine"] = "amp_opt"
    doc["profiles"] = []  # estimated: the tp allreduces are priced on the group's link
    inst = parse_instance(doc)

    def replicas(first, second):
        plan = parse_plan({"tp": 2, "dp": [2, 1], "pp": 2, "shares": [[2, 2], [4]], "partition": [0, 2, 4],
                           "stages": [[first, second], [[3, 5]]]})
        return amp_opt.evaluate(inst, plan).stages[0].replica_compute

    inside, across = replicas([0, 1], [2, 4])
    assert across > inside * 1.01
    assert replicas([2, 4], [0, 1]) == pytest.approx((across, inside), rel=1e-12)


def tiny_uneven(seed, *, devices=3, layers=3, batch=8, engine="amp_opt", idle=True):
    """A tiny instance of two GPU types, one per node, with a few settings open."""
    doc = generate_instance(seed, nodes=devices, devices_per_node=1, device_types=2, layers=layers,
                            global_batch=batch)
    doc["search"].update({"engine": engine, "micro_batches": [1, 2, 4], "recompute": ["none", "full"],
                          "zero_stages": [0, 1], "sequence_parallel": [False], "virtual_stages": [1], "idle": idle})
    return parse_instance(doc)


def test_an_uneven_plan_beats_every_uniform_plan():
    """Three GPUs of two types (seed 0): one replica per GPU with shares 1, 1, 2 beats every
    uniform plan (the brute force over uniform plans, engine megatron)."""
    from amp_opt.bench.brute import brute_force

    inst = tiny_uneven(0)
    uniform = brute_force(tiny_uneven(0, engine="megatron"))
    plan = {"tp": 1, "dp": 1, "pp": 1, "shares": [[1, 1, 2]], "partition": [0, 3], "zero_stage": 1}
    plan["dp"] = 3
    ev = amp_opt.evaluate(inst, parse_plan(plan))
    assert ev.feasible and ev.predicted_time < uniform.value * (1 - 1e-3)


# -- the brute force and the search -------------------------------------------------------------------
def test_the_brute_force_walks_uneven_plans_on_engine_amp_opt_only():
    from amp_opt.bench.brute import _compositions, uneven_plans

    assert list(_compositions(4, 2, 3)) == [(1, 3), (2, 2), (3, 1)]
    inst = tiny_uneven(0)
    docs = list(uneven_plans(inst))
    assert all(not parse_plan(d).uniform for d in docs)
    assert any(d["shares"] == [[1, 1, 2]] for d in docs)
    assert max(b for d in docs for row in d["shares"] for b in row) == max(inst.search.micro_batches)


def uneven_check(inst, objective="time", budget=None, solver="auto"):
    from amp_opt.bench.brute import brute_force

    truth = brute_force(inst, objective=objective, budget=budget)
    try:
        result = amp_opt.solve(inst, objective=objective, budget=budget, solver=solver)
    except amp_opt.InfeasibleError:
        assert truth is None
        return None
    assert truth is not None
    got = result.solver.objective if objective == "cost" else result.best.predicted_time
    assert got == pytest.approx(truth.value, rel=1e-7)
    assert result.solver.status == "OPTIMAL" and result.solver.extra["uneven"]["searched_whole"]
    within = space_left(result)
    assert within is None or within.startswith("plans that use every device")
    assert ONE_PIPELINE in result.solver.within  # several pipelines are priced, not searched (X6)
    return result


uneven_cases = st.fixed_dictionaries({"seed": st.integers(0, 2**31 - 1), "devices": st.integers(2, 3),
                                      "layers": st.integers(3, 4), "batch": st.sampled_from([4, 8]),
                                      "idle": st.booleans()})


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=uneven_cases, objective=st.sampled_from(["time", "cost"]), solver=st.sampled_from(["auto", "cpsat"]))
def test_the_search_equals_the_brute_force_on_uneven_plans(case, objective, solver):
    """Every solver: the uniform plans by its own search, the uneven ones by the uneven search."""
    uneven_check(tiny_uneven(**case), objective, solver=solver)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.fixed_dictionaries({"seed": st.integers(0, 2**31 - 1), "devices": st.integers(2, 4),
                                   "layers": st.integers(3, 5), "batch": st.sampled_from([4, 8, 16]),
                                   "idle": st.booleans()}),
       objective=st.sampled_from(["time", "cost"]), budget_share=st.sampled_from([None, 0.6]),
       solver=st.sampled_from(["auto", "cpsat", "highs"]))
def test_the_search_equals_the_brute_force_on_uneven_plans_slow(case, objective, budget_share, solver):
    inst = tiny_uneven(**case)
    budget = None
    if budget_share is not None:
        objective = "time"
        budget = budget_share * sum(inst.device_types[n.device_type].price_per_hour * n.devices for n in inst.nodes)
    uneven_check(inst, objective, budget, solver)


def test_the_search_finds_the_uneven_plan_and_says_when_it_leaves_them_out(monkeypatch):
    from amp_opt.search import uneven

    inst = tiny_uneven(0)
    result = uneven_check(inst)
    assert not result.best.plan.uniform and result.best.plan.shares == ((1, 1, 2),)
    monkeypatch.setattr(uneven, "MAX_CONFIGURATIONS", 3)
    narrowed = amp_opt.solve(inst)
    assert narrowed.best.plan.uniform and narrowed.best.predicted_time > result.best.predicted_time
    assert "plans whose stages and replicas agree" in narrowed.solver.within
    # the listing's work budget narrows the same way (a large cluster is not listed for minutes)
    from amp_opt.search import uneven_space

    monkeypatch.setattr(uneven, "MAX_CONFIGURATIONS", 1000)
    monkeypatch.setattr(uneven_space, "WORK_PER_CONFIGURATION", 0)
    assert uneven_space.configurations(inst, limit=1000) == ([], False)
    assert "more than 1000 uneven configurations" in amp_opt.solve(inst).solver.within
    # megatron: today's search, no uneven plan and no uneven statistics
    plain = amp_opt.solve(tiny_uneven(0, engine="megatron"))
    assert plain.best.plan.uniform and "uneven" not in plain.solver.extra


def test_explain_and_plot_show_each_stage_s_degrees_and_shares():
    from amp_opt.commands.explain import explain_plan, plan_text
    from amp_opt.commands.plot import stage_label

    inst = two_types(seed=3)
    plan = parse_plan({"tp": 1, "dp": [2, 1], "pp": 2, "shares": [[1, 3], [4]], "partition": [0, 2, 4],
                       "stages": [[[0], [1]], [[2]]]})
    doc = explain_plan(inst, plan)
    assert [(s["tp"], s["dp"], s["shares"]) for s in doc["stages"]] == [(1, 2, [1, 3]), (1, 1, [4])]
    text = plan_text(inst, doc)
    assert "tp 1, dp 2, samples per replica 1+3" in text and "dp=2,1" in text and "shares=1,3/4" in text
    # the settings alternatives are scored on the plan's own per-stage degrees
    assert any(a["fits"] and a["plan"]["shares"] == [[1, 3], [4]] for a in doc["alternatives"])
    ev = amp_opt.evaluate(inst, plan)
    assert stage_label(inst, ev.stages[0], ev.plan).endswith("tp 1 dp 2 shares 1+3")
    uniform = amp_opt.evaluate(inst, parse_plan({"tp": 1, "dp": 1, "pp": 2, "micro_batch": 2, "partition": [0, 2, 4]}))
    assert "shares" not in stage_label(inst, uniform.stages[0], uniform.plan)


def test_the_symmetry_classes_keep_every_share_assignment():
    """Seed 15 (three GPUs, batch 8): its best plan gives one replica a larger share than a
    replica on an identical node's first listing; a symmetry key that forgot the shares (too
    strong a rule) misses it (checked by breaking ``uneven_space._key`` once)."""
    uneven_check(tiny_uneven(15, devices=3, batch=8))


@pytest.mark.parametrize("name", ["amp_opt.model.plan_stages", "amp_opt.model.costs.stages"])
def test_docstring_examples_of_the_new_modules(name):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_the_search_graph_prices_each_configuration_as_the_evaluator_does():
    """Every configuration of a two-node instance (2 GPUs each: intra- and inter-node boundaries),
    its DP's best value and the evaluator's price of that plan agree, with the cost views shared
    across configurations as the search shares them (a view keyed too coarsely fails here)."""
    from amp_opt.search.options import solve_options
    from amp_opt.search.uneven import _graph, _settings
    from amp_opt.search.partition import optimal_path
    from amp_opt.search.uneven_space import configurations

    doc = generate_instance(4, nodes=2, devices_per_node=2, device_types=2, layers=4, global_batch=8)
    doc["search"].update({"engine": "amp_opt", "micro_batches": [1, 2], "recompute": ["none"], "zero_stages": [1],
                          "sequence_parallel": [False], "virtual_stages": [1]})
    inst = parse_instance(doc)
    model, tables, cache = solve_options().model, Tables(inst), {}
    confs, complete = configurations(inst, limit=1000)
    assert complete and len(confs) > 20
    compared = 0
    for conf in confs:
        for sp, mode, layers, zero in _settings(inst):
            fields = {**conf.plan_doc(inst), "partition": [0, *range(1, conf.pp), 4], "recompute": mode,
                      "zero_stage": zero}
            try:
                plan = check_plan(inst, parse_plan(fields))
            except InputError:
                continue
            found = optimal_path(_graph([UnevenCosts(model, tables, plan, cache=cache)], 4))
            if found is None:
                continue
            ev = amp_opt.evaluate(inst, parse_plan({**fields, "partition": list(found[1].boundaries)}))
            assert found[0] == pytest.approx(ev.predicted_time, rel=1e-9)
            compared += 1
    assert compared >= 10


def test_top_k_with_uneven_plans_says_it_keeps_one_plan_per_configuration():
    """The uneven search keeps each configuration's best plan: with --top-k its list is not the K
    best plans of the whole space, and the result says so."""
    inst = tiny_uneven(5)
    one = amp_opt.solve(inst)
    assert one.solver.within is None or "per configuration" not in one.solver.within
    two = amp_opt.solve(inst, top_k=2)
    assert "one plan per configuration of stages and replicas that differ" in (two.solver.within or "")
