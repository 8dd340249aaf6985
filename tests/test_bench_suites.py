"""The bundled suites are package data: ``bench --suite`` runs outside the checkout, on the same
files as instances/."""

import ast
import csv
import filecmp
import fnmatch
import os
import re
import shutil
import subprocess
import sys

from conftest import INSTANCES, ROOT

from amp_opt.bench.suites import suite_folder, suite_paths


def test_packaged_suites_equal_the_checkout_instances():
    pairs = {"paper": (INSTANCES, ["amp_homogeneous.json", "amp_het_cluster.json", "amp_het_model.json"]),
             "scale": (INSTANCES / "suite" / "scale", sorted(p.name for p in (INSTANCES / "suite" / "scale").glob("*.json")))}
    for suite, (folder, names) in pairs.items():
        packaged = sorted(p.name for p in suite_folder(suite).glob("*.json"))
        assert packaged == sorted(names), suite
        for name in names:
            assert filecmp.cmp(folder / name, suite_folder(suite) / name, shallow=False), f"{suite}/{name} differs"


def test_suite_paths_come_from_the_package_in_the_paper_order():
    paths = [p for _, p in suite_paths("paper")]
    assert [p.name for p in paths] == ["amp_homogeneous.json", "amp_het_cluster.json", "amp_het_model.json"]
    assert all(p.parent == suite_folder("paper") for p in paths)
    assert [s for s, _ in suite_paths("all")] == ["paper"] * 3 + ["scale"] * 9


def test_package_data_declares_every_suite_file():
    """pyproject's package-data globs cover the suites' files, so a wheel carries them."""
    text = (ROOT / "pyproject.toml").read_text()
    globs = re.search(r"\[tool\.setuptools\.package-data\]\namp_opt = (\[.*?\])", text).group(1)
    patterns = ast.literal_eval(globs)
    package = ROOT / "amp_opt"
    files = [p.relative_to(package).as_posix() for s in ("paper", "scale") for p in suite_folder(s).glob("*.json")]
    assert files and all(any(fnmatch.fnmatch(f, pat) for pat in patterns) for f in files)


def test_bench_suite_paper_runs_outside_the_checkout(tmp_path):
    """The package copied on its own, as an install holds it (no instances/ beside it), run from
    another folder."""
    site = tmp_path / "site"
    shutil.copytree(ROOT / "amp_opt", site / "amp_opt", ignore=shutil.ignore_patterns("__pycache__"))
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-m", "amp_opt", "bench", "--suite", "paper", "--no-baselines",
                          "--time-limit", "30", "--out", "out", "--quiet"],
                         cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    with open(work / "out" / "results.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["instance"] for r in rows] == ["amp_homogeneous", "amp_het_cluster", "amp_het_model"]
    assert all(r["status"] == "OPTIMAL" for r in rows)
