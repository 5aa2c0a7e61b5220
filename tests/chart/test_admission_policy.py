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
import yaml

from paralleljob.api import crd, policy, validate_document
from paralleljob.api import types as t
from tests.api.helpers import BASE
from tests.chart.helpers import RELEASE, render

ENABLED = {"policy": {"validatingAdmissionPolicy": {"enabled": True}}}
WIDENED = {
    "policy": {
        "allowedVolumeTypes": [*policy.DEFAULT_VOLUME_TYPES, "hostPath", "secret"],
        "allowedServiceAccounts": ["default", "deployer"],
        "forbiddenEnv": ["PYTHONPATH"],
        "allowedPriorityClasses": ["system-cluster-critical"],
        "allowedMetadataDomains": ["app.kubernetes.io", "kubernetes.io"],
        "validatingAdmissionPolicy": {"enabled": True},
    }
}
CEL = celpy.Environment()
SPEC_SCHEMA = crd.spec_schema()

# The job the admission policy is tested on is the Python policy tests' own (tests/api/test_policy.py).
JOBS = {
    "plain": {},
    "host-path-root": {"template": {"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}},
    "host-path-checkpoint": {"checkpoint": {"volume": {"hostPath": {"path": "/"}}}},
    "secret-volume": {"template": {"volumes": [{"name": "s", "secret": {"secretName": "db"}}]}},
    "projected-secret": {
        "template": {"volumes": [{"name": "p", "projected": {"sources": [{"secret": {"name": "d"}}]}}]}
    },
    "projected-token": {
        "template": {"volumes": [{"name": "p", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}]}
    },
    "env-secret": {"template": {"env": [{"name": "P", "valueFrom": {"secretKeyRef": {"name": "d", "key": "k"}}}]}},
    "another-account": {"template": {"serviceAccountName": "deployer"}},
    "default-account": {"template": {"serviceAccountName": "default"}},
    "ld-preload": {"template": {"env": [{"name": "LD_PRELOAD", "value": "/x.so"}]}},
    "ld-preload-nccl": {"network": {"ncclEnv": {"LD_LIBRARY_PATH": "/x"}}},
    "pythonpath": {"template": {"env": [{"name": "PYTHONPATH", "value": "/x"}]}},
    "priority-class": {"template": {"priorityClassName": "system-cluster-critical"}},
    "apparmor-unconfined": {
        "template": {"annotations": {"container.apparmor.security.beta.kubernetes.io/trainer": "unconfined"}}
    },
    "own-labels": {"template": {"labels": {"team": "a", "app.kubernetes.io/name": "gpt"}}},
}


def job(name: str) -> dict[str, Any]:
    doc = yaml.safe_load(BASE)
    doc["spec"].update(JOBS[name])
    doc["spec"] = crd.apply_defaults(SPEC_SCHEMA, doc["spec"])
    return doc


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


def operator_problems(values: dict[str, Any], doc: dict[str, Any]) -> list[str]:
    settings = values["policy"]
    admission = policy.AdmissionPolicy(
        volume_types=tuple(settings.get("allowedVolumeTypes", policy.DEFAULT_VOLUME_TYPES)),
        service_accounts=tuple(settings.get("allowedServiceAccounts", policy.DEFAULT_SERVICE_ACCOUNTS)),
        forbidden_env=tuple(settings.get("forbiddenEnv", policy.DEFAULT_FORBIDDEN_ENV)),
        priority_classes=tuple(settings.get("allowedPriorityClasses", ())),
        metadata_domains=tuple(settings.get("allowedMetadataDomains", policy.DEFAULT_METADATA_DOMAINS)),
    )
    resolved = validate_document(doc).resolved
    assert resolved is not None
    return [p.render() for p in policy.check_policy(resolved.spec, admission)]


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
