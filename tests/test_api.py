"""The library API: names exported lazily, typed records, and no module shadowing a function."""

import importlib

import amp_opt


def test_public_names_resolve_to_callables_and_types():
    for name in ("load_instance", "parse_instance", "parse_plan", "evaluate", "solve"):
        assert callable(getattr(amp_opt, name))
    for name in ("Instance", "Plan", "Evaluation", "SolveResult", "SolverStats", "InputError", "InfeasibleError"):
        assert isinstance(getattr(amp_opt, name), type)


def test_solve_stays_a_function_after_every_submodule_is_imported():
    import pkgutil

    names = [m.name for m in pkgutil.walk_packages(amp_opt.__path__, "amp_opt.") if not m.name.endswith("__main__")]
    assert "amp_opt.search.mip.driver" in names and "amp_opt.commands.cli" in names
    for name in names:
        try:
            importlib.import_module(name)
        except amp_opt.InputError as exc:  # the PyTorch engine without PyTorch: one clear line
            assert name.startswith("amp_opt.runtime.") and "PyTorch is not installed" in str(exc)
    assert callable(amp_opt.solve) and amp_opt.solve.__module__ == "amp_opt.search.solve"


def test_another_planner_calls_amp_opt(paper_instances):
    inst = paper_instances["het_cluster"]
    result = amp_opt.solve(inst, cost_model="amp", top_k=2)
    plan = amp_opt.parse_plan(result.best.plan.to_json())
    again = amp_opt.evaluate(inst, plan, "amp")
    assert again.predicted_time == result.best.predicted_time
    assert len(result.top) == 2 and result.top[0].predicted_time <= result.top[1].predicted_time


def test_plans_written_by_solve_match_the_published_plan_schema(paper_instances):
    import json
    from pathlib import Path

    import jsonschema

    schema = json.loads((Path(amp_opt.__file__).parent / "schema" / "plan.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    plan = amp_opt.solve(paper_instances["het_model"]).best.plan.to_json()
    jsonschema.validate(plan, schema)
    jsonschema.validate([plan, plan], schema)
    try:
        jsonschema.validate(dict(plan, speed=1), schema)
    except jsonschema.ValidationError:
        pass
    else:
        raise AssertionError("an unknown field must not validate")
