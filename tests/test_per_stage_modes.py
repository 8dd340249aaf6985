"""A recomputation mode per stage on the engine "amp_opt": the rules every engine keeps on such
plans, the uneven search's DP choosing each stage's mode, and every search equal to the brute
force where memory makes stages recompute differently."""

import itertools
import math

import pytest

import amp_opt
from amp_opt import InputError, parse_instance, parse_plan
from amp_opt.bench.brute import brute_force
from amp_opt.model.plan import check_plan
from amp_opt.model.tables import Tables
from amp_opt.search import uneven
from amp_opt.search.options import solve_options
from amp_opt.search.uneven_space import configurations


def two_types(a100_gib, v100_gib, *, engine="amp_opt", recompute=("none", "full"), **search):
    """One A100 and two V100s with the memory given, a 4-block GPT whose activations matter
    (hidden 2048, sequence 4096, FlashAttention): 6 layers with the embedding and the head."""
    return parse_instance({
        "version": 1, "name": "per-stage",
        "model": {"preset": "gpt", "hidden": 2048, "layers": 4, "heads": 16, "vocab": 32000, "seq_len": 4096,
                  "attention": "flash"},
        "device_types": [{"name": "A100-80GB", "memory": f"{a100_gib} GiB"},
                         {"name": "V100-32GB", "memory": f"{v100_gib} GiB"}],
        "nodes": [{"name": "a", "device_type": "A100-80GB", "devices": 1, "intra_bandwidth": "100 GB/s",
                   "inter_bandwidth": "100 Gbit/s"},
                  {"name": "v", "device_type": "V100-32GB", "devices": 2, "intra_bandwidth": "100 GB/s",
                   "inter_bandwidth": "100 Gbit/s"}],
        "training": {"global_batch": 8},
        "search": {"micro_batches": [1, 2, 4], "tp": [1], "cp": [1], "zero_stages": [0], "virtual_stages": [1],
                   "recompute": list(recompute), "engine": engine, "idle": True, **search},
    })


def test_the_amp_opt_engine_takes_a_mode_per_stage_and_every_engine_keeps_its_rules():
    inst = two_types(8, 6)
    staged = {"tp": 1, "dp": 1, "pp": 2, "micro_batch": 1, "partition": [0, 3, 6], "recompute": ["full", "none"]}
    assert check_plan(inst, parse_plan(staged)).recompute == ("full", "none")
    with pytest.raises(InputError, match="plan.recompute: megatron recomputes the same way on every stage"):
        check_plan(two_types(8, 6, engine="megatron"), parse_plan(staged))
    for change, field, words in [
        ({"recompute": ["selective", "none"]}, "recompute", "a mode per stage is 'none' or 'full'"),
        ({"recompute_layers": 1}, "recompute_layers", "the block method recomputes the first layers of every stage"),
        ({"virtual_stages": 2, "partition": [0, 1, 3, 4, 6]}, "recompute", "a mode per stage needs virtual_stages 1"),
    ]:
        with pytest.raises(InputError, match=f"plan.{field}: {words}"):
            check_plan(inst, parse_plan({**staged, **change}))


def _configuration(inst, dp, shares, stages):
    confs, complete = configurations(inst, limit=1000)
    assert complete
    return next(c for c in confs if (lambda d: (d["dp"], d["shares"], d["stages"]))(c.plan_doc(inst))
                == (dp, shares, stages))


def test_the_uneven_dp_chooses_each_stage_s_mode():
    """The A100 alone, then two V100 replicas of 2 samples each: the A100 holds more layers than
    fit without recomputation, the V100s recompute nothing.  The DP's best over partitions and
    modes equals every (partition, modes) pair scored by the evaluator, and beats both uniform
    modes (no recomputation does not fit at all)."""
    inst = two_types(8, 6)
    conf = _configuration(inst, [1, 2], [[4], [2, 2]], [[[0]], [[1], [2]]])
    options, tables, L = solve_options(), Tables(inst), inst.num_layers
    best = {mode: uneven._best_of(inst, options, tables, {}, conf, (False, mode, None, 0), math.inf)
            for mode in (uneven.PER_STAGE, "none", "full")}
    scored = []
    for cut in range(1, L):
        for modes in itertools.product(("none", "full"), repeat=2):
            ev = amp_opt.evaluate(inst, parse_plan({**conf.plan_doc(inst), "partition": [0, cut, L],
                                                    "recompute": list(modes), "zero_stage": 0}))
            if ev.feasible:
                scored.append(ev.predicted_time)
    assert best[uneven.PER_STAGE].predicted_time == pytest.approx(min(scored), rel=1e-9)
    assert best[uneven.PER_STAGE].plan.recompute == ("full", "none")
    assert best["none"] is None and best[uneven.PER_STAGE].predicted_time < best["full"].predicted_time * (1 - 0.05)


def test_one_stage_takes_either_mode():
    """One stage of three replicas (shares 1, 1, 2): without recomputation it does not fit, and the
    setting that lets stages choose still finds the plan recomputing in full."""
    inst = two_types(8, 8)
    conf = _configuration(inst, [3], [[1, 1, 2]], [[[0], [1], [2]]])
    options, tables = solve_options(), Tables(inst)
    best = {mode: uneven._best_of(inst, options, tables, {}, conf, (False, mode, None, 0), math.inf)
            for mode in (uneven.PER_STAGE, "none", "full")}
    assert best["none"] is None and best["full"] is not None
    assert best[uneven.PER_STAGE].plan.recompute == "full"
    assert best[uneven.PER_STAGE].predicted_time == best["full"].predicted_time


TP_SP = {"tp": [1, 2], "sequence_parallel": [False, True]}


@pytest.mark.parametrize("a100_gib, v100_gib, search", [(4, 4, {}), (6, 3, {}), (6.5, 3.5, {}), (8, 6, {}),
                                                        (7.5, 6, {}), (10, 8, {}), (8, 8, {"max_pp": 1}),
                                                        (4, 3, TP_SP), (3.5, 3.5, TP_SP)])
def test_every_search_equals_the_brute_force_where_stages_recompute_differently(a100_gib, v100_gib, search):
    """Memory from tight to loose: the best plan recomputes on some stages or none (or, one stage
    at most, in full on an uneven stage; with tp 2 open, the two V100s at tp 2 beside the A100 at
    tp 1, one of the two stages recomputing); the searches (uniform and uneven, with the DP and
    with CP-SAT) equal the brute force over every raw plan."""
    inst = two_types(a100_gib, v100_gib, **search)
    truth = brute_force(inst)
    assert truth is not None
    for solver in ("auto", "cpsat"):
        result = amp_opt.solve(inst, solver=solver)
        assert result.solver.status == "OPTIMAL"
        assert result.best.predicted_time == pytest.approx(truth.value, rel=1e-7), solver


def test_a_mode_per_stage_beats_both_uniform_modes_on_the_amp_opt_engine():
    """At 4 GiB on the A100 and 4 on the V100s: three stages, the A100's in the middle recomputing."""
    inst = two_types(4, 4)
    best = amp_opt.solve(inst).best
    assert best.plan.recompute == ("none", "full", "none")
    for mode in ("none", "full"):
        try:
            other = amp_opt.solve(two_types(4, 4, recompute=(mode,))).best.predicted_time
        except amp_opt.InfeasibleError:
            continue
        assert best.predicted_time < other


def test_explain_offers_each_stage_its_own_mode_on_an_uneven_plan():
    """The uneven plan of the DP test without recomputation does not fit (its A100 stage); explain's
    fastest fitting alternative recomputes that stage only, the plan the DP picks."""
    from amp_opt.search.alternatives import explain_plan

    inst = two_types(8, 6)
    plan = {"tp": 1, "dp": [1, 2], "pp": 2, "shares": [[4], [2, 2]], "partition": [0, 4, 6],
            "stages": [[[0]], [[1], [2]]], "recompute": "none", "zero_stage": 0}
    doc = explain_plan(inst, parse_plan(plan))
    assert not doc["fits"]
    fitting = [a for a in doc["alternatives"] if a["fits"]]
    best = min(fitting, key=lambda a: a["predicted_time"])
    assert best["change"] == "recompute per stage: full, none" and best["plan"]["recompute"] == ["full", "none"]
    assert best["predicted_time"] == pytest.approx(amp_opt.evaluate(inst, parse_plan(best["plan"])).predicted_time)


def test_an_interleaved_candidate_keeps_both_uniform_modes():
    """The per-stage candidate has one chunk per stage; on an engine that also interleaves
    (amp_opt) the interleaved candidates keep recomputation none and full (with them gone, the
    uniform search on g0512-s112 lost Megatron's interleaved optimum, 2.86% slower)."""
    from amp_opt.model.candidates import settings
    from amp_opt.model.costs import HETERO

    inst = two_types(8, 6, virtual_stages=[1, 2])
    found = settings(inst, HETERO, 1, 1, 1, 2, 1)  # tp, cp, dp, pp, micro-batch
    two = {(c.recompute, c.per_stage) for c in found if c.virtual_stages == 2}
    one = {(c.recompute, c.per_stage) for c in found if c.virtual_stages == 1 and not c.recompute_layers}
    assert {("none", False), ("full", False)} <= two and not any(per for _, per in two)
    assert one == {("full", True)}
