"""Analysis the commands print lives in the library: explain's alternatives
(amp_opt.search.alternatives) and profile's measurements-to-instance (amp_opt.model.profile_instance)."""

import dataclasses
import json

from conftest import instance_dict

import amp_opt
from amp_opt.model.load import parse_instance
from amp_opt.runtime.layout import RUNNABLE
from amp_opt.model.profile_instance import profiled_instance
from amp_opt.search import alternatives


def test_explain_uses_the_library_analysis():
    from amp_opt.commands import explain

    assert explain.explain_plan is alternatives.explain_plan
    assert explain.explain_instance is alternatives.explain_instance


def test_a_candidates_best_plan_is_the_exact_searchs(paper_instances):
    """best_plan_of (the exact DP over one candidate's groupings) meets the enumerator's optimum
    on the optimum's candidate."""
    inst = paper_instances["het_cluster"]
    best = amp_opt.solve(inst, solver="enumerate").best
    found = alternatives.best_plan_of(inst, best.plan.candidate, "hetero")
    assert found is not None and found.predicted_time == best.predicted_time


def test_relaxations_each_relax_one_rule(paper_instances):
    inst = paper_instances["het_cluster"]
    strict = dataclasses.replace(inst, search=dataclasses.replace(inst.search, zero_stages=(0,), recompute=("none",)))
    changes = dict(alternatives.relaxations(strict))
    assert set(changes["allow ZeRO stages 0-3"].search.zero_stages) == {0, 1, 2, 3}
    assert set(changes["allow activation recomputation"].search.recompute) > {"none"}
    assert "allow ZeRO stages 0-3" not in dict(alternatives.relaxations(changes["allow ZeRO stages 0-3"]))


@dataclasses.dataclass
class _Result:  # the fields of the engine's ProfileResult that the instance takes
    device_type: str
    tp: int
    micro_batch: int
    oom: bool = False
    error: str = ""


def test_measurements_become_a_solvable_instance_with_every_change_noted():
    doc = instance_dict("amp_het_cluster")
    doc["training"].pop("memory_reserve", None)
    instance = parse_instance(doc)
    name = instance.nodes[0].device_type
    results = [_Result(name, 1, 1), _Result(name, 1, 8, oom=True, error="out of memory")]
    links = {"allreduce": [{"bytes": 1 << 20, "bandwidth": 5e9}]}
    out, notes = profiled_instance(doc, instance, results, device_type=name, device="cpu", dtype_bytes=4,
                                   runnable=RUNNABLE, links=links, link_processes=2, notes=["a caller's note"])
    assert out["training"]["memory_reserve"] == 0
    assert all(out["search"][k] == v for k, v in RUNNABLE.items())
    assert out["measurements"]["out_of_memory"] == [{"device_type": name, "tp": 1, "micro_batch": 8,
                                                     "error": "out of memory"}]
    assert all(n["intra_bandwidth"] == 5e9 for n in out["nodes"] if n["device_type"] == name)
    assert out["measurements"]["notes"] == notes and "a caller's note" in notes
    assert any("memory_reserve set to 0" in n for n in notes) and any("intra_bandwidth" in n for n in notes)
    parse_instance(json.loads(json.dumps(out)))  # loads as it stands
    assert "measurements" not in doc or "notes" not in doc.get("measurements", {})  # the input is not changed
    on_gpu, _ = profiled_instance(doc, instance, results[:1], device_type=name, device="cuda", dtype_bytes=2)
    assert "memory_reserve" not in on_gpu["training"] and "search" not in on_gpu or on_gpu["search"] == doc.get("search")
