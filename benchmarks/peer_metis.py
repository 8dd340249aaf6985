"""A peer's plans as amp_opt plans: Metis (USENIX ATC'24) on its own two-type scenario.

Usage (from the project root; the two repositories as git directories, e.g. ``git clone --bare``):

    python benchmarks/peer_metis.py --metis-git PATH --sailor-git PATH > benchmarks/results/peer_metis.md
    python benchmarks/peer_metis.py --metis-git PATH --sailor-git PATH --nodes 2   # 16 GPUs only

The scenario is the one Sailor (SOSP'25) runs its Metis baseline on: GPT-Neo 2.7B (34 layers: the
embedding, 32 blocks, the head; hidden 2560, sequence 2048, vocabulary 50304 as the profiles'
embedding parameters give it), a global batch of 128, and the layer profiles Sailor ships for it
(``sailor/Planner/baselines/Metis/profiles/GPT-Neo-2.7``: forward+backward milliseconds per layer
of A100-40GB and V100-16GB at tp 1, 2, 4 and micro-batch 1, 2, 4), on N nodes of 4 A100-40GB
(intra-node 100, inter-node 10 in Metis's units) and N nodes of 4 V100-16GB (50 and 10).

For each N:

1. Metis's own planner (SamsungLabs/Metis ``cost_het_cluster.py``, unchanged, on a copy of the
   repository) plans the cluster; its K best plans by its own cost are kept.  Metis's loader reads
   a profile whose forward+backward time equals the sum of its layers (as Sailor's do) as
   "no fb_sync" and drops the plan, so each profile's ``forward_backward_time_ms`` is raised by
   1e-6 ms on the copy (1 ns more per iteration in Metis's cost, nothing in amp_opt's).
2. Each is written as an amp_opt plan (:func:`to_plan`: Metis lays the ranks out type by type in
   its node order, stage s takes the next tp_s * dp_s ranks, replica r of a stage the next tp_s;
   a stage on one type gives every replica M / dp_s samples of each micro-batch of M, a stage on
   two types splits M as Metis's ``DataLoadBalancer`` does) and priced by ``amp_opt.evaluate``.
3. ``amp_opt solve`` runs on the same instance (engine "amp_opt", the profiles as measured layer
   times, Metis's settings: no recomputation, no ZeRO, no sequence parallelism).
4. amp_opt's best plan is priced by Metis's cost model (``HeteroCostEstimator.get_cost``) where
   Metis can write it (every GPU used, stages laid out type by type, each stage's shares the ones
   Metis would give it).

The two cost models differ (Metis: the profiled layer times, the allreduce and p2p on its
bandwidth figures, its profiled optimizer time; amp_opt: the same layer times, its own
communication, optimizer and memory terms, formulations/hetero.md), so each column is one model's
verdict; the memory checks differ too (amp_opt's H5 against Metis's 5x profiled layer memory).
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import amp_opt  # noqa: E402
from amp_opt.bench.writers import commit as git_commit, machine_info  # noqa: E402
from amp_opt.model.plan import check_plan  # noqa: E402

PROFILES = "sailor/Planner/baselines/Metis/profiles/GPT-Neo-2.7"
TYPES = {"A100": ("A100-40GB", "A100-40", 100, 40), "V100": ("V100-16GB", "V100-16", 50, 16)}  # amp_opt, Sailor, intra, GB
INTER = 10  # Metis's inter-node bandwidth figure (MiB per ms, its dp and pp costs divide bytes by bw * 2^20 per ms)
GBS, TPS, BATCHES = 128, (1, 2, 4), (1, 2, 4)
MODEL = {"num_layers": 34, "hidden_size": 2560, "sequence_length": 2048, "vocab_size": 50304, "attention_head_size": 128}


def _extract(git_dir: str, path: str, dest: Path) -> str:
    """Files under ``path`` of the repository's HEAD into ``dest``; returns the commit."""
    tar = subprocess.run(["git", f"--git-dir={git_dir}", "archive", "--format=tar", "HEAD", path],
                         capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(dest, filter="data")
    return subprocess.run(["git", f"--git-dir={git_dir}", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()


def profiles(sailor: Path) -> dict:
    """{(metis type, tp, micro-batch): the profile document} from Sailor's files."""
    out = {}
    for metis, (_, folder, _, _) in TYPES.items():
        for tp in TPS:
            for b in BATCHES:
                out[metis, tp, b] = json.loads((sailor / PROFILES / folder / f"mbs{b}_tmp{tp}.json").read_text())
    return out


def metis_inputs(run: Path, docs: dict, nodes: int) -> None:
    """Metis's profile folder, hostfile and clusterfile for ``nodes`` nodes of each type."""
    (run / "profile").mkdir(parents=True)
    for (metis, tp, b), doc in docs.items():
        copy = json.loads(json.dumps(doc))
        copy["execution_time"]["forward_backward_time_ms"] += 1e-6  # see the module docstring, step 1
        (run / "profile" / f"DeviceType.{metis}_tp{tp}_bs{b}.json").write_text(json.dumps(copy))
    hosts, cluster = [], {}
    for k, (metis, (_, _, intra, memory)) in enumerate(TYPES.items()):
        for j in range(nodes):
            ip = f"10.0.{k}.{j + 1}"
            hosts.append(f"{ip} slots=4")
            cluster[ip] = {"instance_type": metis, "inter_bandwidth": INTER, "intra_bandwidth": intra, "memory": memory}
    (run / "hostfile").write_text("\n".join(hosts) + "\n")
    (run / "clusterfile.json").write_text(json.dumps(cluster, indent=1))


def metis_args(run: Path) -> list[str]:
    return ["--model_name", "GPT", "--num_layers", str(MODEL["num_layers"]), "--gbs", str(GBS),
            "--hidden_size", str(MODEL["hidden_size"]), "--sequence_length", str(MODEL["sequence_length"]),
            "--vocab_size", str(MODEL["vocab_size"]), "--attention_head_size", str(MODEL["attention_head_size"]),
            "--hostfile_path", str(run / "hostfile"), "--clusterfile_path", str(run / "clusterfile.json"),
            "--profile_data_path", str(run / "profile"), "--max_profiled_tp_degree", "4",
            "--max_profiled_batch_size", "4", "--min_group_scale_variance", "1", "--max_permute_len", "4"]


# Metis orders the device types by iterating a set: its plans' order (and which of two equal-cost
# plans comes first) follows Python's string hashing, fixed here so that a run can be repeated.
HASHED = {**os.environ, "PYTHONHASHSEED": "0"}
LINE = re.compile(r"^(\d+), ([0-9.e+-]+), \((.*?)\), \[(.*?)\], \[(.*?)\], (\d+), \[(.*?)\]$")


def run_metis(metis: Path, run: Path) -> tuple[list[dict], float]:
    """Metis's ranked plans (its printed table) and the planner's wall seconds."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "cost_het_cluster.py", *metis_args(run)], cwd=metis,
                          capture_output=True, text=True, env=HASHED)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"Metis failed: {done.stderr.strip().splitlines()[-1:]}")
    plans = []
    for line in done.stdout.splitlines():
        m = LINE.match(line.strip())
        if m:
            plans.append({"rank": int(m[1]), "cost_ms": float(m[2]), "sequence": re.findall(r"DeviceType\.(\w+):", m[3]),
                          "groups": [int(x) for x in m[4].split(",")],
                          "strategies": [(int(d), int(t)) for d, t in re.findall(r"\((\d+), (\d+)\)", m[5])],
                          "batches": int(m[6]), "partition": [int(x) for x in m[7].split(",")]})
    return plans, wall


def instance_doc(docs: dict, nodes: int) -> dict:
    """The amp_opt instance of the scenario: the same layer times (seconds), links and memory."""
    gb = 1.048576  # one MiB per ms in GB/s
    return {
        "format": "amp_opt.instance", "version": 1, "name": f"metis-gpt-neo-2.7b-{8 * nodes}",
        "model": {"preset": "gpt", "hidden": 2560, "layers": 32, "heads": 20, "seq_len": 2048, "vocab": 50304},
        "device_types": [{"name": name} for name, _, _, _ in TYPES.values()],
        "nodes": [{"name": metis.lower(), "count": nodes, "device_type": name, "devices": 4,
                   "intra_bandwidth": f"{intra * gb:.6g} GB/s", "inter_bandwidth": f"{INTER * gb:.6g} GB/s"}
                  for metis, (name, _, intra, _) in TYPES.items()],
        "profiles": [{"device_type": TYPES[metis][0], "tp": tp, "micro_batch": b,
                      "layer_times": [ms / 1000 for ms in doc["execution_time"]["layer_compute_total_ms"]]}
                     for (metis, tp, b), doc in sorted(docs.items())],
        "training": {"global_batch": GBS},
        "search": {"engine": "amp_opt", "tp": list(TPS), "micro_batches": list(BATCHES), "recompute": ["none"],
                   "zero_stages": [0], "sequence_parallel": [False], "cp": [1], "virtual_stages": [1]},
    }


def _ranks(instance, sequence: list[str]) -> list[int]:
    """amp_opt device ids in Metis's rank order: type by type in ``sequence``, nodes in order."""
    out = []
    for metis in sequence:
        for j, node in enumerate(instance.nodes):
            if node.device_type == TYPES[metis][0]:
                first = instance.node_first_device[j]
                out += range(first, first + node.devices)
    return out


def balanced_shares(types: list[str], dp: int, tp: int, M: int, docs: dict) -> list[int]:
    """Metis's split of a micro-batch of M over the replicas of a stage on two types: shares in
    proportion to each replica's speed at micro-batch 1 (its first GPU's type), largest remainders
    rounded up (DataLoadBalancer.partition_data, restated)."""
    speed = [1.0 / sum(docs[types[r * tp], tp, 1]["execution_time"]["layer_compute_total_ms"]) for r in range(dp)]
    exact = [M * s / sum(speed) for s in speed]
    shares = [int(x) for x in exact]
    for r in sorted(range(dp), key=lambda r: exact[r] - int(exact[r]), reverse=True)[:M - sum(shares)]:
        shares[r] += 1
    return shares


def to_plan(instance, plan: dict, docs: dict) -> dict | str:
    """A Metis plan as an amp_opt plan document, or why it has none."""
    ranks = _ranks(instance, plan["sequence"])
    kind = {d: m for m in TYPES for d in _ranks(instance, [m])}
    M = GBS // plan["batches"]
    tps, dps, shares, stages, start = [], [], [], [], 0
    if len(plan["partition"]) != len(plan["groups"]) + 1 or plan["partition"][-1] != MODEL["num_layers"]:
        return f"Metis's partition {plan['partition']} does not cover the {MODEL['num_layers']} layers in {len(plan['groups'])} stages"
    for size, (dp, tp) in zip(plan["groups"], plan["strategies"]):
        devices = ranks[start:start + size]
        start += size
        types = [kind[d] for d in devices]
        row = [M // dp] * dp if len(set(types)) == 1 else balanced_shares(types, dp, tp, M, docs)
        if min(row) == 0:
            return f"a replica with no samples (shares {row})"
        tps.append(tp)
        dps.append(dp)
        shares.append(row)
        stages.append([devices[r * tp:(r + 1) * tp] for r in range(dp)])
    return {"tp": tps, "dp": dps, "pp": len(tps), "shares": shares, "partition": plan["partition"], "stages": stages,
            "recompute": "none", "zero_stage": 0}


def metis_form(instance, plan, docs: dict) -> dict | str:
    """amp_opt's plan as Metis would write it (node sequence, groups, strategies, batches,
    partition), or why Metis cannot."""
    if plan.devices != instance.num_devices:
        return f"uses {plan.devices} of {instance.num_devices} GPUs (Metis uses every GPU)"
    type_of = {d: m for m in TYPES for d in _ranks(instance, [m])}
    order = [type_of[d] for stage in plan.stages for group in stage for d in group]
    sequence = list(dict.fromkeys(order))
    if order != sorted(order, key=sequence.index):
        return "its stages are not laid out type by type"
    candidate = {"sequence": sequence, "groups": [plan.tp_at(s) * plan.dp_at(s) for s in range(plan.pp)],
                 "strategies": [(plan.dp_at(s), plan.tp_at(s)) for s in range(plan.pp)],
                 "batches": GBS // plan.pipeline_micro_batch, "partition": list(plan.partition)}
    written = to_plan(instance, candidate, docs)
    if isinstance(written, str):
        return written
    if [list(plan.shares_at(s)) for s in range(plan.pp)] != written["shares"]:
        return "its shares are not the ones Metis gives those stages"
    return candidate


PRICE = """
import sys
sys.argv = ["cost_het_cluster.py"] + {args!r}
from arguments import parse_args
from data_loader import ProfileDataLoader
from gpu_cluster import GPUCluster
from model.activation_parameter import GPTActivationAndParam
from model.cost_estimator import HeteroCostEstimator
from model.device_group import StagePerformance
from search_space.plan import InterStagePlan
from utils import DeviceType, ModelConfig
args = parse_args()
cluster = GPUCluster(hostfile_path=args.hostfile_path, clusterfile_path=args.clusterfile_path)
data, _ = ProfileDataLoader(args.profile_data_path).load_profile_data_all()
config = ModelConfig(model_name=args.model_name, num_layers=args.num_layers, sequence_length=args.sequence_length,
                     vocab_size=args.vocab_size, hidden_size=args.hidden_size, attention_head_size=args.attention_head_size)
estimator = HeteroCostEstimator(data, config, GPTActivationAndParam(config, data["model"]["parameters"]), cluster)
p = {plan!r}
inter = InterStagePlan(ns_idx=0, node_sequence=tuple(DeviceType[t] for t in p["sequence"]), dg_idx=0,
                       device_groups=p["groups"], num_stage=len(p["groups"]), batches=p["batches"], gbs={gbs})
ranks = StagePerformance(config, data, cluster, inter).get_device_placement()
print(repr(estimator.get_cost(inter, [tuple(s) for s in p["strategies"]], p["partition"], ranks)))
"""


def metis_price(metis: Path, run: Path, plan: dict) -> float:
    """Metis's cost (ms) of a plan in its own form (``HeteroCostEstimator.get_cost``)."""
    code = PRICE.format(args=metis_args(run), plan=plan, gbs=GBS)
    done = subprocess.run([sys.executable, "-c", code], cwd=metis, capture_output=True, text=True, check=True,
                          env=HASHED)
    return float(ast.literal_eval(done.stdout.strip().splitlines()[-1]))


def _row(shares: list[int]) -> str:
    return f"{len(shares)}x{shares[0]}" if len(set(shares)) == 1 else "+".join(map(str, shares))


def label(instance, doc: dict | str) -> str:
    """A plan in one line, stage by stage: its GPUs' types, tp, samples per replica and layers
    (or the reason it has none)."""
    if isinstance(doc, str):
        return doc
    plan = amp_opt.parse_plan(doc)
    stages = plan.stages if plan.stages is not None else check_plan(instance, plan).stages
    out = []
    for s in range(plan.pp):
        kinds = sorted({instance.nodes[int(instance.device_node[d])].device_type.split("-")[0]
                        for group in stages[s] for d in group})
        out.append(f"{'+'.join(kinds)} tp {plan.tp_at(s)} shares {_row(list(plan.shares_at(s)))} "
                   f"layers {plan.partition[s]}-{plan.partition[s + 1] - 1}")
    return "; ".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metis-git", required=True, help="git directory of SamsungLabs/Metis")
    parser.add_argument("--sailor-git", required=True, help="git directory of eth-easl/sailor (the profiles)")
    parser.add_argument("--nodes", default="2,4", help="nodes of each type, comma-separated (default 2,4)")
    parser.add_argument("--top", type=int, default=60, help="Metis's best plans written as amp_opt plans")
    parser.add_argument("--time-limit", type=float, default=60.0, help="amp_opt solve's limit, seconds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        metis_commit = _extract(args.metis_git, ".", tmp / "metis")
        sailor_commit = _extract(args.sailor_git, PROFILES, tmp / "sailor")
        docs = profiles(tmp / "sailor")
        commit = git_commit(ROOT)
        print("# A peer's plans as amp_opt plans: Metis on GPT-Neo 2.7B, A100-40GB + V100-16GB\n")
        print(f"Command: `python benchmarks/peer_metis.py --metis-git PATH --sailor-git PATH --nodes {args.nodes} "
              f"--top {args.top} --time-limit {args.time_limit:g}` (commit {commit}; SamsungLabs/Metis {metis_commit}, "
              f"eth-easl/sailor {sailor_commit})\n")
        print("Machine: " + ", ".join(f"{k} {v}" for k, v in machine_info().items()) + "\n")
        for nodes in (int(n) for n in args.nodes.split(",")):
            run = tmp / f"run{nodes}"
            metis_inputs(run, docs, nodes)
            plans, wall = run_metis(tmp / "metis", run)
            inst_doc = instance_doc(docs, nodes)
            (run / "instance.json").write_text(json.dumps(inst_doc))
            instance = amp_opt.parse_instance(inst_doc)
            print(f"## {8 * nodes} GPUs ({nodes} nodes of 4 A100-40GB, {nodes} of 4 V100-16GB)\n")
            print(f"Metis: {len(plans)} plans priced in {wall:.1f} s. Its {min(args.top, len(plans))} best, each "
                  "written as an amp_opt plan and priced by `amp_opt.evaluate` (seconds per iteration; "
                  "Metis's cost in its own ms):\n")
            print("| Metis rank | Metis cost ms | node order | stages (dp, tp) | micro-batches | amp_opt plan | "
                  "amp_opt s | fits (amp_opt) |")
            print("|---|---|---|---|---|---|---|---|")
            priced, seen = [], {}
            for plan in plans[:args.top]:
                key = json.dumps({k: v for k, v in plan.items() if k not in ("rank", "cost_ms")})
                again = f" (the plan of rank {seen[key]}, priced again)" if key in seen else ""
                seen.setdefault(key, plan["rank"])
                doc = to_plan(instance, plan, docs)
                if isinstance(doc, dict):
                    ev = amp_opt.evaluate(instance, amp_opt.parse_plan(doc))
                    priced.append(ev)
                    cells = f"{ev.predicted_time:.4f} | {'yes' if ev.feasible else 'no: ' + '; '.join(ev.violations)}"
                else:
                    cells = "- | -"
                print(f"| {plan['rank']}{again} | {plan['cost_ms']:.1f} | {' > '.join(plan['sequence'])} | "
                      f"{plan['strategies']} | {plan['batches']} | {label(instance, doc)} | {cells} |", flush=True)
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "amp_opt", "solve", str(run / "instance.json"),
                                   "--time-limit", f"{args.time_limit:g}", "--json"], capture_output=True, text=True,
                                  cwd=ROOT)
            solve_wall = time.perf_counter() - start
            if done.returncode != 0:
                print(f"\namp_opt solve: exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}\n")
                continue
            result = json.loads(done.stdout)
            best = amp_opt.parse_plan(result["plan"])
            ev = amp_opt.evaluate(instance, best)
            form = metis_form(instance, best, docs)
            theirs = f"{metis_price(tmp / 'metis', run, form):.1f} ms" if isinstance(form, dict) else f"not priced: {form}"
            fitting = [e.predicted_time for e in priced if e.feasible]
            broken = sum(isinstance(to_plan(instance, plan, docs), str) for plan in plans[:args.top])
            print(f"\n{broken} of the {min(args.top, len(plans))} have no amp_opt plan (reason in the row).")
            print(f"\namp_opt solve ({solve_wall:.1f} s, {result['solver']['status']} within "
                  f"{result['solver'].get('within') or 'the whole space'}): {ev.predicted_time:.4f} s per iteration, "
                  f"{label(instance, result['plan'])}; under Metis's cost model: {theirs}.")
            uniform = result["solver"].get("uneven", {}).get("uniform_objective")
            if uniform:
                print(f"The best plan of one tp and dp on every stage that the same solve found: {uniform:.4f} s "
                      f"(the plans whose stages differ gain {100 * (uniform - ev.predicted_time) / uniform:.1f}%).")
            if fitting:
                rival = min((e for e in priced if e.feasible), key=lambda e: e.predicted_time)
                print(f"Against the best of Metis's plans that fit under amp_opt's model ({rival.predicted_time:.4f} s): "
                      f"{100 * (rival.predicted_time - ev.predicted_time) / rival.predicted_time:.1f}% faster under "
                      "amp_opt's model.")
                for name, e in (("amp_opt's plan", ev), ("that Metis plan", rival)):
                    print(f"- {name}, amp_opt's terms (s): " + ", ".join(f"{k} {v:.4f}" for k, v in e.breakdown.items()))
                print()
            else:
                print("None of Metis's plans listed fits under amp_opt's memory model.\n")


if __name__ == "__main__":
    main()
