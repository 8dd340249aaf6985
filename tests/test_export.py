"""export: batch arithmetic, degrees, layer split, and the rank-to-device mapping."""

import json
import subprocess
import sys

import pytest

from conftest import INSTANCES, PAPER

import amp_opt
from amp_opt.errors import InputError
from amp_opt.export.deepspeed import deepspeed_config_only, export_deepspeed
from amp_opt.export.megatron import export_megatron, megatron_layout, megatron_split_args, transformer_split
from amp_opt.model.engines import ENGINES
from amp_opt.model.generate import generate_instance
from amp_opt.model.plan import Plan, check_plan, parse_plan


def paper_plans(instance):
    """The best plan of each paper instance under both cost models (rank order and free grouping)."""
    return [amp_opt.solve(instance, cost_model=m).best.plan for m in ("amp", "hetero")]


@pytest.fixture(scope="module")
def small_free():
    """A 3-node generated instance whose free-grouping plan reorders nodes (seed 2: stage 0 on node 2)."""
    inst = amp_opt.parse_instance(generate_instance(2, nodes=3, devices_per_node=2))
    plan = amp_opt.solve(inst).best.plan
    return inst, plan


def check_mapping(instance, plan, launch):
    plan = check_plan(instance, plan)
    ranks = launch["ranks"]
    world = plan.tp * plan.cp * plan.dp * plan.pp
    used = sorted(d for stage in plan.stages for group in stage for d in group)
    assert [r["rank"] for r in ranks] == list(range(world)) == list(range(len(used)))
    assert sorted(r["device"] for r in ranks) == used  # every used device exactly once
    for r in ranks:
        group = r["cp_rank"] + plan.cp * r["dp_rank"]
        assert r["rank"] == r["tp_rank"] + plan.tp * (group + plan.cp * plan.dp * r["stage"])
        assert plan.stages[r["stage"]][group][r["tp_rank"]] == r["device"]
        node = int(instance.device_node[r["device"]])
        assert r["hostname"] == instance.nodes[node].name
        assert r["local_device"] == r["device"] - instance.node_first_device[node]
    # per node: its devices, and each local device's rank agrees with the rank table
    by_device = {r["device"]: r["rank"] for r in ranks}
    nodes_used = sorted({int(instance.device_node[d]) for d in used})
    for entry in launch["nodes"]:
        j = next(i for i, n in enumerate(instance.nodes) if n.name == entry["hostname"])
        first = instance.node_first_device[j]
        assert entry["devices"] == list(range(first, first + instance.nodes[j].devices))
        for local, rank in entry["local_device_rank"].items():
            assert by_device[first + int(local)] == rank
    assert sorted(next(i for i, n in enumerate(instance.nodes) if n.name == e["hostname"])
                  for e in launch["nodes"]) == nodes_used
    assert launch["hostfile"].count("slots=") == len(nodes_used)


def check_torchrun(instance, launch):
    """When torchrun-compatible: node_rank k holds the next contiguous block, LOCAL_RANK i -> i-th visible GPU."""
    if not launch["torchrun_compatible"]:
        for entry in launch["nodes"]:
            for i, p in enumerate(entry["processes"]):
                assert p["LOCAL_RANK"] == i and p["WORLD_SIZE"] == instance.num_devices
                visible = [int(x) for x in p["CUDA_VISIBLE_DEVICES"].split(",")]
                assert entry["local_device_rank"][str(visible[i])] == p["RANK"]
            assert "RANK=" in entry["launch"]
        return
    base = 0
    for k, entry in enumerate(launch["nodes"]):
        assert entry["node_rank"] == k
        visible = [int(x) for x in entry["cuda_visible_devices"].split(",")]
        assert [entry["local_device_rank"][str(v)] for v in visible] == list(range(base, base + len(visible)))
        base += len(visible)
        assert f"--node-rank {k}" in entry["launch"]
    hosts = [line.split()[0] for line in launch["hostfile"].splitlines()]
    assert hosts == [e["hostname"] for e in launch["nodes"]]


def check_exports(instance, plan):
    """Both exports of a plan; a plan DeepSpeed cannot run (interleaving, cp, ...) gets an
    InputError naming the field instead of a DeepSpeed config (None)."""
    plan = check_plan(instance, plan)
    broken = ENGINES["deepspeed"].rule(instance, plan.candidate)
    if broken is not None:
        with pytest.raises(InputError, match=f"plan.{broken[0]}"):
            export_deepspeed(instance, plan)
        return None, export_megatron(instance, plan)
    ds = export_deepspeed(instance, plan)
    cfg = deepspeed_config_only(ds)
    assert cfg["train_batch_size"] == instance.training.global_batch
    assert cfg["train_micro_batch_size_per_gpu"] == plan.micro_batch
    assert cfg["train_batch_size"] == cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * plan.dp
    assert set(cfg) <= {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                        "zero_optimization"}
    extra = ds["amp_opt"]
    assert extra["pipeline"]["num_stages"] == plan.pp and extra["pipeline"]["parts"] == list(plan.partition)
    check_mapping(instance, plan, extra["launch"])
    check_torchrun(instance, extra["launch"])

    mg = export_megatron(instance, plan)
    args = mg["args"]
    value = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--") and not args[i + 1].startswith("--")}
    assert value["--tensor-model-parallel-size"] == str(plan.tp)
    assert value["--pipeline-model-parallel-size"] == str(plan.pp)
    assert value["--micro-batch-size"] == str(plan.micro_batch)
    assert value["--global-batch-size"] == str(instance.training.global_batch)
    counts = mg["layer_split"]["transformer_layers_per_stage"]
    n_transformer = sum(layer.kind == "transformer" for layer in instance.layers)
    assert sum(counts) == n_transformer == int(value["--num-layers"])
    split = mg["layer_split"]
    if split["expressible"]:
        if split["method"] == "first-last":
            first, last = int(value["--decoder-first-pipeline-num-layers"]), int(value["--decoder-last-pipeline-num-layers"])
            middle = (n_transformer - first - last) // max(plan.pp - 2, 1) if plan.pp > 2 else 0
            assert [first] + [middle] * (plan.pp - 2) + [last] == counts
        elif split["method"] == "layout":
            layout = value["--pipeline-model-parallel-layout"]
            assert layout == megatron_layout(counts)
        else:
            assert len(set(counts)) == 1
    check_mapping(instance, plan, mg["launch"])
    return ds, mg


@pytest.mark.parametrize("exp", list(PAPER))
def test_paper_instances(paper_instances, exp):
    inst = paper_instances[exp]
    for plan in paper_plans(inst):
        check_exports(inst, plan)


def test_free_grouping_plan_reorders_nodes(small_free):
    inst, plan = small_free
    assert plan.stages != check_plan(inst, Plan(plan.tp, plan.dp, plan.pp, plan.micro_batch, plan.partition)).stages
    _, mg = check_exports(inst, plan)  # sequence parallelism: a Megatron-LM plan
    launch = mg["launch"]
    assert launch["torchrun_compatible"]
    # stage 0 runs on the last node, so that node gets node_rank 0 and hosts rank 0
    assert launch["nodes"][0]["hostname"] == inst.nodes[int(inst.device_node[plan.stages[0][0][0]])].name


def test_interleaved_grouping_needs_explicit_ranks(paper_instances):
    """dp replicas of a stage taken from different nodes: no node holds one contiguous rank block."""
    inst = paper_instances["het_cluster"]
    stages = [[[s + 4 * r] for r in range(4)] for s in range(4)]  # stage s takes local device s of every node
    plan = parse_plan({"tp": 1, "dp": 4, "pp": 4, "micro_batch": 1, "partition": [0, 7, 14, 20, 30], "stages": stages})
    ds, _ = check_exports(inst, plan)
    assert not ds["amp_opt"]["launch"]["torchrun_compatible"]
    p3 = ds["amp_opt"]["launch"]["nodes"][0]
    assert [p["RANK"] for p in p3["processes"]] == [0, 4, 8, 12]


def test_megatron_split_flags():
    assert megatron_split_args([6, 6, 6, 6]) == ([], "even")
    assert megatron_split_args([5, 6, 6, 7]) == (["--decoder-first-pipeline-num-layers", "5",
                                                  "--decoder-last-pipeline-num-layers", "7"], "first-last")
    flags, method = megatron_split_args([5, 7, 6, 6])
    assert method == "layout" and flags == ["--pipeline-model-parallel-layout", "Et*5|t*7|t*6|t*6L"]
    assert megatron_split_args([0, 12, 12])[1] == "layout"  # a stage without transformer layers


def test_embedding_off_the_first_stage_is_reported(paper_instances):
    inst = paper_instances["het_cluster"]
    # the last stage holds only noop3: the head (embed2v) sits on stage 2, which Megatron cannot express
    plan = parse_plan({"tp": 1, "dp": 4, "pp": 4, "micro_batch": 1, "partition": [0, 7, 14, 29, 30]})
    counts, problems, _ = transformer_split(inst, check_plan(inst, plan))
    assert problems and "embed2v" in problems[0]
    mg = export_megatron(inst, plan)
    assert mg["layer_split"]["expressible"] is False
    assert not any(a.startswith("--decoder-") or a == "--pipeline-model-parallel-layout" for a in mg["args"])


def test_zero1_is_exported(paper_instances):
    import dataclasses

    inst = paper_instances["homogeneous"]
    inst = dataclasses.replace(inst, training=dataclasses.replace(inst.training, zero_stage=1))
    plan = parse_plan({"tp": 1, "dp": 4, "pp": 4, "micro_batch": 1, "partition": [0, 7, 14, 20, 30]})
    assert export_deepspeed(inst, plan)["zero_optimization"] == {"stage": 1}
    assert "--use-distributed-optimizer" in export_megatron(inst, plan)["args"]


def run(*args):
    return subprocess.run([sys.executable, "-m", "amp_opt", *args], capture_output=True, text=True)


def test_cli(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"tp": 1, "dp": 4, "pp": 4, "micro_batch": 1, "partition": [0, 7, 14, 20, 30]}))
    inst = str(INSTANCES / "amp_het_cluster.json")
    out = run("export", inst, str(plan), "--format", "deepspeed")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["gradient_accumulation_steps"] == 8 and doc["amp_opt"]["evaluation"]["cost_model"] == "hetero"
    target = tmp_path / "mg.json"
    out = run("export", inst, str(plan), "--format", "megatron", "-o", str(target), "--cost-model", "amp")
    assert out.returncode == 0 and out.stdout == ""
    assert json.loads(target.read_text())["evaluation"]["cost_model"] == "amp"
    # bad input: exit code 2 with one line naming the field
    plan.write_text(json.dumps({"tp": 1, "dp": 4, "pp": 4, "micro_batch": 3, "partition": [0, 7, 14, 20, 30]}))
    out = run("export", inst, str(plan), "--format", "deepspeed")
    assert out.returncode == 2 and "plan.micro_batch" in out.stderr and "Traceback" not in out.stderr
    plan.write_text(json.dumps([{"tp": 1}]))
    out = run("export", inst, str(plan), "--format", "megatron")
    assert out.returncode == 2 and "one plan object" in out.stderr


def test_bad_plan_raises_input_error(paper_instances):
    with pytest.raises(InputError):
        export_deepspeed(paper_instances["het_cluster"], parse_plan(
            {"tp": 1, "dp": 4, "pp": 4, "micro_batch": 1, "partition": [0, 7, 14, 20, 31]}))


def test_deepspeed_file_is_a_deepspeed_config(paper_instances):
    """Every top-level key but amp_opt is one DeepSpeed reads; the batch sizes satisfy DeepSpeed's
    assertion train_batch = micro x accumulation x dp (its _batch_assertion, dp = world size of
    the pipeline engine's data-parallel group)."""
    inst = paper_instances["het_cluster"]
    plan = check_plan(inst, parse_plan({"tp": 1, "dp": 4, "pp": 4, "micro_batch": 1, "partition": [0, 7, 14, 20, 30]}))
    ds = export_deepspeed(inst, plan)
    assert set(ds) <= {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                       "zero_optimization", "amp_opt"}
    assert ds["train_batch_size"] == ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * 4


class _FakeTopology:
    def __init__(self, stages, stage_of_rank):
        self.stages, self.stage_of_rank = stages, stage_of_rank

    def get_dim(self, name):
        assert name == "pipe"
        return self.stages

    def get_coord(self, rank):
        return type("Coord", (), {"pipe": self.stage_of_rank})()


def test_exact_pipeline_module_sets_the_boundaries(tmp_path, monkeypatch, paper_instances):
    """The helper's override does what DeepSpeed's own _partition_layers does (deepspeed/runtime/
    pipe/module.py: self.parts, then self._set_bounds(start, stop) for this rank's stage), checked
    against a stand-in PipelineModule with that interface (DeepSpeed itself is not installed here)."""
    import types

    from amp_opt.export.pipeline import exact_pipeline_module, stage_boundaries

    class PipelineModule:
        def __init__(self, layers, num_stages=None, topology=None, **kwargs):
            self._topo = topology or _FakeTopology(num_stages, 2)
            self.global_rank = 0
            self._partition_layers(method=kwargs.get("partition_method", "parameters"))

        def _set_bounds(self, start=None, stop=None):
            self.bounds = (start, stop)

    fake = types.ModuleType("deepspeed.pipe")
    fake.PipelineModule = PipelineModule
    monkeypatch.setitem(sys.modules, "deepspeed", types.ModuleType("deepspeed"))
    monkeypatch.setitem(sys.modules, "deepspeed.pipe", fake)
    inst = paper_instances["het_cluster"]
    plan = check_plan(inst, parse_plan({"tp": 1, "dp": 4, "pp": 4, "micro_batch": 1, "partition": [0, 8, 13, 20, 30]}))
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(export_deepspeed(inst, plan)))
    module = exact_pipeline_module(list(range(30)), str(path))
    assert module.parts == [0, 8, 13, 20, 30] and module.bounds == (13, 20)
    assert stage_boundaries([0, 3, 5]) == [0, 3, 5]
    with pytest.raises(ValueError, match="cover 30 layers"):
        exact_pipeline_module(list(range(29)), str(path))
    with pytest.raises(ValueError, match="5 pipeline stages"):
        exact_pipeline_module(list(range(30)), str(path), topology=_FakeTopology(5, 0))
    with pytest.raises(ValueError, match="increase"):
        stage_boundaries([0, 4, 4])


def _values(args):
    return {args[i]: args[i + 1] for i in range(len(args) - 1)
            if args[i].startswith("--") and not args[i + 1].startswith("--")}


def llama_instance(**search):
    """A Llama-shaped model (8 transformer layers) on 2 nodes of 8 H100s."""
    return amp_opt.parse_instance({
        "version": 1,
        "model": {"preset": "llama", "hidden": 512, "layers": 8, "heads": 8, "kv_heads": 4, "ffn": 1536,
                  "vocab": 1024, "seq_len": 1024},
        "nodes": [{"name": "h", "count": 2, "device_type": "H100-80GB", "devices": 8,
                   "intra_bandwidth": "450 GB/s", "inter_bandwidth": "400 GB/s"}],
        "training": {"global_batch": 64},
        "search": search,
    })


@pytest.mark.parametrize("fields, expected, absent", [
    ({"tp": 2, "cp": 2, "dp": 2, "pp": 2, "sequence_parallel": True, "recompute": "selective", "zero_stage": 1},
     {"--context-parallel-size": "2", "--recompute-granularity": "selective"},
     ["--recompute-method"]),
    ({"tp": 1, "dp": 4, "pp": 4, "recompute": "full", "zero_stage": 0},
     {"--recompute-granularity": "full", "--recompute-method": "uniform", "--recompute-num-layers": "1"},
     ["--use-distributed-optimizer", "--sequence-parallel", "--context-parallel-size"]),
    ({"tp": 1, "dp": 4, "pp": 4, "recompute": "full", "recompute_layers": 1, "zero_stage": 1},
     {"--recompute-method": "block", "--recompute-num-layers": "1"}, []),
    ({"tp": 2, "dp": 8, "pp": 1, "zero_stage": 3, "sequence_parallel": True},
     {"--data-parallel-sharding-strategy": "optim_grads_params"}, ["--use-distributed-optimizer"]),
])
def test_megatron_flags_for_each_decision(fields, expected, absent):
    inst = llama_instance()
    pp = fields["pp"]
    plan = check_plan(inst, parse_plan({"micro_batch": 1, "partition": [0] + [10 * (s + 1) // pp for s in range(pp)][:-1]
                                        + [10], **fields}))
    mg = export_megatron(inst, plan)
    args, value = mg["args"], _values(mg["args"])
    for flag, v in expected.items():
        assert value[flag] == v, flag
    for flag in absent:
        assert flag not in args
    assert ("--sequence-parallel" in args) == plan.sequence_parallel
    assert ("--use-distributed-optimizer" in args) == (plan.zero_stage == 1)
    assert ("--use-megatron-fsdp" in args) == (plan.zero_stage >= 2)
    assert value["--attention-backend"] == "flash"  # presets default to FlashAttention
    assert mg["degrees"]["cp"] == plan.cp
    check_mapping(inst, plan, mg["launch"])


def test_megatron_interleaving_counts_the_embedding_and_the_loss_when_that_splits_evenly():
    inst = llama_instance()  # 8 transformer layers + embedding + head
    even = check_plan(inst, parse_plan({"tp": 8, "dp": 1, "pp": 2, "micro_batch": 1, "virtual_stages": 2,
                                        "partition": [0, 3, 5, 7, 10]}))
    value = _values(export_megatron(inst, even)["args"])
    assert value["--num-virtual-stages-per-pipeline-rank"] == "2"
    assert "--account-for-embedding-in-pipeline-split" not in export_megatron(inst, even)["args"]
    # ten chunks of 8 transformer layers: only with the embedding and the loss counted as layers
    five = llama_instance()
    plan = check_plan(five, parse_plan({"tp": 8, "dp": 1, "pp": 2, "micro_batch": 1, "virtual_stages": 5,
                                        "partition": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}))
    mg = export_megatron(five, plan)
    assert "--account-for-embedding-in-pipeline-split" in mg["args"]
    assert "--account-for-loss-in-pipeline-split" in mg["args"]
    assert mg["layer_split"]["transformer_layers_per_chunk"] == [0, 1, 1, 1, 1, 1, 1, 1, 1, 0]
    uneven = check_plan(inst, parse_plan({"tp": 8, "dp": 1, "pp": 2, "micro_batch": 1, "virtual_stages": 2,
                                          "partition": [0, 4, 5, 7, 10]}))
    layout = _values(export_megatron(inst, uneven)["args"])["--pipeline-model-parallel-layout"]
    assert layout == "Et*3|t|t*2|t*2L"  # chunks in layer order: chunk c runs on stage c mod pp


def test_idle_devices_get_no_rank():
    inst = llama_instance()
    plan = check_plan(inst, parse_plan({"tp": 8, "dp": 1, "pp": 1, "micro_batch": 1, "partition": [0, 10]}))
    launch = export_megatron(inst, plan)["launch"]
    check_mapping(inst, plan, launch)
    assert launch["world_size"] == 8 and len(launch["nodes"]) == 1
    assert any("8 of the 16 devices stay idle" in note for note in launch["notes"])


def test_deepspeed_exports_zero_stage_and_per_stage_recomputation():
    inst = llama_instance(engine="deepspeed")
    plan = check_plan(inst, parse_plan({"tp": 1, "dp": 4, "pp": 4, "micro_batch": 1, "partition": [0, 3, 5, 8, 10],
                                        "recompute": ["full", "full", "none", "none"], "zero_stage": 1}))
    config = export_deepspeed(inst, plan)
    assert config["zero_optimization"] == {"stage": 1}
    assert config["amp_opt"]["pipeline"]["recompute"] == ["full", "full", "none", "none"]


def test_each_export_refuses_what_its_engine_cannot_run(tmp_path):
    """A plan recomputing per stage (DeepSpeed) has no Megatron-LM flags, and an interleaved plan
    no DeepSpeed config: one line naming the field and the rule, exit 2, never a silent export."""
    instance_path = tmp_path / "i.json"
    doc = json.loads((INSTANCES / "amp_het_cluster.json").read_text())
    doc.setdefault("search", {})["engine"] = "deepspeed"
    instance_path.write_text(json.dumps(doc))
    inst = amp_opt.load_instance(instance_path)
    per_stage = parse_plan({"tp": 1, "dp": 4, "pp": 4, "micro_batch": 1, "partition": [0, 7, 14, 20, 30],
                            "recompute": ["full", "full", "none", "none"]})
    assert export_deepspeed(inst, per_stage)["amp_opt"]["pipeline"]["recompute"] == ["full", "full", "none", "none"]
    with pytest.raises(InputError, match="plan.recompute.*megatron"):
        export_megatron(inst, per_stage)
    plan_path = tmp_path / "p.json"
    plan_path.write_text(json.dumps(per_stage.to_json()))
    run = subprocess.run([sys.executable, "-m", "amp_opt", "export", str(instance_path), str(plan_path), "--format", "megatron"],
                         capture_output=True, text=True)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "plan.recompute" in run.stderr
