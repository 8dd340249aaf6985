"""The promises of issue 13: a time limit bounds the whole process, interrupts are clean,
output behaves in pipes, every option has help, bad sizes get one line."""

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import INSTANCES

HET = str(INSTANCES / "amp_het_cluster.json")


def run(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "amp_opt", *args], capture_output=True, text=True, **kwargs)


def generated(tmp_path, **shape) -> str:
    from amp_opt.model.generate import generate_instance

    path = tmp_path / "generated.json"
    path.write_text(json.dumps(generate_instance(**shape)))
    return str(path)


# --- help ---------------------------------------------------------------------------------

def test_every_option_of_every_command_has_help_with_its_default():
    from amp_opt.commands.cli import COMMANDS, build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(COMMANDS)
    for name, command in sub.choices.items():
        for action in command._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            label = f"{name} {'/'.join(action.option_strings) or action.dest}"
            assert action.help and action.help != argparse.SUPPRESS, f"{label} has no help text"
            shown = action.default not in (None, False, argparse.SUPPRESS) and not action.required
            if action.option_strings and shown:
                assert "default" in action.help, f"{label}: help does not say its default {action.default!r}"
        assert "exit codes" in (command.epilog or ""), name
    assert "4 no plan found within the time limit" in parser.epilog


def test_help_lines_are_not_cut():
    out = run("--help")
    assert out.returncode == 0
    line = next(ln for ln in out.stdout.splitlines() if ln.strip().startswith("explain"))
    assert line.rstrip().endswith("what would fit")


# --- pipes and messages -------------------------------------------------------------------

@pytest.mark.parametrize("extra", [["--top-k", "5"], ["--json", "--top-k", "20"]])
def test_closed_pipe_ends_quietly_with_exit_0(extra):
    """A reader that leaves after one line (``| head -1``): the report is written in several
    pieces and the JSON of 20 plans is larger than a pipe holds, so later writes meet a closed
    pipe (before: exit 1, and a BrokenPipeError traceback with --json)."""
    proc = subprocess.Popen([sys.executable, "-m", "amp_opt", "solve", HET, "--cost-model", "amp", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and err == ""


def test_report_to_a_pipe_has_no_trailing_spaces_and_no_wrapping():
    out = run("solve", HET, "--cost-model", "amp", "--top-k", "3")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert all(line == line.rstrip() for line in lines)
    solver = [line for line in lines if line.startswith("solver ")]
    assert len(solver) == 1 and len(solver[0]) > 130 and solver[0].split("; ")[-1].startswith("placement")


def test_missing_file_is_named_once():
    out = run("solve", "nope.json")
    assert out.returncode == 2
    assert out.stderr.strip() == "amp-opt: error: nope.json: instance file not found"


# --- time limits --------------------------------------------------------------------------

def test_time_limit_bounds_the_whole_process_and_returns_a_plan(tmp_path):
    """192 GPUs of four types, 96 layers (issue 13: took 13 s and exited 3 with --time-limit 5)."""
    path = generated(tmp_path, seed=7, nodes=24, devices_per_node=8, device_types=4, layers=96, global_batch=512)
    limit = 4.0
    start = time.perf_counter()
    out = run("solve", path, "--time-limit", str(limit), "--json")
    wall = time.perf_counter() - start
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["feasible"] and doc["solver"]["status"] in ("OPTIMAL", "FEASIBLE")
    assert doc["solver"]["bound"] <= doc["solver"]["objective"]
    assert wall <= limit + 1.5, wall


def test_no_plan_in_time_exits_4_with_json(tmp_path):
    path = generated(tmp_path, seed=7, nodes=24, devices_per_node=8, device_types=4, layers=96, global_batch=512)
    out = run("solve", path, "--time-limit", "0.001", "--json")
    assert out.returncode == 4, out.stderr
    assert json.loads(out.stdout) == {"status": "UNKNOWN",
                                      "reason": "no plan found before the time limit of 0.001 s; "
                                                "infeasibility not proven"}
    assert out.stderr.count("\n") == 1 and "infeasibility not proven" in out.stderr


def test_auto_routes_large_clusters_up_front():
    from amp_opt import load_instance
    from amp_opt.search.route import enumerator_fits

    small = load_instance(HET)
    large = load_instance(INSTANCES / "suite" / "scale" / "s1024-gpt3-175b-4types.json")
    start = time.perf_counter()
    assert enumerator_fits(small, "free")[0] and not enumerator_fits(large, "free")[0]
    assert time.perf_counter() - start < 0.5


# --- interrupts ---------------------------------------------------------------------------

def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("solver, sig", [("cbc", signal.SIGINT), ("cpsat", signal.SIGINT), ("cbc", signal.SIGTERM)])
def test_interrupt_is_clean(tmp_path, solver, sig):
    """A real signal to a real solve while its MIP runs: the best plan so far is printed, the
    exit code is 128 + the signal, and no child process or temporary folder is left.  With
    --top-k 10 --per-candidate (each candidate's best plan) the programs cannot prune each other and
    run for a minute or more, so the signal lands while they run (not as the solve ends)."""
    env = dict(os.environ, TMPDIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "amp_opt", "solve", HET, "--solver", solver, "--json",
                             "--top-k", "10", "--per-candidate"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    seen: set[int] = set()
    deadline = time.perf_counter() + 30
    while time.perf_counter() < deadline and proc.poll() is None:
        seen.update(_children(proc.pid))
        # CBC: once a CBC child runs; CP-SAT runs inside the process: once the programs have started.
        if (solver == "cbc" and seen) or (solver == "cpsat" and time.perf_counter() > deadline - 28.5):
            break
        time.sleep(0.005)
    assert proc.poll() is None, "the solve ended before it could be interrupted"
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig, err
    assert err.count("\n") == 1 and f"interrupted by {signal.Signals(sig).name}" in err, err
    doc = json.loads(out)
    assert doc.get("status") == "UNKNOWN" or doc["solver"]["status"] in ("FEASIBLE", "OPTIMAL")
    if solver == "cbc":
        assert seen, "no CBC child was seen"
    assert not [pid for pid in seen if _alive(pid)], "a child process survived"
    assert not list(tmp_path.glob("amp_opt_cbc_*")), "a temporary folder was left behind"


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 if hasattr(os, "sched_getaffinity") else True,
                    reason="a helper process needs two usable cores")
def test_interrupt_stops_the_subsets_helper_process_too(tmp_path):
    """A signal to a solve whose idle-GPU subsets run in a helper process (--processes 2, the
    default, under a time limit): the helper is stopped with it, the best plan so far is
    printed, one line on stderr, exit 143, and no process is left."""
    inst = tmp_path / "g.json"
    subprocess.run([sys.executable, "-m", "amp_opt", "generate", "--seed", "11", "--nodes", "128",
                    "--devices-per-node", "8", "--device-types", "4", "--layers", "96", "-o", str(inst)], check=True)
    proc = subprocess.Popen([sys.executable, "-m", "amp_opt", "solve", str(inst), "--solver", "cpsat", "--json",
                             "--time-limit", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: set[int] = set()
    deadline = time.perf_counter() + 30
    while time.perf_counter() < deadline and proc.poll() is None and not seen:
        seen.update(_children(proc.pid))
        time.sleep(0.005)
    assert seen, "no helper process was seen"
    time.sleep(2.0)  # the helper's searches are under way
    began = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err
    assert err.count("\n") == 1 and "interrupted by SIGTERM" in err, err
    assert time.perf_counter() - began < 15
    doc = json.loads(out)
    assert doc.get("status") == "UNKNOWN" or doc["solver"]["status"] in ("FEASIBLE", "OPTIMAL")
    assert not [pid for pid in seen if _alive(pid)], "the helper process survived"


SIGINT_AFTER = """
import os, signal, sys, time
import amp_opt
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, even if the parent ignores SIGINT
inst = amp_opt.load_instance(sys.argv[1])
amp_opt.solve(inst, solver=sys.argv[2])
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(2)
except KeyboardInterrupt:
    print("KeyboardInterrupt")
"""


@pytest.mark.parametrize("solver", ["cbc", "cpsat"])
def test_sigint_still_reaches_python_after_a_solve(solver):
    """CP-SAT's own SIGINT handler, when on, leaves SIGINT at its default action (the process
    dies) once it is done: every CP-SAT solve amp_opt makes (the programs, and the kind phase's
    repair model, which runs under CBC too) turns it off.  64 GPUs on 8 nodes run the kind phase."""
    instance = str(INSTANCES / "suite" / "scale" / "s0064-gpt3-6.7b-3types.json")
    out = subprocess.run([sys.executable, "-c", SIGINT_AFTER, instance, solver], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "KeyboardInterrupt", (out.returncode, out.stderr[-500:])


def test_stop_request_returns_the_best_plan_so_far(paper_instances):
    from amp_opt import solve
    from amp_opt.search import stop

    stop.clear()
    calls = []

    def progress(done, total):
        calls.append(done)
        stop.request("SIGINT")

    try:
        result = solve(paper_instances["het_cluster"], solver="cbc", progress=progress)
    finally:
        stop.clear()
    assert result.best.feasible and result.solver.extra.get("stopped") in (None, "interrupted by SIGINT")
    assert result.solver.bound <= result.solver.objective


# --- sizes --------------------------------------------------------------------------------

def _cluster(layers: int, count: int = 2) -> dict:
    return {"version": 1, "model": {"preset": "gpt", "hidden": 256, "layers": layers, "heads": 4, "seq_len": 256,
                                    "vocab": 1000},
            "nodes": [{"device_type": "A100-40GB", "count": count, "devices": 4, "intra_bandwidth": "300 GB/s",
                       "inter_bandwidth": "100 Gbit/s"},
                      {"device_type": "T4", "devices": 4, "intra_bandwidth": "32 GB/s", "inter_bandwidth": "25 Gbit/s"}],
            "training": {"global_batch": 64}}


def test_too_many_gpus_is_refused_before_listing_them():
    from amp_opt import InputError, parse_instance

    doc = _cluster(4, count=10**9)
    start = time.perf_counter()
    with pytest.raises(InputError, match=r"nodes\[0\]\.count: .* at most 65536 GPUs"):
        parse_instance(doc)
    assert time.perf_counter() - start < 1.0


def test_too_many_layers_is_refused_before_expanding_them():
    from amp_opt import InputError, parse_instance

    with pytest.raises(InputError, match=r"model\.layers: 1000000000 transformer layers; .* at most 131070"):
        parse_instance(_cluster(10**9))


def test_long_model_is_searched_over_exact_blocks():
    """300 transformer layers: searched as 128 blocks; the plan's boundaries are block boundaries,
    its value is the same on the blocks and on the layers, and the bound holds for every plan."""
    from amp_opt import evaluate, parse_instance, solve
    from amp_opt.model.coarsen import MAX_LAYERS, coarsen

    inst = parse_instance(_cluster(300))
    coarse, boundaries = coarsen(inst)
    assert coarse.num_layers == len(boundaries) - 1 <= MAX_LAYERS and boundaries[0] == 0 and boundaries[-1] == inst.num_layers
    result = solve(inst, solver="cpsat", time_limit=20)
    plan = result.best.plan
    assert set(plan.partition) <= set(boundaries) and "coarsened" in result.solver.extra
    block_plan = dataclasses.replace(plan, partition=tuple(boundaries.index(b) for b in plan.partition))
    assert evaluate(coarse, block_plan).predicted_time == pytest.approx(result.best.predicted_time, rel=1e-9)
    assert result.solver.bound <= result.solver.objective
    assert result.solver.status in ("FEASIBLE", "OPTIMAL")


def test_interleaving_over_blocks_is_megatrons_split_of_the_layers_too():
    """Over blocks, an interleaved candidate exists only where the layers behind the blocks split
    evenly as well: its plan, mapped back to the layers, is one the engine runs (203 transformer
    layers split into 4 chunks but not into 8, while their 102 blocks split into both)."""
    from amp_opt import evaluate, parse_instance
    from amp_opt.model.candidates import candidates
    from amp_opt.model.coarsen import coarsen
    from amp_opt.model.engines import megatron_split

    inst = parse_instance(_cluster(203, count=1))  # 8 GPUs
    coarse, boundaries = coarsen(inst)
    interleaved = [c for c in candidates(coarse) if c.virtual_stages > 1]
    assert interleaved and all(megatron_split(inst, c.pp * c.virtual_stages) is not None for c in interleaved)
    assert megatron_split(coarse, 8) is not None and megatron_split(inst, 8) is None  # the case the rule is for
    for cand in interleaved[:3]:  # their even split of the blocks is a plan the layers' engine accepts
        chunks = megatron_split(coarse, cand.pp * cand.virtual_stages).boundaries
        plan = cand.plan(tuple(boundaries[i] for i in chunks))
        assert evaluate(inst, plan).predicted_time > 0


def test_a_program_beyond_64_bit_integers_is_no_crash():
    """Global batches near 2^40 make memory rows of huge micro-batches exceed CP-SAT's integers:
    such a program yields no plan and no proof (UNKNOWN), never a traceback."""
    from amp_opt.search.clock import Clock
    from amp_opt.search.mip.backends import Program, Settings, run_backend
    from amp_opt.search.mip.linear import BIN, LinearModel

    lm = LinearModel()
    x = lm.var("x", 0, 1, BIN)
    y = lm.var("y", 0, 1, BIN)
    lm.add({x: 6e18, y: 5e18}, "<=", 8e18, "bytes", "memory")
    lm.objective = {x: 1.0, y: 1.0}
    out = run_backend("cpsat", Program(lm), Clock.of(1.0), Settings())
    assert out.status == "UNKNOWN" and out.values is None and out.rejected


def _market_split(rows=5, columns=50, seed=1):
    """Cornuéjols-Dawande market split: a tiny program that branch and bound takes minutes to close."""
    import random

    from amp_opt.search.mip.linear import BIN, TIME, LinearModel

    rng = random.Random(seed)
    lm = LinearModel()
    xs = [lm.var(f"x{j}", 0, 1, BIN) for j in range(columns)]
    lm.objective = {}
    for i in range(rows):
        a = [rng.randint(0, 99) for _ in range(columns)]
        over, under = lm.var(f"over{i}", 0, 1e4, TIME), lm.var(f"under{i}", 0, 1e4, TIME)
        lm.add({**{x: float(c) for x, c in zip(xs, a)}, over: 1.0, under: -1.0}, "==", sum(a) // 2, "s", f"split{i}")
        lm.objective.update({over: 1.0, under: 1.0})
    return lm


@pytest.mark.parametrize("how", ["signal", "deadline"])
def test_highs_stops_on_a_stop_request_and_at_its_deadline(how):
    """HiGHS runs in-process: its callbacks and the caller's wait must end it, whatever it is doing."""
    pytest.importorskip("highspy")
    import threading
    import time

    from amp_opt.search import stop
    from amp_opt.search.clock import NO_LIMIT
    from amp_opt.search.mip.highs import Program, Settings, solve

    lm = _market_split()
    start = time.perf_counter()
    if how == "signal":
        timer = threading.Timer(0.5, stop.request, args=("SIGINT",))
        timer.start()
    try:
        out = solve(Program(lm), NO_LIMIT if how == "signal" else NO_LIMIT.within(0.5), Settings())
    finally:
        stop.clear()
    assert time.perf_counter() - start < 5.0
    assert out.status in ("FEASIBLE", "UNKNOWN")


# --- structure ------------------------------------------------------------------------------

KNOWN_CYCLES: set[frozenset] = set()  # none: any cycle, even one written inside a function, fails the test


def import_graph(root: Path) -> dict[str, set[str]]:
    """Every amp_opt module's imports of other amp_opt modules, wherever they are written (at the
    top or inside a function), each resolved to the most specific module named."""
    import ast

    modules = {}
    for path in (root / "amp_opt").rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if package else parts)] = (path, package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, (path, package) in modules.items():
        here = name.split(".") if package else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(here[:len(here) - node.level + 1] + [node.module or ""] if node.level else [node.module])
                base = base.rstrip(".")
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> set[frozenset]:
    import networkx as nx

    g = nx.DiGraph([(a, b) for a, targets in graph.items() for b in targets])
    return {frozenset(c) for c in nx.strongly_connected_components(g) if len(c) > 1}


def test_no_import_cycle_even_inside_a_function(tmp_path):
    root = Path(__file__).resolve().parents[1]
    graph = import_graph(root)
    assert "amp_opt.search.clock" in graph["amp_opt.search.context"]  # resolved from "from .clock import Clock"
    assert "amp_opt.runtime.merge" in graph["amp_opt.commands.profile"]  # found inside a function
    found = cycles(graph)
    assert found <= KNOWN_CYCLES, f"import cycles: {[sorted(c) for c in found - KNOWN_CYCLES]}"
    # The check sees a cycle written inside a function.
    graph["amp_opt.search.tuning"] = {"amp_opt.search.clock"}
    assert frozenset({"amp_opt.search.clock", "amp_opt.search.tuning"}) in cycles(graph)


def test_the_solve_options_are_declared_once():
    """The option fields of SolveOptions are what solve_options and amp_opt.solve take, with the
    same defaults, keyword-only; solve's numpydoc names every one."""
    import inspect
    import re

    import amp_opt
    from amp_opt.search.options import OPTIONS, SolveOptions, solve_options

    signature = inspect.signature(amp_opt.solve)
    keywords = {n: p.default for n, p in signature.parameters.items() if p.kind is p.KEYWORD_ONLY}
    assert keywords == {**OPTIONS, "started": None}
    assert list(signature.parameters)[0] == "instance"
    fields = {f.name: f.default for f in dataclasses.fields(SolveOptions)}
    assert all(fields[n] == d or (n, d) == ("placement", None) for n, d in OPTIONS.items())
    documented = {name for line in re.findall(r"^    (\w[\w, ]*) :", amp_opt.solve.__doc__, re.M)
                  for name in line.split(", ")}
    assert set(OPTIONS) | {"instance", "started"} == documented
    with pytest.raises(TypeError, match="gap"):
        solve_options(gap=0.1)
    assert solve_options(top_k=2, seed=3) == dataclasses.replace(SolveOptions(placement="free"), top_k=2, seed=3)
