"""The examples in the public docstrings run and print what they say."""

import doctest
import importlib

import pytest

from conftest import ROOT

MODULES = [
    "amp_opt.model.fields", "amp_opt.model.load", "amp_opt.model.plan", "amp_opt.model.profiles",
    "amp_opt.model.tables", "amp_opt.model.ranges", "amp_opt.model.classes", "amp_opt.model.costs",
    "amp_opt.model.costs.terms", "amp_opt.model.schedule",
    "amp_opt.model.evaluate", "amp_opt.model.calibration", "amp_opt.search.options", "amp_opt.search.solve",
    "amp_opt.calibrate.runs", "amp_opt.calibrate.metrics", "amp_opt.calibrate.predict", "amp_opt.calibrate.fit",
    "amp_opt.calibrate.params", "amp_opt.calibrate.lsq", "amp_opt.calibrate.crossval",
    "amp_opt.bench.runner",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, monkeypatch):
    monkeypatch.chdir(ROOT)  # examples name the bundled instances by relative path
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
