"""Every client presents a bearer token, and every request is authorised by RBAC against the Roles, ClusterRoles
and bindings in the store (verbs, resources, subresources, resourceNames, namespaces), as kube-apiserver does:
401 without a known token, 403 with the API's message when no rule allows the request, and no Role or binding
that grants more than its author holds."""

from __future__ import annotations

from typing import Any

import pytest
import requests

from tests.cluster.conftest import Client, refusal

RBAC = "/apis/rbac.authorization.k8s.io/v1"
ACCOUNT = "system:serviceaccount:research:trainer"

# The trainer account's permissions, as a user would write them.
ROLE: dict[str, Any] = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "Role",
    "metadata": {"name": "trainer"},
    "rules": [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["gpt-config"], "verbs": ["get"]},
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["create"]},
    ],
}
BINDING: dict[str, Any] = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "RoleBinding",
    "metadata": {"name": "trainer"},
    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "trainer"},
    "subjects": [{"kind": "ServiceAccount", "name": "trainer", "namespace": "research"}],
}
NODE_READER: dict[str, Any] = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRole",
    "metadata": {"name": "node-reader"},
    "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}],
}


@pytest.fixture(scope="module")
def trainer(cluster, admin: Client) -> Client:
    """The ServiceAccount research/trainer with ROLE bound in research, and node-reader bound in `other` only."""
    admin.ok(admin.create("/api/v1/namespaces", {"metadata": {"name": "other"}}))
    admin.ok(admin.create("/api/v1/namespaces/research/serviceaccounts", {"metadata": {"name": "trainer"}}))
    admin.ok(admin.create(f"{RBAC}/namespaces/research/roles", ROLE))
    admin.ok(admin.create(f"{RBAC}/namespaces/research/rolebindings", BINDING))
    admin.ok(admin.create(f"{RBAC}/clusterroles", NODE_READER))
    in_other = {**BINDING, "roleRef": {**BINDING["roleRef"], "kind": "ClusterRole", "name": "node-reader"}}
    admin.ok(admin.create(f"{RBAC}/namespaces/other/rolebindings", in_other))
    for name in ("gpt-config", "other-config"):
        admin.ok(admin.create("/api/v1/namespaces/research/configmaps", {"metadata": {"name": name}}))
    admin.ok(
        admin.create(
            "/api/v1/namespaces/research/pods",
            {"metadata": {"name": "gpt-0"}, "spec": {"containers": [{"name": "t", "image": "t"}]}},
        )
    )
    return Client(cluster, cluster.token_for("research", "trainer"))


def forbidden(verb: str, resource: str, where: str, name: str = "", group: str = "") -> str:
    qualified = resource.split("/")[0] + (f".{group}" if group else "")
    subject = f'{qualified} "{name}"' if name else qualified
    return (
        f'{subject} is forbidden: User "{ACCOUNT}" cannot {verb} resource "{resource}" in API group "{group}" {where}'
    )


IN_RESEARCH = 'in the namespace "research"'
ALLOWED = {
    "list-pods-in-its-namespace": ("GET", "/api/v1/namespaces/research/pods", None),
    "patch-pod-status": ("PATCH", "/api/v1/namespaces/research/pods/gpt-0/status", {"status": {"phase": "Running"}}),
    "get-the-named-configmap": ("GET", "/api/v1/namespaces/research/configmaps/gpt-config", None),
}
DENIED = {
    "list-pods-in-another-namespace": (
        "GET",
        "/api/v1/namespaces/default/pods",
        None,
        forbidden("list", "pods", 'in the namespace "default"'),
    ),
    "delete-a-pod": (
        "DELETE",
        "/api/v1/namespaces/research/pods/gpt-0",
        None,
        forbidden("delete", "pods", IN_RESEARCH, "gpt-0"),
    ),
    "patch-a-pod-not-its-status": (
        "PATCH",
        "/api/v1/namespaces/research/pods/gpt-0",
        {"metadata": {"labels": {"a": "b"}}},
        forbidden("patch", "pods", IN_RESEARCH, "gpt-0"),
    ),
    "get-a-configmap-not-named-in-the-rule": (
        "GET",
        "/api/v1/namespaces/research/configmaps/other-config",
        None,
        forbidden("get", "configmaps", IN_RESEARCH, "other-config"),
    ),
    "list-configmaps-with-resource-names": (
        "GET",
        "/api/v1/namespaces/research/configmaps",
        None,
        forbidden("list", "configmaps", IN_RESEARCH),
    ),
    "read-secrets": ("GET", "/api/v1/namespaces/research/secrets", None, forbidden("list", "secrets", IN_RESEARCH)),
    "list-nodes-bound-only-in-a-namespace": (
        "GET",
        "/api/v1/nodes",
        None,
        forbidden("list", "nodes", "at the cluster scope"),
    ),
    "patch-a-job-status": (
        "PATCH",
        "/apis/paralleljob.io/v1alpha1/namespaces/research/paralleljobs/gpt/status",
        {"status": {}},
        forbidden("patch", "paralleljobs/status", IN_RESEARCH, "gpt", "paralleljob.io"),
    ),
}


@pytest.mark.parametrize(("method", "path", "body"), ALLOWED.values(), ids=ALLOWED.keys())
def test_what_a_role_grants_is_allowed(trainer: Client, method, path, body):
    response = trainer.send(method, path, body)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(("method", "path", "body", "message"), DENIED.values(), ids=DENIED.keys())
def test_what_no_rule_grants_is_forbidden_with_the_api_message(trainer: Client, method, path, body, message):
    assert refusal(trainer.send(method, path, body)) == (403, "Forbidden", message)


def test_watching_is_its_own_verb(cluster, trainer):
    url = f"{cluster.url}/api/v1/namespaces/research/pods?watch=true"
    with requests.get(
        url, headers={"Authorization": f"Bearer {trainer.token}"}, stream=True, timeout=30, verify=str(cluster.ca)
    ) as response:
        assert response.status_code == 200
    url = f"{cluster.url}/api/v1/namespaces/research/configmaps?watch=true"
    with requests.get(
        url, headers={"Authorization": f"Bearer {trainer.token}"}, stream=True, timeout=30, verify=str(cluster.ca)
    ) as response:
        assert response.status_code == 403


@pytest.mark.parametrize("token", [None, "not-a-token"], ids=["no-token", "unknown-token"])
def test_a_request_without_a_known_token_is_unauthorized(cluster, token):
    assert refusal(Client(cluster, token).send("GET", "/api/v1/namespaces/research/pods")) == (
        401,
        "Unauthorized",
        "Unauthorized",
    )


def test_discovery_is_open_to_every_authenticated_user(trainer):
    assert trainer.send("GET", "/apis").status_code == 200


def test_a_role_granting_more_than_its_author_holds_is_refused(trainer):
    greedy = {
        **ROLE,
        "metadata": {"name": "greedy"},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}],
    }
    code, reason, message = refusal(trainer.create(f"{RBAC}/namespaces/research/roles", greedy))
    assert (code, reason) == (403, "Forbidden")
    assert message.startswith(f'roles.rbac.authorization.k8s.io "greedy" is forbidden: user "{ACCOUNT}"')
    assert (
        'is attempting to grant RBAC permissions not currently held:\n{APIGroups:[""], Resources:["secrets"], Verbs:["get"]}'
        in message
    )
    modest = {**ROLE, "metadata": {"name": "modest"}, "rules": [ROLE["rules"][0]]}
    assert trainer.create(f"{RBAC}/namespaces/research/roles", modest).status_code == 201


def test_a_deleted_service_account_token_stops_working(cluster, admin):
    admin.ok(admin.create("/api/v1/namespaces/research/serviceaccounts", {"metadata": {"name": "short-lived"}}))
    client = Client(cluster, cluster.token_for("research", "short-lived"))
    assert client.send("GET", "/apis").status_code == 200
    admin.ok(admin.send("DELETE", "/api/v1/namespaces/research/serviceaccounts/short-lived"))
    assert client.send("GET", "/apis").status_code == 401
