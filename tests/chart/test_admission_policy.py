"""The chart's optional ValidatingAdmissionPolicy, tested as far as it can be offline: it renders with the real
helm, every expression compiles with cel-python, and its validations, evaluated with cel-python on jobs a user
could write (defaulted as the API server would), give the operator's own verdict (`api.policy`), for the default
policy and an administrator's.

Not verified here, because no API server runs in these tests: the `authorizer` bypass in matchConditions (it
is only parsed: cel-python has no authorizer), type checking and cost estimation against the CRD's schema, and
that the API server sees the declared volume sources of preserved objects as cel-python sees plain JSON.
"""

from __future__ import annotations

import re
from typing import Any

import celpy
import pytest

from paralleljob.api import types as t
from tests.chart.admission_jobs import ENABLED, JOBS, SPEC_SCHEMA, WIDENED, job, operator_problems
from tests.chart.helpers import RELEASE, render

CEL = celpy.Environment()


def admission_objects(values: dict[str, Any]) -> list[dict[str, Any]]:
    kinds = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    return [o for o in render(values) if o["kind"] in kinds]


def the_policy(values: dict[str, Any]) -> dict[str, Any]:
    return next(o for o in admission_objects(values) if o["kind"] == "ValidatingAdmissionPolicy")


def refusals(values: dict[str, Any], doc: dict[str, Any]) -> list[str]:
    """The messages of the validations that refuse `doc` (cel-python, `object` as the API server passes it)."""
    activation = {"object": celpy.json_to_cel(doc)}
    found = []
    for validation in the_policy(values)["spec"]["validations"]:
        if not CEL.program(CEL.compile(validation["expression"])).evaluate(activation):
            found.append(validation["message"])
    return found


def test_it_is_off_by_default_and_renders_a_policy_and_its_binding_when_enabled() -> None:
    assert admission_objects({}) == []
    objects = {o["kind"]: o for o in admission_objects(ENABLED)}
    binding = objects["ValidatingAdmissionPolicyBinding"]
    assert binding["spec"]["policyName"] == objects["ValidatingAdmissionPolicy"]["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert objects["ValidatingAdmissionPolicy"]["spec"]["failurePolicy"] == "Fail"
    rules = objects["ValidatingAdmissionPolicy"]["spec"]["matchConstraints"]["resourceRules"]
    assert rules == [
        {
            "apiGroups": ["paralleljob.io"],
            "apiVersions": ["*"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["paralleljobs"],
        }
    ]
    assert objects["ValidatingAdmissionPolicy"]["metadata"]["name"].startswith(RELEASE)


def test_listed_namespaces_bind_it_to_those_namespaces_only() -> None:
    values = {**ENABLED, "watchNamespaces": ["ml-a", "ml-b"]}
    binding = next(o for o in admission_objects(values) if o["kind"] == "ValidatingAdmissionPolicyBinding")
    selector = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert selector == [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["ml-a", "ml-b"]}]


@pytest.mark.parametrize(("exempt", "conditions"), [(True, 1), (False, 0)], ids=["pod-creators-exempt", "no-exemption"])
def test_users_who_may_create_pods_bypass_it_through_the_authorizer(exempt: bool, conditions: int) -> None:
    values = {"policy": {"validatingAdmissionPolicy": {"enabled": True, "exemptPodCreators": exempt}}}
    found = the_policy(values)["spec"].get("matchConditions", [])
    assert len(found) == conditions
    for condition in found:
        CEL.compile(condition["expression"])  # parsed only: cel-python has no authorizer
        assert (
            "authorizer.group('').resource('pods').namespace(request.namespace).check('create')"
            in (condition["expression"])
        )


def test_it_refuses_exactly_the_volume_sources_the_crd_declares_and_the_policy_does_not_allow() -> None:
    expression = the_policy({"policy": {"allowedVolumeTypes": [], "validatingAdmissionPolicy": {"enabled": True}}})
    first = expression["spec"]["validations"][0]["expression"]
    assert set(re.findall(r"!has\(v\.(\w+)\)", first)) == set(t.VOLUME_SOURCES)
    declared = SPEC_SCHEMA["properties"]["template"]["properties"]["volumes"]["items"]["properties"]
    assert set(declared) - {"name"} == set(t.VOLUME_SOURCES)


@pytest.mark.parametrize("values", [ENABLED, WIDENED], ids=["default-policy", "widened-policy"])
@pytest.mark.parametrize("name", JOBS, ids=list(JOBS))
def test_the_admission_policy_gives_the_operators_verdict(values: dict[str, Any], name: str) -> None:
    doc = job(name)
    assert (refusals(values, doc) == []) == (operator_problems(values, doc) == [])


def test_every_refusal_names_the_field() -> None:
    for name in ("host-path-root", "another-account", "ld-preload", "priority-class", "apparmor-unconfined"):
        messages = refusals(ENABLED, job(name))
        assert len(messages) == 1 and messages[0].startswith("spec."), (name, messages)
