"""Plans whose stages and replicas differ (issue #40, PLAN_FORMAT.md): the record, its JSON form
and its checks; the pricing of such plans by the one evaluator; the brute force and the search
over them on tiny instances."""

import json
from pathlib import Path

import jsonschema
import pytest

import amp_opt
from amp_opt import InputError, parse_instance, parse_plan
from amp_opt.model.generate import generate_instance
from amp_opt.model.plan import check_plan

SCHEMA = json.loads((Path(amp_opt.__file__).parent / "schema" / "plan.schema.json").read_text())


def two_types(engine="amp_opt", *, nodes=4, per_node=1, layers=4, batch=8, seed=3):
    doc = generate_instance(seed, nodes=nodes, devices_per_node=per_node, device_types=2, layers=layers,
                            global_batch=batch)
    doc["search"]["engine"] = engine
    return parse_instance(doc)


UNEVEN = {"tp": [1, 2], "dp": [2, 1], "pp": 2, "shares": [[3, 1], [4]], "partition": [0, 2, 4]}


# -- the record ---------------------------------------------------------------------------------
def test_a_uniform_plan_in_the_per_stage_form_normalises_to_todays_record():
    written = parse_plan({"tp": [2, 2], "dp": [2, 2], "pp": 2, "shares": [[2, 2], [2, 2]], "partition": [0, 2, 4]})
    today = parse_plan({"tp": 2, "dp": 2, "pp": 2, "micro_batch": 2, "partition": [0, 2, 4]})
    assert written == today and written.uniform and written.shares is None and written.to_json() == today.to_json()


def test_the_per_stage_accessors_and_the_json_round_trip():
    plan = parse_plan(UNEVEN)
    assert not plan.uniform
    assert [plan.tp_at(s) for s in range(2)] == [1, 2] and [plan.dp_at(s) for s in range(2)] == [2, 1]
    assert plan.shares_at(0) == (3, 1) and plan.shares_at(1) == (4,)
    assert plan.pipeline_micro_batch == 4 and plan.micro_batch == 4 and plan.devices == 4
    doc = plan.to_json()
    jsonschema.validate(doc, SCHEMA)
    assert parse_plan(doc) == plan
    with pytest.raises(InputError, match="no single candidate"):
        plan.candidate
    # without shares every replica takes micro_batch samples
    even = parse_plan({"tp": [1, 2], "dp": 2, "pp": 2, "micro_batch": 2, "partition": [0, 2, 4]})
    assert even.shares_at(1) == (2, 2) and even.pipeline_micro_batch == 4 and not even.uniform


@pytest.mark.parametrize("change, field, words", [
    ({"tp": [1, 2, 2]}, "plan.tp", "lists 3 degrees, pp is 2"),
    ({"dp": [2, 0]}, "plan.dp[1]", "positive integer"),
    ({"shares": None}, "plan.shares", "required when dp differs"),
    ({"shares": [[3, 1], [3]]}, "plan.shares[1]", "sums to 3, stage 0's shares to 4"),
    ({"shares": [[3], [4]]}, "plan.shares[0]", "one share per data-parallel replica"),
    ({"shares": [[4, 0], [4]]}, "plan.shares[0][1]", "positive integer"),
    ({"micro_batch": 2}, "plan.micro_batch", "largest share 4"),
    ({"pipelines": []}, "plan.pipelines", "not supported yet"),
])
def test_bad_per_stage_fields_are_named(change, field, words):
    doc = {**UNEVEN, **change}
    doc = {k: v for k, v in doc.items() if v is not None}
    with pytest.raises(InputError, match=words) as err:
        parse_plan(doc)
    assert str(err.value).startswith(field + ":")


def test_megatron_and_deepspeed_refuse_a_non_uniform_plan_in_one_line():
    for engine in ("megatron", "deepspeed"):
        inst = two_types(engine)
        for doc, field in ((UNEVEN, "tp"), ({**UNEVEN, "tp": 1}, "dp"),
                           ({"tp": 1, "dp": 2, "pp": 1, "shares": [[3, 1]], "partition": [0, 4]}, "shares")):
            with pytest.raises(InputError) as err:
                check_plan(inst, parse_plan(doc))
            text = str(err.value)
            assert text.startswith(f"plan.{field}:") and 'search.engine "amp_opt"' in text and "\n" not in text


def test_the_amp_opt_engine_checks_a_non_uniform_plan():
    inst = two_types(per_node=2, nodes=2)
    plan = check_plan(inst, parse_plan(UNEVEN))
    assert plan.stages == (((0,), (1,)), ((2, 3),))  # dealt in order, stage 0's groups first
    with pytest.raises(InputError, match="does not divide the global batch"):
        check_plan(inst, parse_plan({**UNEVEN, "shares": [[2, 1], [3]]}))
    with pytest.raises(InputError, match=r"plan.stages\[1\]\[0\]: has 1 devices, tp is 2"):
        check_plan(inst, parse_plan({**UNEVEN, "stages": [[[0], [1]], [[2]]]}))
    with pytest.raises(InputError, match="cluster has 4"):
        check_plan(inst, parse_plan({**UNEVEN, "dp": [3, 1], "shares": [[2, 1, 1], [4]]}))
    with pytest.raises(InputError, match=r"^plan.cp:"):
        check_plan(inst, parse_plan({"tp": [1, 2], "dp": 1, "cp": 2, "pp": 2, "micro_batch": 2,
                                     "partition": [0, 2, 4]}))
    # the engine's rules still hold on each stage's own degrees
    with pytest.raises(InputError, match="sequence_parallel"):
        check_plan(inst, parse_plan({**UNEVEN, "sequence_parallel": True}))
