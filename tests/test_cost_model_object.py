"""A caller's cost model object is the one every search path prices with (formulations/hetero.md,
"One source of terms"): a HeteroModel subclass that overrides ``candidate_terms`` moves the
optimum, and the enumerator, CP-SAT, CBC, HiGHS and the stage-kind search all reach the brute
force's optimum under it; a subclass that overrides ``stage_costs`` alone is searched by the
enumerator and refused, with a one-line InputError, by the solvers that price rows."""

import dataclasses
import functools
import importlib.util

import pytest

from amp_opt import InfeasibleError, InputError, evaluate, solve
from amp_opt.bench.brute import brute_force
from amp_opt.model.costs.amp import AmpModel
from amp_opt.model.costs.hetero import HeteroCosts, HeteroModel
from amp_opt.model.costs.contract import bound_holds, library_priced, rows_price
from amp_opt.model.costs.terms import CandidateTerms
from amp_opt.model.evaluate import memory_parts
from amp_opt.model.tables import Tables
from amp_opt.model.candidates import candidates
from amp_opt.search.context import Search
from amp_opt.search.free_grouping import candidate_graph
from amp_opt.search.kinds import refine
from amp_opt.search.kinds.bound import kind_bound
from amp_opt.search.kinds.lagrangian import kind_model
from amp_opt.search.options import solve_options
from amp_opt.search.partition import optimal_path
from test_brute import REL, tiny

HIGHS = importlib.util.find_spec("highspy") is not None  # the [highs] extra
SOLVERS = ["enumerate", "cpsat", "cbc"] + (["highs"] if HIGHS else [])
SEEDS = range(6)  # the optimum moves under every model below on at least one of these


class _ScaledTerms(CandidateTerms):
    """The candidate's terms with one device type's layer seconds times ``factor``."""

    def __init__(self, tables, cand, *, device_type, factor, **kw):
        super().__init__(tables, cand, **kw)
        self.device_type, self.factor = device_type, factor

    def layer_seconds(self, device_type, intra, mode, latency=0.0):
        out = super().layer_seconds(device_type, intra, mode, latency)
        return out * self.factor if device_type == self.device_type else out


class ScaledType(HeteroModel):
    """The hetero model with ``device_type`` computing ``factor`` times slower."""

    def __init__(self, device_type: str, factor: float):
        super().__init__(f"{device_type} x{factor:g}")
        self.device_type, self.factor = device_type, factor

    def candidate_terms(self, tables, cand, *, chunks=None, modes=None):
        return _ScaledTerms(tables, cand, chunks=chunks, modes=modes, device_type=self.device_type, factor=self.factor)


class SlowLink(HeteroModel):
    """The hetero model with the network link of every node of ``device_type`` ``factor`` times slower."""

    def __init__(self, device_type: str, factor: float = 10.0, *, node: str | None = None):
        super().__init__(f"{device_type} link /{factor:g}")
        self.device_type, self.factor, self.node = device_type, factor, node

    def candidate_terms(self, tables, cand, *, chunks=None, modes=None):
        terms = super().candidate_terms(tables, cand, chunks=chunks, modes=modes)
        inst = terms.instance
        slow = (lambda n: n.name == self.node) if self.node else (lambda n: n.device_type == self.device_type)
        nodes = tuple(dataclasses.replace(n, inter_bandwidth=n.inter_bandwidth / self.factor) if slow(n) else n
                      for n in inst.nodes)
        terms.instance = dataclasses.replace(inst, nodes=nodes)
        return terms


class _FastStages(HeteroCosts):
    def compute(self, s, k, l):
        out = super().compute(s, k, l)
        return out / 3.0 if self.model.device_type in self.placement[s].device_types else out


class OwnStages(HeteroModel):
    """A model of the caller's that prices through ``stage_costs`` alone: stages holding a device
    of ``device_type`` compute 3x faster (by their device types only, so that the enumerator's
    free grouping, which ties a stage's terms to its node classes, stays exact; faster, so that
    amp_opt's bound, which does not see it, would prune plans it must not)."""

    def __init__(self, device_type: str):
        super().__init__("own-stages")
        self.device_type = device_type

    def stage_costs(self, tables, cand, stages, *, chunks=None, modes=None):
        return _FastStages(self, tables, cand, stages, chunks=chunks, modes=modes)


@functools.lru_cache(maxsize=None)
def instance(seed: int):
    return tiny(seed, devices=2 + seed % 2, layers=3 + (seed // 2) % 2, engine="megatron", idle=True)


@functools.lru_cache(maxsize=None)
def truth(seed: int, kind: str | None):
    """The brute force's best plan of seed's instance under the model ``kind`` (None: hetero)."""
    inst = instance(seed)
    return brute_force(inst, cost_model=MODELS[kind](inst) if kind else "hetero")


def fastest(inst) -> str:
    """The device type with the fastest layers (tp 1, micro-batch 1): slowing it moves plans most."""
    tables = Tables(inst)
    speed = {n.device_type: float(tables.layer_times(n.device_type, n.intra_bandwidth, 1, 1).seconds.sum())
             for n in inst.nodes}
    return min(speed, key=speed.get)


MODELS = {
    "compute 3x slower": lambda inst: ScaledType(fastest(inst), 3.0),
    "compute 3x faster": lambda inst: ScaledType(fastest(inst), 1 / 3),
    "link 10x slower": lambda inst: SlowLink(inst.nodes[0].device_type),
    "link 10x faster": lambda inst: SlowLink(inst.nodes[0].device_type, 0.1),
}


def optimum(inst, solver, model):
    try:
        result = solve(inst, solver=solver, cost_model=model)
    except InfeasibleError:
        return None
    assert result.solver.status == "OPTIMAL"
    assert result.best.cost_model == model.name
    return result.best.predicted_time


def same(found, truth) -> bool:
    return (found is None) == (truth is None) and (truth is None or found == pytest.approx(truth.value, rel=REL))


@pytest.mark.parametrize("kind", ["compute 3x slower", "compute 3x faster", "link 10x slower"])
def test_every_solver_reaches_the_brute_force_under_a_candidate_terms_override(kind):
    moved = 0
    for seed in SEEDS:
        inst = instance(seed)
        model = MODELS[kind](inst)
        assert rows_price(model) and bound_holds(model) and not library_priced(model)
        best, plain = truth(seed, kind), truth(seed, None)
        moved += best is not None and plain is not None and best.value != pytest.approx(plain.value, rel=1e-6)
        for solver in SOLVERS:
            found = optimum(inst, solver, model)
            assert same(found, best), (seed, solver, found, best and best.value)
    assert moved, f"{kind}: the optimum never moved, so this test could not fail"


def test_the_stage_kind_search_prices_with_the_model(monkeypatch):
    """Phase 1b (the kind bound B4 and its plans) runs from 8 nodes; here on every cluster.  A
    model faster than amp_opt's: priced without it, the kind bound would rule out its optimum."""
    monkeypatch.setattr(refine, "KIND_MIN_NODES", 0)
    for seed in SEEDS[:4]:
        inst = instance(seed)
        found = optimum(inst, "cpsat", MODELS["compute 3x faster"](inst))
        assert same(found, truth(seed, "compute 3x faster")), seed


@pytest.mark.parametrize("kind", ["compute 3x faster", "link 10x faster"])
def test_the_kind_bound_stays_below_each_candidates_optimum_under_the_model(kind):
    """B4 from the model's terms lies below every candidate's optimum under free grouping (the
    enumerator's stage DP under the model); from amp_opt's own terms it would not."""
    for seed in SEEDS[:4]:
        inst = instance(seed)
        tables, model = Tables(inst), MODELS[kind](inst)
        for cand in candidates(inst, model):
            chunks = Search(inst, solve_options(cost_model=model)).chunks(cand)
            graph, _ = candidate_graph(tables, cand, model, "free", chunks)
            best = optimal_path(graph)
            kinds = kind_model(tables, cand, chunks, model)
            if best is None or kinds is None:
                continue
            assert kind_bound(kinds, 10 * best[0], sweeps=200) <= best[0] * (1 + 1e-9), (seed, cand)  # B4 is capped at its target


def test_identical_nodes_priced_apart_are_refused():
    """The searches tie identical nodes (node classes); a model may not price one of them apart."""
    inst = instance(5)  # two identical A100 nodes
    names = [n.name for n in inst.nodes]
    model = SlowLink("", node=names[0])
    with pytest.raises(InputError, match="cost_model: candidate_terms priced .* identical nodes differently"):
        solve(inst, solver="enumerate", cost_model=model)


@pytest.mark.parametrize("solver", [s for s in SOLVERS if s != "enumerate"])
def test_a_stage_costs_override_is_refused_by_the_rows(solver):
    inst = instance(1)
    model = OwnStages(fastest(inst))
    assert not rows_price(model) and not bound_holds(model)
    with pytest.raises(InputError) as err:
        solve(inst, solver=solver, cost_model=model)
    assert err.value.field == "cost_model"
    assert "override candidate_terms" in str(err.value) and "--solver enumerate" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_stage_costs_override_is_enumerated_by_auto():
    moved = 0
    for seed in SEEDS:
        inst = instance(seed)
        model = OwnStages(fastest(inst))
        best, plain = brute_force(inst, cost_model=model), truth(seed, None)
        moved += best is not None and best.value != pytest.approx(plain.value, rel=1e-6)
        assert same(optimum(inst, "auto", model), best), seed
    assert moved


def test_auto_refuses_a_stage_costs_override_it_cannot_enumerate(monkeypatch):
    monkeypatch.setattr("amp_opt.search.solve.enumerator_fits", lambda instance, placement: (False, "too large"))
    inst = instance(1)
    with pytest.raises(InputError, match="cost_model: .*auto's choice: too large.*--solver enumerate"):
        solve(inst, cost_model=OwnStages(fastest(inst)))
    assert solve(inst, cost_model=ScaledType(fastest(inst), 3.0)).solver.status == "OPTIMAL"  # rows price it


def test_the_library_models_are_priced_by_the_rows():
    from amp_opt.model.costs import COST_MODELS

    for model in COST_MODELS.values():
        assert rows_price(model) and bound_holds(model) and library_priced(model), model.name


@pytest.mark.parametrize("solver", SOLVERS)
def test_a_subclass_of_the_amp_model_keeps_every_path(solver):
    """AMP's model reads candidate_terms too (volumes, memory): a subclass of it that changes its
    name only is priced by the rows and finds amp's optimum with every solver."""
    class MyAmp(AmpModel):
        name = "my-amp"

    inst = tiny(1, devices=3, layers=3, engine="megatron", idle=False)  # AMP prices every device
    assert rows_price(MyAmp()) and library_priced(MyAmp())
    mine = solve(inst, solver=solver, cost_model=MyAmp())
    assert mine.best.cost_model == "my-amp" and mine.solver.status == "OPTIMAL"
    assert mine.best.predicted_time == pytest.approx(brute_force(inst, cost_model="amp").value, rel=REL)


def test_the_memory_split_reads_the_model():
    """memory_parts (explain, plot) splits a stage's bytes by the model's terms: a model that
    doubles the bytes of model state per parameter shows twice the state and the same activations."""
    class HeavyState(HeteroModel):
        def candidate_terms(self, tables, cand, *, chunks=None, modes=None):
            terms = super().candidate_terms(tables, cand, chunks=chunks, modes=modes)
            terms.state_bytes_per_param *= 2
            return terms

    inst = instance(0)
    plan = truth(0, None).evaluations[0].plan
    plain, heavy = (memory_parts(inst, evaluate(inst, plan, m), m) for m in ("hetero", HeavyState()))
    for a, b in zip(plain, heavy):
        assert a.model_state > 0 and b.model_state == pytest.approx(2 * a.model_state, rel=1e-12)
        assert b.activations == pytest.approx(a.activations, rel=1e-9, abs=1.0)
