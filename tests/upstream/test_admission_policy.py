"""The chart's ValidatingAdmissionPolicy on the real kube-apiserver: installed by `helm upgrade` with the policy
on, type-checked against the CRD's schema without a warning, refusing exactly the jobs the operator's own policy
check refuses (the jobs of tests/chart/admission_jobs.py, default and widened policy) with a message that
names the field, and passed by a user who may create pods (the `authorizer` bypass) but not by one who may not.

What was verified offline only (cel-python has no authorizer, no type checker, no cost estimate) is verified here.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from testcluster.api import CHART, RELEASE, RELEASE_NAMESPACE, Api, Tool
from tests.chart import admission_jobs as offline

pytestmark = pytest.mark.both_releases

JOBS = "/apis/paralleljob.io/v1alpha1/namespaces/{namespace}/paralleljobs"
POLICY = f"{RELEASE}-paralleljob-operator-jobs"


def set_flags(values: dict[str, Any], prefix: str = "") -> list[str]:
    """`--set-json` flags for a values dict (helm merges them into the chart's defaults)."""
    return [flag for key, value in values.items() for flag in ("--set-json", f"{prefix}{key}={json.dumps(value)}")]


@pytest.fixture(scope="module", params=["default-policy", "widened-policy"])
def policy_values(
    request: pytest.FixtureRequest, upstream: Any, chart: str, helm: Tool, admin_api: Api
) -> Iterator[dict[str, Any]]:
    values = offline.ENABLED if request.param == "default-policy" else offline.WIDENED
    helm(
        "upgrade",
        RELEASE,
        str(CHART),
        "-n",
        RELEASE_NAMESPACE,
        "--reuse-values",
        *set_flags(values["policy"], "policy."),
    )
    wait_until_in_force(upstream, admin_api, values)
    yield values
    helm("upgrade", RELEASE, str(CHART), "-n", RELEASE_NAMESPACE, "--reset-values")


def wait_until_in_force(upstream: Any, admin: Api, values: dict[str, Any], timeout: float = 30.0) -> None:
    """Wait until the server enforces the upgraded policy. The API server compiles a changed policy in the
    background: for a few seconds after `helm upgrade` the old expressions still run (with the new messages)."""
    namespace = f"probe-{uuid.uuid4().hex[:8]}"
    admin.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    grant(admin, namespace, "alice", ["paralleljobs"])
    alice = Api(upstream, upstream.tokens["alice"])
    deadline = time.monotonic() + timeout
    try:
        while True:
            verdicts = {
                name: create_as(alice, namespace, offline.job(name))[0] == 201
                for name in ("ld-preload", "pythonpath", "host-path-root")
            }
            wanted = {name: not offline.operator_problems(values, offline.job(name)) for name in verdicts}
            if verdicts == wanted:
                return
            assert time.monotonic() < deadline, f"the upgraded policy was not in force after {timeout} s: {verdicts}"
            time.sleep(0.5)
    finally:
        admin.send("DELETE", f"/api/v1/namespaces/{namespace}")


def grant(admin: Api, namespace: str, user: str, resources: list[str]) -> None:
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    rule = {"apiGroups": ["", "paralleljob.io"], "resources": resources, "verbs": ["create", "get", "update", "patch"]}
    admin.create(f"{rbac}/roles", {"metadata": {"name": user}, "rules": [rule]})
    binding = {
        "metadata": {"name": user},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": user},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    admin.create(f"{rbac}/rolebindings", binding)


@pytest.fixture
def users(upstream: Any, admin_api: Api, namespace: str) -> dict[str, Api]:
    """alice may create ParallelJobs only; bob may create pods as well."""
    grant(admin_api, namespace, "alice", ["paralleljobs"])
    grant(admin_api, namespace, "bob", ["paralleljobs", "pods"])
    return {name: Api(upstream, upstream.tokens[name]) for name in ("alice", "bob")}


def create_as(api: Api, namespace: str, doc: dict[str, Any]) -> tuple[int, str]:
    doc = {**doc, "metadata": {**doc["metadata"], "namespace": namespace}}
    response = api.send("POST", JOBS.format(namespace=namespace), doc, dryRun="All")
    return response.status_code, response.json().get("message", "")


def test_the_policy_type_checks_against_the_crd(policy_values: dict[str, Any], admin_api: Api) -> None:
    policy = admin_api.ok(
        admin_api.send("GET", f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{POLICY}")
    )
    assert policy["status"]["observedGeneration"] == policy["metadata"]["generation"]
    assert policy["status"]["typeChecking"].get("expressionWarnings") in (None, []), policy["status"]


@pytest.mark.parametrize("name", offline.JOBS, ids=list(offline.JOBS))
def test_the_real_policy_gives_the_operators_verdict(
    policy_values: dict[str, Any], users: dict[str, Api], namespace: str, name: str
) -> None:
    doc = offline.job(name)
    problems = offline.operator_problems(policy_values, doc)
    code, message = create_as(users["alice"], namespace, doc)
    if problems:
        assert code == 403 and "denied request" in message and RELEASE in message, message
        # The server quotes the refusing validation's message, which names the field (or the list or map that
        # holds it) that the operator's own finding names.
        field = message.split("denied request: ", 1)[1].split(":", 1)[0]
        assert any(p.startswith(field) for p in problems), (message, problems)
    else:
        assert code == 201, message


def test_a_user_who_may_create_pods_passes_through_the_authorizer_bypass(
    policy_values: dict[str, Any], users: dict[str, Api], namespace: str
) -> None:
    refused = [name for name in offline.JOBS if offline.operator_problems(policy_values, offline.job(name))]
    doc = offline.job(refused[0])
    assert create_as(users["alice"], namespace, doc)[0] == 403
    assert create_as(users["bob"], namespace, doc)[0] == 201
