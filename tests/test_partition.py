"""The exact stage DP equals brute force: on random tables, on the paper instances, with free grouping."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amp_opt import evaluate, parse_instance
from amp_opt.model.candidates import candidates
from amp_opt.model.engines import even_partition
from amp_opt.model.costs.iteration import Pipeline, pipeline_weights
from amp_opt.model.costs.terms import stage_order
from amp_opt.model.costs import COST_MODELS
from amp_opt.model.tables import Tables
from amp_opt.search.free_grouping import candidate_graph
from amp_opt.model.generate import generate_instance
from amp_opt.search.free_grouping import free_graph, groupings, stages_of_path
from amp_opt.search.partition import brute_force, fixed_placement_graph, make_graph, optimal_path, path_value


def random_graph(seed: int, L: int, p: int, states: int, n: int, schedule: str = "closed"):
    """A random layered graph: `states` states per stage, random kinds and p2p factors; the
    objective's weights of a schedule model, or random ones (``"random"``)."""
    rng = np.random.default_rng(seed)
    K = max(1, states)
    k, l = np.meshgrid(np.arange(L + 1), np.arange(L + 1), indexing="ij")
    per_layer = rng.random((K, L)) * rng.choice([0.1, 1.0, 10.0])
    prefix = np.concatenate([np.zeros((K, 1)), np.cumsum(per_layer, axis=1)], axis=1)
    compute = np.where(k < l, prefix[:, None, :] - prefix[:, :, None], np.inf)
    params = np.concatenate([[0], np.cumsum(rng.random(L) * rng.choice([0, 1, 5]))])
    coef = rng.random(K)
    allreduce = np.where(k < l, coef[:, None, None] * (params[None, None, :] - params[None, :, None]), np.inf)
    ratio = rng.random((p, K, L + 1, L + 1)) * rng.choice([0.5, 1.2, 3.0])
    volume = np.concatenate([[0.0], rng.random(L)])
    transitions = []
    for s in range(p):
        sources = [0] if s == 0 else list(range(states))
        targets = list(range(states)) if s < p - 1 else [0]
        trans = []
        for src in sources:
            for dst in targets:
                if rng.random() < 0.7 or not trans:
                    trans.append((src, int(rng.integers(K)), 0.0 if s == 0 else float(rng.random()), dst))
        transitions.append(tuple(trans))
    if schedule == "random":
        pipeline = Pipeline(tuple(float(x) for x in rng.random(p) * n), 1, float(rng.choice([1.0, 2.0])))
    else:
        pipeline = pipeline_weights(n, p, 1, schedule)
    return make_graph(n, compute, allreduce, ratio, True, volume, transitions, pipeline=pipeline)


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 10**6), L=st.integers(1, 7), p=st.integers(1, 7), states=st.integers(1, 3),
       n=st.sampled_from([1, 2, 3, 8, 64]), schedule=st.sampled_from(["closed", "1f1b", "random"]))
def test_dp_equals_brute_force_on_random_graphs(seed, L, p, states, n, schedule):
    p = min(p, L)
    g = random_graph(seed, L, p, states, n, schedule)
    exact, brute = optimal_path(g), brute_force(g)
    assert (exact is None) == (brute is None)
    if exact is not None:
        assert exact[0] == pytest.approx(brute[0], rel=1e-12, abs=1e-15)
        assert path_value(g, exact[1]) == pytest.approx(exact[0], rel=1e-12)


@pytest.mark.parametrize("model", ["amp", "hetero"])
def test_dp_equals_brute_force_on_paper_candidates(paper_instances, model):
    inst = paper_instances["het_cluster"]
    for cand in candidates(inst, COST_MODELS[model]):
        if cand.pp > 4 or cand.micro_batch > 2 or cand.virtual_stages > 1:
            continue  # brute force over C(29, pp-1) partitions stays small; interleaving fixes the partition
        graph, _ = candidate_graph(Tables(inst), cand, COST_MODELS[model], "rank-order")
        exact, brute = optimal_path(graph), brute_force(graph)
        assert (exact is None) == (brute is None)
        if exact:
            assert exact[0] == pytest.approx(brute[0], rel=1e-12)


def tiny_instances():
    """Small generated clusters: 2-3 nodes of 1-4 devices, 2 GPU types, 5-7 layers; the last three with
    per-message latencies (H19) that differ per node entry (the DP's hops and the states it merges)."""
    for seed in range(9):
        doc = generate_instance(seed, nodes=2 + seed % 2, devices_per_node=(2, 4)[seed % 2], device_types=2,
                                layers=5 + seed % 3, global_batch=8)
        for i, node in enumerate(doc["nodes"] if seed >= 6 else ()):
            node["intra_latency"], node["inter_latency"] = 1e-3 * ((seed + i) % 3), 4e-3 * ((seed + 2 * i) % 3)
        yield parse_instance(doc)


@pytest.mark.parametrize("instance", list(tiny_instances()), ids=lambda i: i.name)
def test_free_grouping_equals_every_grouping(instance):
    """The state DP over free groupings equals trying every grouping matrix with the exact partition."""
    L = instance.num_layers
    tables = Tables(instance)
    # Today's settings, and a fixed sample of the others (recomputation, ZeRO, virtual stages).
    today = [c for c in candidates(instance) if (c.recompute, c.zero_stage, c.virtual_stages) == ("none", 0, 1)]
    others = [c for c in candidates(instance) if c not in today][::5]
    for cand in today + others:
        chunks = even_partition(instance, cand.pp * cand.virtual_stages, exact=True) if cand.virtual_stages > 1 else None
        fixed = None if chunks is None else stage_order(chunks, cand.pp)[1]
        fg = free_graph(tables, cand, chunks)
        exact = optimal_path(fg.graph)
        best = None
        for stages in groupings(instance, cand):
            costs = COST_MODELS["hetero"].stage_costs(tables, cand, stages, chunks=chunks)
            found = optimal_path(fixed_placement_graph(costs, L, fixed))
            if found and (best is None or found[0] < best[0]):
                best = found
        assert (exact is None) == (best is None), cand
        if exact is None:
            continue
        assert exact[0] == pytest.approx(best[0], rel=1e-12), cand
        # The reconstructed devices score the same under the evaluator.
        stages = stages_of_path(instance, cand, fg, exact[1].transitions)
        plan = cand.plan(chunks or exact[1].boundaries, stages)
        ev = evaluate(instance, plan, "hetero")
        assert ev.feasible
        assert ev.predicted_time == pytest.approx(exact[0], rel=1e-12)


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10_000), L=st.integers(2, 12), band=st.integers(1, 12), lead=st.integers(1, 40),
       origin=st.integers(0, 3), ties=st.booleans())
def test_banded_step_equals_the_minimum_over_every_range(seed, L, band, lead, origin, ties):
    """band_min_sum_step (both its gather and its per-length paths) against the definition:
    row[l] = min over j of values[l-1-j] + arcs[l, j], positions before the window inf, ties
    to the shortest range, j = 0 where nothing is reached."""
    import amp_opt.model.ranges as ranges

    rng = np.random.default_rng(seed)
    origin = min(origin, L - 1)
    draw = (lambda *shape: rng.integers(0, 3, shape).astype(float)) if ties else (lambda *shape: rng.random(shape))
    values = draw(lead, L + 1 - origin)
    values[rng.random(values.shape) < 0.2] = np.inf
    arcs = draw(lead, L + 1, band)
    arcs[rng.random(arcs.shape) < 0.2] = np.inf
    ends = np.arange(L + 1)[:, None] - 1 - np.arange(band)[None, :]
    arcs[:, ends < 0] = np.inf  # no range starts before layer 0
    lo = origin + 1
    hi = int(rng.integers(lo + 1, L + 2))
    want_row = np.full((lead, hi - lo), np.inf)
    want_width = np.zeros((lead, hi - lo), dtype=int)
    for i, l in enumerate(range(lo, hi)):
        for j in range(band):
            start = l - 1 - j
            if start < origin:
                continue
            value = values[:, start - origin] + arcs[:, l, j]
            better = value < want_row[:, i]
            want_row[better, i] = value[better]
            want_width[better, i] = j
    for gather in (0, 1 << 30):  # the per-length path, then the gather
        old, ranges.BAND_GATHER = ranges.BAND_GATHER, gather
        try:
            row, width = ranges.band_min_sum_step(values, arcs, slice(lo, hi), origin=origin)
        finally:
            ranges.BAND_GATHER = old
        assert np.array_equal(row, want_row)
        assert np.array_equal(width, want_width)


def _chain_over_every_start(tables, feasible):
    """min_max_chain's DP without its windows: every start and end of every stage."""
    from amp_opt.model.ranges import backtrack, min_max_step, start_row

    L = tables[0].shape[-1] - 1
    values, back = start_row(L), []
    for s, table in enumerate(tables):
        values, arg = min_max_step(values, table, None if feasible is None else feasible[s], arg=True)
        back.append(arg)
    value = float(values[L])
    if not np.isfinite(value):
        return value, None
    return value, backtrack(len(tables), L, None, lambda s, state, end: (None, int(back[s][end]), None))[1]


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 10**6), L=st.integers(1, 9), p=st.integers(1, 10), masked=st.booleans(),
       ties=st.booleans(), same=st.booleans())
def test_min_max_chain_equals_brute_force_and_the_unwindowed_dp(seed, L, p, masked, ties, same):
    """The windowed min-max chain (each stage reads only the starts and ends a partition of all
    L layers can use) has the value of brute force over every partition, and the path and
    ties of the DP over every start and end."""
    import itertools

    from amp_opt.model.ranges import min_max_chain, range_table

    rng = np.random.default_rng(seed)
    draw = (lambda: rng.integers(0, 3, L).astype(float)) if ties else (lambda: rng.random(L))
    tables = [range_table(draw())] * p if same else [range_table(draw()) for _ in range(p)]
    feasible = [rng.random((L + 1, L + 1)) < 0.8 for _ in range(p)] if masked else None
    value, path = min_max_chain(tables, feasible, with_path=True)
    assert min_max_chain(tables, feasible) == value
    brute = min([max(tables[s][b[s], b[s + 1]] for s in range(p))
                 for cuts in itertools.combinations(range(1, L), p - 1) for b in [(0, *cuts, L)]
                 if feasible is None or all(feasible[s][b[s], b[s + 1]] for s in range(p))], default=np.inf)
    assert value == brute
    assert (value, path) == _chain_over_every_start(tables, feasible)
