"""What a new user meets first: the version, the API's names, plans as dicts, exit codes that
say a plan does not fit, and a sequence length the user did not give is said."""

import json
import subprocess
import sys

import pytest

import amp_opt
from conftest import INSTANCES


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "amp_opt", *args], capture_output=True, text=True, cwd=cwd)


def test_version():
    out = cli("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"amp-opt {amp_opt.__version__}"


def test_dir_lists_the_api():
    names = dir(amp_opt)
    for name in ("solve", "evaluate", "load_instance", "parse_plan", "SolveResult", "register_solver"):
        assert name in names


def test_evaluate_and_result_from_plans_take_a_plan_dict():
    inst = amp_opt.load_instance(INSTANCES / "amp_het_cluster.json")
    doc = {"tp": 1, "dp": 4, "pp": 4, "micro_batch": 1, "partition": [0, 7, 14, 20, 30]}
    parsed = amp_opt.evaluate(inst, amp_opt.parse_plan(doc), "amp")
    assert amp_opt.evaluate(inst, doc, "amp").predicted_time == parsed.predicted_time
    from amp_opt.search.options import solve_options

    result = amp_opt.result_from_plans(inst, [doc], solve_options(cost_model="amp"))
    assert result.best.predicted_time == parsed.predicted_time
    with pytest.raises(amp_opt.InputError, match="plan.partition"):
        amp_opt.evaluate(inst, {**doc, "partition": [0, 30]})


def test_evaluate_exits_3_for_a_plan_that_does_not_fit(tmp_path):
    doc = json.loads((INSTANCES / "amp_het_cluster.json").read_text())
    for t in doc.get("device_types", []):
        t["memory"] = 2**30  # 1 GiB: no stage fits
    (tmp_path / "i.json").write_text(json.dumps(doc))
    (tmp_path / "p.json").write_text(json.dumps({"tp": 1, "dp": 4, "pp": 4, "micro_batch": 1,
                                                 "partition": [0, 7, 14, 20, 30]}))
    out = cli("evaluate", str(tmp_path / "i.json"), str(tmp_path / "p.json"))
    assert out.returncode == 3 and "needs" in out.stdout and "Traceback" not in out.stderr
    fits = cli("evaluate", str(INSTANCES / "amp_het_cluster.json"), str(tmp_path / "p.json"))
    assert fits.returncode == 0, fits.stderr


def test_a_sequence_length_taken_from_the_config_is_said(tmp_path):
    config = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 2,
              "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 1000,
              "max_position_embeddings": 131072}
    (tmp_path / "config.json").write_text(json.dumps(config))
    doc = {"version": 1, "model": {"hf_config": "config.json"}, "training": {"global_batch": 8},
           "nodes": [{"name": "n", "device_type": "H100-80GB", "devices": 2, "intra_bandwidth": "450 GB/s",
                      "inter_bandwidth": "400 Gbit/s"}]}
    (tmp_path / "i.json").write_text(json.dumps(doc))
    inst = amp_opt.load_instance(tmp_path / "i.json")
    assert any("sequence length 131072 taken from the config" in note for note in inst.notes)
    out = cli("solve", str(tmp_path / "i.json"))
    assert "note: sequence length 131072" in out.stdout
    doc["model"]["seq_len"] = 4096
    (tmp_path / "i.json").write_text(json.dumps(doc))
    assert not any("sequence length" in note for note in amp_opt.load_instance(tmp_path / "i.json").notes)


def test_the_top_k_table_shows_every_setting(capsys):
    """Two plans that differ only in interleaving or ZeRO are told apart in the --top-k table (AMP's
    ranking, one plan per candidate), and so are two that differ only in their devices (the K best
    plans, which a MIP solver lists exactly too: search/mip/listing.py)."""
    from amp_opt.commands.report import print_solve
    inst = amp_opt.load_instance(INSTANCES / "amp_het_cluster.json")
    print_solve(inst, amp_opt.solve(inst, solver="cpsat", top_k=3, per_candidate=True), show_top=True)
    out = capsys.readouterr().out
    rows = [line for line in out[out.index("best plans"):].splitlines() if "tp=" in line]
    assert len(rows) == 3 and all("micro_batch=" in row for row in rows)
    assert any("virtual_stages=" in row for row in rows) and any("zero_stage=" in row for row in rows)
    exact = cli("solve", str(INSTANCES / "amp_het_cluster.json"), "--top-k", "4", "--solver", "cpsat")
    assert exact.returncode == 0, exact.stderr
    assert "best plan" not in exact.stdout[:exact.stdout.index("best plans")]  # not "each candidate's best plan"
    rows = [line for line in exact.stdout[exact.stdout.index("best plans"):].splitlines() if "tp=" in line]
    places = [row.split(" | ") for row in rows]
    assert len(rows) == 4 and len(set(rows)) == 4 and all(len(p) == 4 for p in places)  # pp=4: where each stage runs


def test_generate_says_when_no_plan_fits(tmp_path):
    """Seed 11 at 3 nodes x 2 GPUs sizes its model past the cluster's memory: generate still writes
    it (exit 0) and says so; seed 12 fits and generate says nothing; --check 0 skips the check.
    The checks get 60 s, not the default 10: proving seed 11 infeasible took 9-10 s alone on a 2-core
    machine, so beside the suite's other process it once ended "not settled"."""
    shape = ("--nodes", "3", "--devices-per-node", "2")
    args = (*shape, "--check", "60")
    none = cli("generate", "--seed", "11", *args, "-o", str(tmp_path / "a.json"))
    assert none.returncode == 0 and "note: no plan fits this instance: no plan fits in device memory" in none.stderr
    fits = cli("generate", "--seed", "12", *args, "-o", str(tmp_path / "b.json"))
    assert fits.returncode == 0 and fits.stderr == ""
    unchecked = cli("generate", "--seed", "11", *shape, "--check", "0", "-o", str(tmp_path / "c.json"))
    assert unchecked.returncode == 0 and unchecked.stderr == ""
    assert (tmp_path / "a.json").read_text() == (tmp_path / "c.json").read_text()
