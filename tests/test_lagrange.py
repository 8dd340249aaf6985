"""The kind relaxation (eq. B4) never exceeds the exact optimum of a candidate; its DP paths
cost what the DP says; the multiset DP (eq. K6) returns real plans."""

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from amp_opt import parse_instance
from amp_opt.model.candidates import candidates
from amp_opt.model.engines import even_partition
from amp_opt.model.evaluate import evaluate
from amp_opt.model.costs import COST_MODELS
from amp_opt.model.tables import Tables
from amp_opt.search.free_grouping import candidate_graph
from amp_opt.model.generate import generate_instance
from amp_opt.search.kinds.bound import KindSearch, kind_bound
from amp_opt.search.kinds.construct import POLISH_RATE, Pace, construct, multiset_of, polish
from amp_opt.search.kinds.lagrangian import kind_model
from amp_opt.search.partition import optimal_path


def small_instance(seed, nodes, devices, types, layers, batch):
    return parse_instance(generate_instance(seed, nodes=nodes, devices_per_node=devices, device_types=min(types, nodes),
                                            layers=layers, global_batch=batch))


instances = st.builds(small_instance, seed=st.integers(0, 10**6), nodes=st.integers(2, 4),
                      devices=st.sampled_from([1, 2, 4]), types=st.integers(2, 3), layers=st.integers(4, 9),
                      batch=st.sampled_from([4, 8, 16]))


def chunks_of(instance, cand):
    """Interleaving's fixed chunks (the candidate's, Megatron's even split by default), else None."""
    if cand.virtual_stages == 1:
        return None
    return cand.chunks or even_partition(instance, cand.pp * cand.virtual_stages, exact=True)


def sample(cands):
    """Today's settings, and a fixed sample of the others (recomputation, ZeRO, virtual stages, cp)."""
    today = [c for c in cands if (c.recompute, c.zero_stage, c.virtual_stages, c.cp) == ("none", 0, 1, 1)]
    return today + [c for c in cands if c not in today][::4]


def exact(instance, cand):
    """The candidate's optimum under free grouping (the enumerator's stage DP) and its plan."""
    graph, to_plan = candidate_graph(Tables(instance), cand, COST_MODELS["hetero"], "free", chunks_of(instance, cand))
    best = optimal_path(graph)
    if best is None:
        return np.inf, None
    return best[0], to_plan(best[1])


def path_cost(model, path, y, T, U):
    """Sum of E + P + price along a DP path, recomputed term by term; checks its ranges are usable."""
    C = len(model.classes)
    prices = model.compositions(y[:C])[0] + np.array([sum(y[C + j] for j, B in enumerate(model.cut_sets) if set(S) <= set(B))
                                                      for S in model.kinds])
    total = 0.0
    for s, (i, k, l) in enumerate(zip(path.kinds, path.boundaries, path.boundaries[1:])):
        assert model.fits_at(model.in_flight[s])[i, k, l]
        # T is on the weighted compute: the stage's bottleneck weight (by its micro-batches in flight) times E.
        assert model.compute[i, k, l] * model.weight[model.in_flight[s]] <= T and model.allreduce[i, k, l] <= U
        total += model.compute[i, k, l] * model.fill + prices[i]
        if s:
            total += model.volume[k] / min(model.ring(model.kinds[path.kinds[s - 1]]), model.ring(model.kinds[i]))
    return total


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances)
@example(small_instance(7, 3, 4, 2, 4, 8))  # the greedy memory test called a fitting candidate infeasible
def test_cost_model_bounds_never_exceed_the_optimum(instance):
    """B2 (labelled) and B3 (fractional, with its allreduce floor) lie below every candidate's
    optimum under free grouping, so pruning by them never loses a plan."""
    tables, model = Tables(instance), COST_MODELS["hetero"]
    for cand in sample(candidates(instance)):
        optimum, _ = exact(instance, cand)
        for labelled in (True, False):
            bound = model.lower_bound(tables, cand, labelled=labelled)
            assert bound <= optimum * (1 + 1e-9), (cand, labelled, bound, optimum)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances, st.floats(0.0, 1.5))
def test_a_bound_asked_for_enough_is_the_bound_below_it_and_enough_above(instance, share):
    """With ``enough`` (a search's cutoff) the cost model may stop at a cheaper part of its bound
    once that part reaches it: below ``enough`` the bound is the full one, else at least
    ``enough``; either way below the candidate's optimum."""
    tables, model = Tables(instance), COST_MODELS["hetero"]
    for cand in sample(candidates(instance)):
        optimum, _ = exact(instance, cand)
        for labelled in (True, False):
            full = model.lower_bound(tables, cand, labelled=labelled)
            enough = share * full if np.isfinite(full) else share * 10.0
            cut = model.lower_bound(tables, cand, labelled=labelled, enough=enough)
            if full < enough:
                assert cut == full, (cand, labelled, cut, full, enough)
            else:
                assert cut >= enough, (cand, labelled, cut, full, enough)
            assert cut <= optimum * (1 + 1e-9), (cand, labelled, cut, optimum)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # 40 under -m slow
@given(instances, st.integers(0, 2**31))
def test_kind_bound_never_exceeds_the_optimum(instance, seed):
    check_kind_bound(instance, seed)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances, st.integers(0, 2**31))
def test_kind_bound_never_exceeds_the_optimum_long(instance, seed):
    check_kind_bound(instance, seed)


def check_kind_bound(instance, seed):
    """The kind bound at, below and above the optimum; lowered from the ceiling; a DP path's value."""
    rng = np.random.default_rng(seed)
    tables = Tables(instance)
    for cand in sample(candidates(instance)):
        model = kind_model(tables, cand, chunks_of(instance, cand))
        optimum, plan = exact(instance, cand)
        target = optimum * rng.choice([0.97, 1.0, 1.03]) if np.isfinite(optimum) else 1e9
        bound = kind_bound(model, target, sweeps=200)
        assert bound <= target * (1 + 1e-12)
        if np.isfinite(optimum):
            assert bound <= optimum * (1 + 1e-9), (cand, bound, optimum)
        # Started at the ceiling, as the MIPs do before they know a plan, then lowered: the cells
        # shrink to the new target and the bound stays valid.
        lowered = KindSearch(model, max(model.ceiling, target))
        lowered.raise_to(max(model.ceiling, target), 20)
        again = lowered.raise_to(target, 200)
        assert again <= target * (1 + 1e-12)
        if np.isfinite(optimum):
            assert again <= optimum * (1 + 1e-9), (cand, again, optimum)
        # A DP path costs exactly its value, at any prices and thresholds.
        C = len(model.classes)
        lam = np.concatenate([rng.normal(0, 1e-3, C), rng.exponential(1e-3, model.dims - C)])
        T, U = (float(rng.uniform(0.5, 2.0) * x) for x in (
            model.w_top * np.nanmax(np.where(np.isfinite(model.compute), model.compute, np.nan)),
            np.nanmax(np.where(np.isfinite(model.allreduce), model.allreduce, np.nan))))
        h, paths = model.sweep(lam, np.array([T]), np.array([U]), paths=True)
        if paths[0] is not None:
            assert path_cost(model, paths[0], lam, T, U) == np.float64(h[0]) or \
                abs(path_cost(model, paths[0], lam, T, U) - h[0]) <= 1e-9 * max(1.0, abs(h[0]))
        # Plans built from the relaxation's weakest cells are real plans, never below the optimum.
        search = KindSearch(model, target)
        search.raise_to(target, 100)
        built = construct(model, search.promising(2))
        if built is not None:
            again = evaluate(instance, built.plan)
            assert again.feasible and again.predicted_time == built.value
            assert built.value >= optimum * (1 - 1e-9)
        if plan is not None:
            # No plan costs the ceiling, and the optimum meets every rounding cut (eq. K7).
            assert optimum < model.ceiling
            stages_of = multiset_of(model, plan.stages)
            inside = sum(n * model.inside[k] for k, n in stages_of.items())
            assert (inside <= model.cut_rhs).all()
            # The optimum's own kinds, re-ordered by the multiset DP: a real plan, never better.
            ev = evaluate(instance, plan)
            pace = Pace()
            assert pace.rate() == POLISH_RATE  # assumed until a run is timed
            # At the optimum's own thresholds: its weighted bottleneck (H13) and largest allreduce.
            found = polish(model, plan.stages, [(ev.breakdown["pipeline_bottleneck"], max(s.allreduce for s in ev.stages))],
                           pace=pace)
            assert found is not None
            assert pace.operations > 0 and pace.seconds > 0  # the run taught it the machine's pace
            assert found.value >= optimum * (1 - 1e-9)
            assert evaluate(instance, found.plan).feasible


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(instances)
def test_mips_with_the_kind_search_still_equal_the_enumerator(monkeypatch, instance):
    """Phase 1b only runs from KIND_MIN_NODES nodes; forced on, the MIPs must still be exact."""
    import amp_opt.search.kinds.refine as refine
    from amp_opt import InfeasibleError, solve

    monkeypatch.setattr(refine, "KIND_MIN_NODES", 1)
    found = {}
    for solver in ("enumerate", "cpsat", "cbc"):
        try:
            found[solver] = solve(instance, solver=solver)
        except InfeasibleError:
            found[solver] = None
    assert len({r is None for r in found.values()}) == 1
    if found["enumerate"] is not None:
        ref = found["enumerate"].best.predicted_time
        for solver in ("cpsat", "cbc"):
            result = found[solver]
            assert result.solver.status == "OPTIMAL"
            assert result.best.predicted_time == pytest.approx(ref, rel=1e-5)
            assert result.solver.objective == pytest.approx(result.best.predicted_time, rel=1e-5)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances, st.integers(0, 2**32 - 1))
def test_sweep_arcs_are_the_cheapest_usable_kind_of_every_range(instance, seed):
    """The sweep's arcs (which take the cheapest kind over the ranges usable at the least weight
    and search again only where that kind is not usable at a stage's weight and memory) equal a
    kind-by-kind minimum at every stage's own weight, memory and thresholds, ties to the first kind."""
    rng = np.random.default_rng(seed)
    tables = Tables(instance)
    for cand in sample(candidates(instance, COST_MODELS["hetero"]))[:6]:
        model = kind_model(tables, cand, chunks_of(instance, cand))
        if model is None:
            continue
        C, batch = len(model.classes), 3
        y = np.concatenate([rng.normal(0, 1e-3, (batch, C)), rng.exponential(1e-3, (batch, model.dims - C))], axis=1)
        top = model.w_top * np.nanmax(np.where(np.isfinite(model.compute), model.compute, np.nan))
        T = rng.uniform(0.05, 1.2, batch) * top
        U = rng.uniform(0.2, 1.2, batch) * np.nanmax(np.where(np.isfinite(model.allreduce), model.allreduce, np.nan))
        arcs, which = model._arcs(y, T, U)
        prices = np.array([model.prices(row) for row in y])
        L = model.L
        for (f, b), row in arcs.items():
            kinds = np.flatnonzero(model.link_of == b)
            width = 0 if row is None else row.shape[-1]
            for j in range(batch):
                for l in range(1, L + 1):
                    for length in range(1, l + 1):
                        k = l - length
                        costs = [model.compute[i, k, l] * model.fill + prices[j, i]
                                 if model.fits_at(f)[i, k, l] and model.weight[f] * model.compute[i, k, l] <= T[j]
                                 and model.allreduce[i, k, l] <= U[j] else np.inf for i in kinds]
                        expect = min(costs)
                        if length > width:  # beyond the band: no kind of this level may use it
                            assert row is None or not np.isfinite(expect), (f, b, j, k, l)
                            continue
                        assert row[j, l, length - 1] == expect, (f, b, j, k, l)
                        if np.isfinite(expect):
                            assert which[f, b][j, l, length - 1] == kinds[int(np.argmin(costs))]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances)
def test_fit_ranks_hold_every_stage_memory_test(instance):
    """A kind model keeps, per kind and range, how many in-flight counts (smallest first) the range
    fits; for every stage that says exactly what eq. H5 says of the stage's own memory, for the
    ranges a stage of a p-stage partition can take (at most L - p + 1 layers)."""
    from amp_opt.model.costs import CandidateTerms
    from amp_opt.model.costs.terms import stage_order

    tables = Tables(instance)
    for cand in sample(candidates(instance, COST_MODELS["hetero"])):
        chunks = chunks_of(instance, cand)
        model = kind_model(tables, cand, chunks)
        if model is None:
            continue
        terms = CandidateTerms(tables, cand, chunks=chunks)
        fixed = None if chunks is None else stage_order(chunks, cand.pp)[1]
        for s, f in enumerate(model.in_flight):
            table = model.fits_at(f)
            for i in range(len(model.kinds)):
                for k in range(model.L):
                    for l in range(k + 1, model.L + 1):
                        need = terms.memory_in(s, k, l, model.mode[i]) if terms.per_stage else terms.memory(s, k, l)
                        expect = bool(need <= model.capacity[i]) and l - k <= model.L - cand.pp + 1
                        if fixed is not None:  # interleaved: only the stages' own chunks
                            expect &= any((fixed[t], fixed[t + 1]) == (k, l) for t in range(cand.pp))
                        assert table[i, k, l] == expect, (cand, s, i, k, l)


def test_a_ruled_out_candidate_lets_its_kind_search_go_and_keeps_its_bound():
    """Once a candidate's kind bound reaches the best plan, phase 1b keeps only that bound (its
    tables are megabytes on 1024 GPUs); raised again, even from nothing, it is still ruled out."""
    from amp_opt.search.clock import NO_LIMIT
    from amp_opt.search.context import Search
    from amp_opt.search.kinds.bound import KindSearch
    from amp_opt.search.kinds.refine import KindPhase, RuledOut
    from amp_opt.search.options import solve_options

    inst = small_instance(11, 4, 2, 3, 6, 8)
    search = Search(inst, solve_options(solver="cpsat"))
    phase = KindPhase(search)
    cands = [c for c in candidates(inst, COST_MODELS["hetero"]) if c.virtual_stages == 1]
    optimum = {c: exact(inst, c)[0] for c in cands}
    best = min(optimum.values())
    lower = dict.fromkeys(cands, 0.0)
    phase.raise_bounds(cands, lower, best, NO_LIMIT)
    out = [c for c in cands if lower[c] >= best]
    assert out and all(isinstance(phase.searches[c], RuledOut) and phase.searches[c].bound == lower[c] for c in out)
    assert all(isinstance(phase.searches[c], KindSearch) for c in cands if lower[c] < best)
    assert all(lower[c] <= optimum[c] * (1 + 1e-9) for c in cands)
    again = dict.fromkeys(cands, 0.0)
    phase.raise_bounds(cands, again, best, NO_LIMIT)
    assert all(again[c] == lower[c] for c in out)



@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_every_cut_a_cell_keeps_lies_above_its_dual_function(monkeypatch, seed):
    """A cell's cuts, its own and those kept from the cell it was split from or clipped out of,
    are at least its dual function lead + h(T_hi, U_hi) - constant at any multipliers: else the
    ascent would call a cell settled below its dual's maximum.  Each kept cut's path also keeps
    within the cell's thresholds, and no dual step goes further than REACH targets."""
    from amp_opt.search.kinds.bound import REACH, Ascent

    kept, origin, steps = [], {}, []  # cuts kept per new ascent; per cut (its g's id), the largest multiplier it was taken at
    inherit, record = Ascent.inherit, Ascent.record

    def counted(self, parent, shift):
        inherit(self, parent, shift)
        kept.append(len(self.rows))

    def noted(self, value, g, path, reach):
        lam = float(np.abs(self.lam).max())
        record(self, value, g, path, reach)
        origin[id(self.rows[-1][1])] = lam
        # The next multipliers stay within REACH targets of the best so far (far out, the dual's
        # values are differences of huge prices and lose the precision a proof needs).
        steps.append(float(np.abs(self.lam - self.center).max()) / self.target)

    monkeypatch.setattr(Ascent, "inherit", counted)
    monkeypatch.setattr(Ascent, "record", noted)
    rng = np.random.default_rng(seed)
    instance = small_instance(seed, 4, 2, 3, 8, 8)
    tables = Tables(instance)
    for cand in sample(candidates(instance, COST_MODELS["hetero"]))[:8]:
        model = kind_model(tables, cand, chunks_of(instance, cand))
        if model is None:
            continue
        target = 1.5 * COST_MODELS["hetero"].lower_bound(tables, cand)
        if not np.isfinite(target):
            continue
        search = KindSearch(model, model.ceiling)  # a high first target, then clipped to the lower one
        search.raise_to(model.ceiling, 20)
        search.raise_to(target, 300)
        C = len(model.classes)
        for _, _, cell in search.heap:
            if cell.ascent is None or not np.isfinite(cell.bound):
                continue
            assert len(cell.ascent.rows) == len(cell.ascent.reach)
            assert all(t <= cell.T_hi and u <= cell.U_hi for t, u in cell.ascent.reach)
            ys = [cell.lam] + [np.concatenate([cell.lam[:C] + rng.normal(0, 1e-3, C),
                                               cell.lam[C:] + rng.exponential(1e-3, model.dims - C)]) for _ in range(2)]
            h, _ = model.sweep(np.array(ys), np.full(len(ys), cell.T_hi), np.full(len(ys), cell.U_hi))
            for y, value in zip(ys, h):
                dual = cell.lead(model.w) + value - model.constant(y)
                for rhs, g in cell.ascent.rows:
                    # rhs = value - g . lam0 at the cut's own multipliers lam0, whose prices and constant
                    # (up to |lam0| times the supply) cancel in value: rounding grows with both.
                    scale = max(1.0, abs(dual), abs(rhs), float(np.abs(g) @ np.abs(y)),
                                origin[id(g)] * float(model.supply.sum() + model.cut_rhs.sum()))
                    assert dual <= rhs + g @ y + 1e-12 * scale, (cand, cell.T_hi, cell.U_hi)
    assert sum(kept) > 0  # cells did start from kept cuts
    assert steps and max(steps) <= REACH * (1 + 1e-9)


def test_a_better_plan_lets_go_of_the_kind_searches_it_rules_out():
    """A candidate whose kind bound was raised below the best plan of the time and which a better
    plan found since rules out lets its kind search go too (KindPhase.release), keeping its bound;
    one bounded just below the new best keeps its search; with top_k 2 only the cutoff rules out."""
    from amp_opt.search.clock import NO_LIMIT
    from amp_opt.search.context import Search
    from amp_opt.search.kinds.bound import KindSearch
    from amp_opt.search.kinds.refine import KindPhase, RuledOut
    from amp_opt.search.options import solve_options

    inst = small_instance(11, 4, 2, 3, 6, 8)
    cands = [c for c in candidates(inst, COST_MODELS["hetero"]) if c.virtual_stages == 1]
    worst = 2 * max(exact(inst, c)[0] for c in cands)  # a first plan that rules nothing out
    for top_k in (1, 2):
        phase = KindPhase(Search(inst, solve_options(solver="cpsat", top_k=top_k)))
        lower = dict.fromkeys(cands, 0.0)
        phase.raise_bounds(cands, lower, worst, NO_LIMIT)
        kept = sorted({lower[c] for c in cands if isinstance(phase.searches.get(c), KindSearch)})
        assert len(kept) >= 3
        best = kept[len(kept) // 2]  # a better plan, at the median bound of those kept
        before = dict(phase.searches)
        phase.release(lower, best)
        for c in cands:
            if top_k == 1 and isinstance(before[c], KindSearch) and lower[c] >= best:
                assert isinstance(phase.searches[c], RuledOut) and phase.searches[c].bound == lower[c]
            else:
                assert phase.searches[c] is before[c]
        below = kept[len(kept) // 2 - 1]  # bounded just below the new best: kept
        assert any(isinstance(phase.searches[c], KindSearch) and lower[c] == below for c in cands)
