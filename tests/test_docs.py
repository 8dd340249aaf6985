"""The examples in the public docstrings run and print what they say."""

import doctest
import importlib

import pytest

from conftest import ROOT

MODULES = [
    "amp_opt.model.fields", "amp_opt.model.load", "amp_opt.model.plan", "amp_opt.model.profiles",
    "amp_opt.model.tables", "amp_opt.model.ranges", "amp_opt.model.classes", "amp_opt.model.costs",
    "amp_opt.model.costs.terms", "amp_opt.model.costs.stage_costs", "amp_opt.model.costs.iteration", "amp_opt.model.costs.link_rules",
    "amp_opt.model.costs.contract", "amp_opt.model.schedule",
    "amp_opt.model.evaluate", "amp_opt.model.calibration", "amp_opt.search.options", "amp_opt.search.solve",
    "amp_opt.calibrate.runs", "amp_opt.calibrate.metrics", "amp_opt.calibrate.predict", "amp_opt.calibrate.fit",
    "amp_opt.bench.runner", "amp_opt.bench.suites", "amp_opt.model.profile_instance", "amp_opt.search.kbest",
    "amp_opt.search.class_order", "amp_opt.search.class_reach", "amp_opt.search.class_program",
    "amp_opt.search.mip.graph_program", "amp_opt.calibrate.params", "amp_opt.calibrate.lsq",
    "amp_opt.calibrate.crossval", "amp_opt._lazy",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, monkeypatch):
    monkeypatch.chdir(ROOT)  # examples name the bundled instances by relative path
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0


# ------------------------------------------------------------------ the README and docs/

import contextlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

README = (ROOT / "README.md").read_text()
DOCS = {p: p.read_text() for p in [ROOT / "README.md", ROOT / "benchmarks" / "README.md",
                                   *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "formulations").glob("*.md"))]}
# Equation labels of formulations/ (H13, B6, M5, K7, A2, X3, C5', ...); catalog GPU names are not labels.
LABEL = re.compile(r"\b[HBMKAXC]\d{1,2}'?(?![\w-])")
GPU_NAMES = {"T4", "L4", "A10"}


def _blocks(text: str, lang: str = "") -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else len(text)]


def test_readme_starts_with_the_commands_that_ci_runs():
    """The README opens with install + first run and the tests, and .ci/run runs exactly those."""
    first = README.split("```bash\n", 1)
    assert first[0].strip() == "# amp_opt", "the README must start with the two commands"
    install_run, tests = first[1].split("```", 1)[0].strip().splitlines()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    install, run = install_run.split(" && ")
    assert ci.index(install) < ci.index(run) < ci.index(tests)
    torch_lines = _blocks(_section(README, "Install"), "bash")[0].strip().splitlines()
    assert all(line in ci for line in torch_lines) and len(torch_lines) == 2


def test_readme_is_short_and_has_no_history():
    assert len(README.splitlines()) <= 300
    for path, text in DOCS.items():
        if path.parent.name == "formulations" and path.name != "mip.md":
            continue  # the other formulations are checked by their owners
        hashes = [h for h in re.findall(r"\b[0-9a-f]{7,40}\b", text) if re.search(r"[a-f]", h) and re.search(r"\d", h)]
        assert not hashes, f"{path.name} names commits {hashes[:3]}"


def test_readme_uses_no_equation_label():
    """Labels are defined in formulations/; the README points there instead of using them."""
    labels = [m.group(0) for m in LABEL.finditer(README) if m.group(0) not in GPU_NAMES]
    assert not labels, labels


def test_every_relative_link_resolves():
    for path, text in DOCS.items():
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" in target:
                continue
            assert (path.parent / target).exists(), f"{path.relative_to(ROOT)}: broken link {target}"


def test_readme_lists_every_command_and_every_bundled_instance():
    from amp_opt.commands.cli import COMMANDS

    table = _section(README, "Commands")
    for name in COMMANDS:
        assert f"| `{name} " in table or f"| `{name}`" in table, name
    listed = _section(README, "Bundled instances")
    for path in [*ROOT.glob("instances/*.json"), *ROOT.glob("instances/suite/scale/*.json")]:
        assert f"`{path.relative_to(ROOT).as_posix()}`" in listed, path.name
    gen = sorted(ROOT.glob("instances/suite/gen/*.json"))
    assert gen and all(re.fullmatch(r"g\d{4}-s\d{3}-t[2-4]-l\d{2}\.json", p.name) for p in gen)
    assert "`instances/suite/gen/gNNNN-sSSS-tT-lL.json`" in listed


def test_benchmark_figures_come_from_their_results_files():
    """Every number of a Benchmarks row is in the results file the row links, and the row's
    command is written in that file."""
    rows = [line for line in _section(README, "Benchmarks").splitlines() if line.startswith("| ") and "](" in line]
    assert len(rows) >= 8
    for row in rows:
        figure, command, results = [c.strip() for c in row.strip("|").split(" | ")]
        text = (ROOT / re.search(r"\]\(([^)]+)\)", results).group(1)).read_text()
        assert re.search(r"`([^`]+)`", command).group(1) in text, command
        for number in re.findall(r"\d+(?:[.,]\d+)*%?", figure):
            assert number in text or number.replace(",", "") in text, f"{number} not in {results}"


def test_the_first_run_shown_is_the_real_output():
    shown = _blocks(_section(README, "The first run"))[0]
    out = subprocess.run([sys.executable, "-m", "amp_opt", "solve", "instances/amp_het_cluster.json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr

    def steady(text):  # the solver's wall time varies from run to run
        return re.sub(r" in \d+\.\d+ s;", " in T s;", text).strip()

    assert steady(out.stdout) == steady(shown)


def test_readme_library_example_prints_what_its_comments_say(monkeypatch):
    monkeypatch.chdir(ROOT)
    code = _blocks(_section(README, "Library use"), "python")[0]
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        exec(compile(code, "README.md", "exec"), {})
    expected = [c.strip() for c in re.findall(r"print\(.*#(.*)", code)]
    assert expected and buffer.getvalue().splitlines() == expected


def test_readme_instance_and_plan_examples_load():
    import amp_opt

    instance_json, plan_json = _blocks(_section(README, "Instances and plans"), "json")
    amp_opt.parse_instance(json.loads(instance_json))
    het = amp_opt.load_instance(ROOT / "instances" / "amp_het_cluster.json")
    assert amp_opt.evaluate(het, amp_opt.parse_plan(json.loads(plan_json))).feasible
