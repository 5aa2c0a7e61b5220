"""A ParallelJob's spec cannot change after creation: the CRD's transition rule on spec, evaluated with
cel-python as the API server does on an update (`oldSelf` bound to the stored spec)."""

from __future__ import annotations

import celpy
import pytest

from paralleljob.api import crd, rules
from tests.api.jobs import job

CEL = celpy.Environment()


def immutability_rule() -> dict:
    (rule,) = [r for r in crd.spec_schema()["x-kubernetes-validations"] if "oldSelf" in r["rule"]]
    return rule


def update_allowed(old: dict, new: dict) -> bool:
    program = CEL.program(CEL.compile(immutability_rule()["rule"]))
    return bool(program.evaluate({"self": celpy.json_to_cel(new), "oldSelf": celpy.json_to_cel(old)}))


@pytest.mark.parametrize(
    ("edit", "allowed"),
    [
        ({}, True),
        ({"training": {"steps": 200}}, False),
        ({"parallelism": {"pipeline": 2, "tensor": 4, "data": 4}}, False),
        ({"template": {"env": [{"name": "A", "value": "1"}]}}, False),
    ],
    ids=["unchanged", "steps", "layout", "template"],
)
def test_spec_cannot_change_after_creation(edit, allowed):
    spec = crd.apply_defaults(crd.spec_schema(), job()["spec"])
    assert update_allowed(spec, {**spec, **edit}) == allowed


def test_the_rejection_tells_the_user_what_to_do():
    rule = immutability_rule()
    assert rule["message"] == rules.SPEC_IMMUTABLE_MESSAGE
    assert "delete" in rule["message"] and "create it again" in rule["message"]


def test_the_generated_crd_carries_the_rule():
    schema = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert immutability_rule() in schema["x-kubernetes-validations"]
