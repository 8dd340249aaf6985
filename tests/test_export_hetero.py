"""export --format flagscale: the config FlagScale's heterogeneous training reads, checked by its own rules.

``flagscale_accepts`` re-implements the checks FlagScale applies (FlagOpen/FlagScale at
da4935ec): ``FSTrainArguments.pre_validate_args`` in flagscale/train/arguments.py, the rank order
of ``RankMapper.build_rank_mapping`` and ``ProcessMesh`` (order "tp-cp-ep-dp-pp", offset) in
flagscale/train/hetero/parallel_context.py, the hostfile of ``parse_hostfile`` in
flagscale/runner/utils.py, and Megatron's ``ConstantNumMicroBatchesCalculator``
(megatron/core/num_microbatches_calculator.py: the global batch is a whole number of
micro_batch_size * data_parallel_size); the per-stage recomputation flags as ``post_validate_args``
parses them.
"""

import ast
import json
import re
import subprocess
import sys
from functools import cmp_to_key

import pytest

from amp_opt.errors import InputError
from amp_opt.export.flagscale import export_flagscale, to_yaml
from amp_opt.model.load import parse_instance
from amp_opt.model.plan import check_plan, parse_plan

MODEL = {"preset": "gpt", "hidden": 64, "layers": 4, "heads": 4, "seq_len": 32, "vocab": 128}


def two_types(tied=True, a=4, v=4, batch=16):
    """Node "a" of A100s (devices 0..a-1), node "v" of V100s; engine amp_opt."""
    return {"format": "amp_opt.instance", "version": 1, "name": "two-types",
            "model": dict(MODEL, tied_embeddings=tied),
            "device_types": [{"name": "A100", "memory": "40 GiB", "peak_flops": 3.12e14},
                             {"name": "V100", "memory": "16 GiB", "peak_flops": 1.25e14}],
            "nodes": [{"name": "a", "device_type": "A100", "devices": a, "intra_bandwidth": "300 GB/s",
                       "inter_bandwidth": "25 GB/s"},
                      {"name": "v", "device_type": "V100", "devices": v, "intra_bandwidth": "150 GB/s",
                       "inter_bandwidth": "25 GB/s"}],
            "training": {"global_batch": batch}, "search": {"engine": "amp_opt"}}


# stage 0: two A100 replicas at tp 1; stage 1: one A100 replica at tp 2; stage 2: two V100 replicas
THREE = {"tp": [1, 2, 1], "dp": [2, 1, 2], "pp": 3, "shares": [[2, 2], [4], [2, 2]], "partition": [0, 2, 4, 6],
         "stages": [[[0], [1]], [[2, 3]], [[4], [5]]]}


def flagscale_accepts(instance, plan, out):
    """FlagScale's own checks on the exported config, and that its ranks land on the plan's devices."""
    plan = check_plan(instance, plan)
    system, model = out["config"]["system"], out["config"]["model"]
    hetero = system["hetero"]
    flat = hetero["hetero_process_meshes"]
    # pre_validate_args
    assert hetero["enable_hetero"] is True and len(flat) % 5 == 0
    tps, cps, eps, dps, pps = (flat[k::5] for k in range(5))
    dp0, mbs = dps[0], model["micro_batch_size"]
    assert all(dp0 * mbs % dp == 0 for dp in dps)
    assert all(cp == cps[0] for cp in cps) and all(ep == 1 for ep in eps)
    assert system["pipeline_model_parallel_size"] == sum(pps)
    assert hetero["standalone_embedding_stage"] is False
    tied = instance.layers[0].tie is not None and instance.layers[0].tie == instance.layers[-1].tie
    if tied:
        assert tps[0] == tps[-1]
        if dps[0] != dps[-1] and system.get("use_distributed_optimizer"):
            assert dps[0] % dps[-1] == 0 or dps[-1] % dps[0] == 0
            assert hetero["use_partial_reduce_for_shared_embedding"] is True
    split = hetero["hetero_pipeline_layer_split"]
    assert sum(split) == model["num_layers"] and len(split) == system["pipeline_model_parallel_size"]
    types = hetero["hetero_device_types"]
    assert len(types) == len(flat) // 5 and hetero["hetero_current_device_type"] in types
    assert "num_layers_per_virtual_pipeline_stage" not in system
    # Megatron's micro-batch calculator: a whole number of micro-batches of M = mbs * dp_0
    assert model["global_batch_size"] % (mbs * dp0) == 0
    # what the plan asked for: M, each mesh's samples per replica (dp_0 * mbs // dp_i), the layer split
    assert mbs * dp0 == plan.pipeline_micro_batch and model["global_batch_size"] == instance.training.global_batch
    stage_of = [i for i, pp in enumerate(pps) for _ in range(pp)]
    for s in range(plan.pp):
        i = stage_of[s]
        assert (tps[i], dps[i], cps[i]) == (plan.tp_at(s), plan.dp_at(s), plan.cp)
        assert all(share == dp0 * mbs // dps[i] for share in plan.shares_at(s))
        kinds = [instance.layers[k].kind for k in plan.stage_layers(s)]
        assert split[s] == kinds.count("transformer")
    _recompute_accepted(plan, system, model, dp0, mbs)
    world = sum(t * c * d * p for t, c, d, p in zip(tps, cps, dps, pps))
    assert world == plan.devices == out["launch"]["world_size"]
    _ranks_land_on_the_plan(instance, plan, out, tps, cps, dps, pps, types)


def _recompute_accepted(plan, system, model, dp0, mbs):
    """post_validate_args's parse of the per-stage flags (each entry [stages, n0, flag0, n1, flag1, ...]
    expanded to one flag per micro-batch of each stage, global / (micro_batch_size * dp) of them, the
    stages adding up to pp; flags 0 or 1; only beside full granularity and a method), and what the
    patched TransformerBlock then runs on each stage: full recomputation where the flag is 1."""
    entries = system.get("recompute_granularity_per_stage_micro_batch")
    if entries is None:
        assert isinstance(plan.recompute, str)
        return
    assert system["recompute_granularity"] == "full" and system.get("recompute_method") is not None
    flags = []
    for entry in (ast.literal_eval(str(e)) for e in entries):  # the runner passes each entry as str(entry)
        for _ in range(entry[0]):
            per_micro = [f for k in range(len(entry) // 2) for f in [entry[2 + 2 * k]] * entry[1 + 2 * k]]
            assert len(per_micro) == model["global_batch_size"] // (mbs * dp0)
            assert all(f in (0, 1) for f in per_micro)
            flags.append(per_micro)
    assert len(flags) == system["pipeline_model_parallel_size"]
    assert [("full" if set(f) == {1} else "none" if set(f) == {0} else None) for f in flags] == [
        plan.recompute_of(s) for s in range(plan.pp)]


def _ranks_land_on_the_plan(instance, plan, out, tps, cps, dps, pps, types):
    """Physical ranks from the hostfile (torchrun: node by node, CUDA_VISIBLE_DEVICES order), sorted as
    RankMapper sorts them (type index in hetero_device_types, then rank): logical rank k of mesh i at
    offset o is o + tp_rank + tp*(cp_rank + cp*(dp_rank + dp*pipeline_rank)) (ProcessMesh, tp-cp-ep-dp-pp)."""
    launch = out["launch"]
    hosts = []
    for line in launch["hostfile"].splitlines():
        match = re.match(r"^(\S+)\s+slots=(\d+)(?:\s+type=(\S+))?", line)  # parse_hostfile's pattern
        assert match and match.group(3) is not None
        hosts.append((match.group(1), int(match.group(2)), match.group(3)))
    nodes = {n["hostname"]: n for n in launch["nodes"]}
    physical = []
    for host, slots, kind in hosts:
        node = next(j for j, n in enumerate(instance.nodes) if n.name == host)
        assert instance.nodes[node].device_type == kind
        local = [int(x) for x in nodes[host]["cuda_visible_devices"].split(",")]
        assert len(local) == slots
        physical += [(len(physical), kind, instance.node_first_device[node] + d) for d in local]

    def compare(x, y):
        a, b = types.index(x[1]), types.index(y[1])
        return -1 if a < b else 1 if a > b else x[0] - y[0]

    logical = sorted(physical, key=cmp_to_key(compare))
    offset, stage = 0, 0
    for i, (tp, cp, dp, pp) in enumerate(zip(tps, cps, dps, pps)):
        for p in range(pp):
            for d in range(dp):
                for c in range(cp):
                    for t in range(tp):
                        _, kind, device = logical[offset + t + tp * (c + cp * (d + dp * p))]
                        assert device == plan.stages[stage + p][c + cp * d][t] and kind == types[i]
        offset += tp * cp * dp * pp
        stage += pp
    assert [r["device"] for r in launch["ranks"]] == [x[2] for x in logical]


def test_per_stage_tp_and_dp_on_two_types_is_a_flagscale_config():
    instance = parse_instance(two_types())
    out = export_flagscale(instance, parse_plan(THREE))
    flagscale_accepts(instance, parse_plan(THREE), out)
    hetero = out["config"]["system"]["hetero"]
    assert hetero["hetero_process_meshes"] == [1, 1, 1, 2, 1, 2, 1, 1, 1, 1, 1, 1, 1, 2, 1]
    assert hetero["hetero_device_types"] == ["A100", "A100", "V100"]
    assert hetero["hetero_pipeline_layer_split"] == [1, 2, 1]
    assert out["config"]["model"] == {"num_layers": 4, "micro_batch_size": 2, "global_batch_size": 16}
    assert out["launch"]["torchrun_compatible"] and out["launch"]["hostfile"] == "a slots=4 type=A100\nv slots=2 type=V100\n"
    assert "hetero_process_meshes: [1, 1, 1, 2, 1, 2, 1, 1, 1, 1, 1, 1, 1, 2, 1]" in out["yaml"]


def test_consecutive_equal_stages_share_a_mesh_and_uniform_plans_export():
    instance = parse_instance(two_types(tied=False, a=4, v=4))
    # V100 stages first: FlagScale's first mesh is then the V100 one, and the hostfile lists v first
    plan = parse_plan({"tp": [1, 1, 2], "dp": [2, 2, 1], "pp": 3, "shares": [[1, 1], [1, 1], [2]],
                       "partition": [0, 2, 3, 6], "stages": [[[4], [5]], [[6], [7]], [[0, 1]]]})
    out = export_flagscale(instance, plan)
    flagscale_accepts(instance, plan, out)
    assert out["config"]["system"]["hetero"]["hetero_process_meshes"] == [1, 1, 1, 2, 2, 2, 1, 1, 1, 1]
    assert [m["stages"] for m in out["meshes"]] == [[0, 1], [2, 2]]
    assert out["launch"]["hostfile"].startswith("v slots=4 type=V100\n")
    uniform = parse_plan({"tp": 2, "dp": 2, "pp": 2, "micro_batch": 2, "partition": [0, 3, 6]})
    out = export_flagscale(instance, uniform)
    flagscale_accepts(instance, uniform, out)
    assert out["config"]["system"]["hetero"]["hetero_device_types"] == ["A100", "V100"]
    assert out["config"]["system"]["tensor_model_parallel_size"] == 2


def test_a_node_split_by_another_is_said_not_torchrun_compatible():
    instance = parse_instance(two_types(tied=False, a=4, v=4))
    plan = parse_plan({"tp": 1, "dp": 2, "pp": 2, "micro_batch": 1, "partition": [0, 3, 6],
                       "stages": [[[0], [4]], [[1], [5]]]})  # types mixed inside the stages: refused first
    with pytest.raises(InputError, match=r"plan\.stages\[0\]: replicas on device types A100, V100"):
        export_flagscale(instance, plan)
    two_a = parse_instance(dict(two_types(tied=False), nodes=[
        {"name": n, "device_type": "A100", "devices": 2, "intra_bandwidth": "300 GB/s", "inter_bandwidth": "25 GB/s"}
        for n in ("a0", "a1")]))
    split = parse_plan({"tp": 1, "dp": 2, "pp": 2, "micro_batch": 1, "partition": [0, 3, 6],
                        "stages": [[[0], [2]], [[1], [3]]]})
    out = export_flagscale(two_a, split)
    assert not out["launch"]["torchrun_compatible"] and "explicitly" in out["launch"]["how"]


@pytest.mark.parametrize("tied, change, match", [
    (False, {"shares": [[3, 1], [4]], "tp": [1, 2], "dp": [2, 1], "pp": 2, "partition": [0, 3, 6], "stages": None},
     r"plan\.shares\[0\]: \[3, 1\]: FlagScale splits every micro-batch evenly"),
    (True, {"tp": [1, 1, 1], "dp": [2, 1, 2], "shares": [[2, 2], [4], [2, 2]], "stages": [[[0], [1]], [[4]], [[2], [3]]]},
     r"plan\.stages: stages on A100 come before and after stages on V100"),
    (True, {"tp": [2, 1, 1], "dp": [1, 2, 2], "shares": [[4], [2, 2], [2, 2]],
            "stages": [[[0, 1]], [[2], [3]], [[4], [5]]]},
     r"plan\.tp: stage 0 at tp 2, the last at tp 1: FlagScale needs one tp at both ends"),
])
def test_what_flagscale_cannot_express_is_refused_in_one_line(tied, change, match):
    data = {k: v for k, v in {**THREE, **change}.items() if v is not None}
    instance = parse_instance(two_types(tied=tied))
    with pytest.raises(InputError, match=match) as info:
        export_flagscale(instance, parse_plan(data))
    assert "\n" not in str(info.value)


def test_zero1_with_a_tied_embedding_needs_the_end_dps_to_divide():
    instance = parse_instance(dict(two_types(a=8, v=8, batch=12), training={"global_batch": 12, "zero_stage": 1}))
    plan = parse_plan({"tp": 1, "dp": [2, 3], "pp": 2, "shares": [[3, 3], [2, 2, 2]], "partition": [0, 3, 6]})
    with pytest.raises(InputError, match=r"plan\.dp: stage 0 at dp 2, the last at dp 3: .*divide"):
        export_flagscale(instance, plan)
    plan = parse_plan({"tp": 1, "dp": [2, 4], "pp": 2, "shares": [[4, 4], [2, 2, 2, 2]], "partition": [0, 3, 6]})
    instance = parse_instance(dict(two_types(a=8, v=8), training={"global_batch": 16, "zero_stage": 1}))
    out = export_flagscale(instance, plan)
    flagscale_accepts(instance, plan, out)
    assert out["config"]["system"]["use_distributed_optimizer"] is True
    assert out["config"]["system"]["hetero"]["use_partial_reduce_for_shared_embedding"] is True


def test_a_recomputation_mode_per_stage_is_flagscale_s_per_stage_list():
    """Stage 1 (the A100 at tp 2) recomputes, stages 0 and 2 do not: FlagScale's per-stage,
    per-micro-batch flags, 16 / 4 = 4 micro-batches each, beside full uniform recomputation."""
    instance = parse_instance(two_types())
    plan = parse_plan(dict(THREE, recompute=["none", "full", "none"]))
    out = export_flagscale(instance, plan)
    flagscale_accepts(instance, plan, out)
    system = out["config"]["system"]
    assert system["recompute_granularity_per_stage_micro_batch"] == [[1, 4, 0], [1, 4, 1], [1, 4, 0]]
    assert (system["recompute_granularity"], system["recompute_method"], system["recompute_num_layers"]) == (
        "full", "uniform", 1)
    assert "recompute_granularity_per_stage_micro_batch: [[1, 4, 0], [1, 4, 1], [1, 4, 0]]" in out["yaml"]


def test_interleaving_is_refused():
    instance = parse_instance(two_types(tied=False))
    plan = parse_plan({"tp": 1, "dp": 1, "pp": 2, "micro_batch": 1, "partition": [0, 1, 3, 4, 6],
                       "virtual_stages": 2})
    with pytest.raises(InputError, match=r"plan\.virtual_stages: .*no interleaved schedule"):
        export_flagscale(instance, plan)


def test_yaml_is_the_config():
    config = {"system": {"hetero": {"enable_hetero": True, "hetero_device_types": ["A100"]}, "x": 1},
              "model": {"n": "a"}}
    assert to_yaml(config) == ('system:\n  hetero:\n    enable_hetero: true\n    hetero_device_types: ["A100"]\n'
                               '  x: 1\nmodel:\n  n: "a"\n')


def test_cli_writes_the_flagscale_export(tmp_path):
    (tmp_path / "inst.json").write_text(json.dumps(two_types()))
    (tmp_path / "plan.json").write_text(json.dumps(THREE))
    done = subprocess.run([sys.executable, "-m", "amp_opt", "export", "inst.json", "plan.json", "--format",
                           "flagscale", "-o", "fs.json"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    out = json.loads((tmp_path / "fs.json").read_text())
    assert out["format"] == "amp_opt.export.flagscale" and out["evaluation"]["predicted_time"] > 0
    flagscale_accepts(parse_instance(two_types()), parse_plan(THREE), out)


def test_the_docs_example_is_what_export_writes():
    """docs/hetero-run.md shows the example files and the YAML export writes for them."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    text = (root / "docs" / "hetero-run.md").read_text()
    folder = root / "docs" / "hetero"
    blocks = re.findall(r"```(?:json|yaml)?\n(.*?)```", text, re.S)
    for name in ("tiny.json", "uneven.json", "three.json"):
        assert json.loads((folder / name).read_text()) in [json.loads(b) for b in blocks if b.lstrip().startswith("{")]
    instance = parse_instance(json.loads((folder / "two_types.json").read_text()))
    plan = parse_plan(json.loads((folder / "three.json").read_text()))
    out = export_flagscale(instance, plan)
    flagscale_accepts(instance, plan, out)
    assert out["yaml"] in blocks and out["launch"]["hostfile"] in blocks
    check_plan(parse_instance(json.loads((folder / "tiny.json").read_text())),
               parse_plan(json.loads((folder / "uneven.json").read_text())))


@pytest.mark.parametrize("data, field", [(THREE, "tp"), (dict(THREE, tp=1, dp=2, shares=[[3, 1], [2, 2], [2, 2]],
                                                               stages=None), "shares")])
def test_megatron_and_deepspeed_exports_refuse_a_plan_whose_stages_differ(data, field):
    from amp_opt.export.deepspeed import export_deepspeed
    from amp_opt.export.megatron import export_megatron

    instance = parse_instance(two_types())
    plan = parse_plan({k: v for k, v in data.items() if v is not None})
    for export, name in ((export_megatron, "Megatron-LM"), (export_deepspeed, "DeepSpeed")):
        with pytest.raises(InputError, match=rf"^plan\.{field}: {name} runs one tp and dp on every stage .*flagscale"):
            export(instance, plan)
