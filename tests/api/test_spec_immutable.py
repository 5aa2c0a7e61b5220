"""The fields that decide a ParallelJob's layout, model and batch cannot change after creation: the CRD's
transition rule on spec, evaluated with cel-python as the API server does on an update (`oldSelf` bound to the
stored spec). Other fields may change and apply from the next gang attempt."""

from __future__ import annotations

import celpy
import pytest

from paralleljob.api import crd, rules
from tests.api.jobs import DELETE, job

CEL = celpy.Environment()


def immutability_rule() -> dict:
    # Every spec rule reads oldSelf now (each ratchets itself); this is the one with the immutability message.
    (rule,) = [r for r in crd.spec_schema()["x-kubernetes-validations"] if r["message"] == rules.SPEC_IMMUTABLE_MESSAGE]
    return rule


def update_allowed(old: dict, new: dict) -> bool:
    program = CEL.program(CEL.compile(immutability_rule()["rule"]))
    return bool(program.evaluate({"self": celpy.json_to_cel(new), "oldSelf": celpy.json_to_cel(old)}))


@pytest.mark.parametrize(
    ("edit", "allowed"),
    [
        ({}, True),
        ({"spec.parallelism.data": 4}, False),
        ({"spec.parallelism.data": DELETE}, False),
        ({"spec.gpusPerNode": 4}, False),
        ({"spec.model.ffnHiddenSize": 2048}, False),
        ({"spec.model.precision": "fp32"}, False),
        ({"spec.deepspeed.gradient_accumulation_steps": 16}, False),
        ({"spec.training.steps": 200}, True),
        ({"spec.template.env": [{"name": "A", "value": "1"}]}, True),
        ({"spec.failurePolicy.backoffLimit": 9}, True),
        ({"spec.deepspeed.gradient_clipping": 0.5}, True),
        ({"spec.managedBy": "kueue.x-k8s.io/multikueue"}, False),
    ],
    ids=[
        "unchanged",
        "data-size",
        "data-unset",
        "gpus-per-node",
        "ffn-set",
        "precision",
        "accumulation",
        "steps",
        "template",
        "backoff",
        "clipping",
        "managed-by-set",
    ],
)
def test_layout_model_and_batch_cannot_change_after_creation_but_the_rest_can(edit, allowed):
    old = crd.apply_defaults(crd.spec_schema(), job()["spec"])
    new = crd.apply_defaults(crd.spec_schema(), job(**{k.replace(".", "__"): v for k, v in edit.items()})["spec"])
    assert update_allowed(old, new) == allowed


def test_the_rejection_tells_the_user_what_to_do():
    rule = immutability_rule()
    assert rule["message"] == rules.SPEC_IMMUTABLE_MESSAGE
    assert "delete" in rule["message"] and "create it again" in rule["message"]
    assert all(field.split(".")[-1] in rule["rule"] for field in rules.SPEC_IMMUTABLE_FIELDS)


def test_the_generated_crd_carries_the_rule():
    schema = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert immutability_rule() in schema["x-kubernetes-validations"]
