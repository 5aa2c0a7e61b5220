"""The strict API server refuses what kube-apiserver refuses on create, update and patch, with the same status
code, reason and message: names per kind, label and annotation syntax, size limits, immutable fields, the
OpenAPI schemas of core kinds, stale resourceVersions, missing namespaces and ServiceAccounts."""

from __future__ import annotations

import copy
import datetime
import email.utils
from typing import Any

import pytest

from tests.cluster import admission
from tests.cluster.conftest import Client, refusal

PODS = "/api/v1/namespaces/research/pods"
POD_YAML: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "trainer", "labels": {"app": "gpt"}},
    "spec": {"containers": [{"name": "trainer", "image": "trainer:1", "command": ["python", "-m", "train"]}]},
}


def pod(**edits: Any) -> dict[str, Any]:
    doc = copy.deepcopy(POD_YAML)
    for path, value in edits.items():
        *parents, last = path.split("__")
        node = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[last] = value
    return doc


LONG_VALUE = "v" * 64
CREATES = {
    "pod-name-uppercase": (
        PODS,
        pod(metadata={"name": "Trainer-0"}),
        422,
        f'Pod "Trainer-0" is invalid: metadata.name: Invalid value: "Trainer-0": {admission.SUBDOMAIN_MESSAGE}',
    ),
    "pod-name-too-long": (
        PODS,
        pod(metadata={"name": "a" * 254}),
        422,
        f'metadata.name: Invalid value: "{"a" * 254}": must be no more than 253 characters',
    ),
    "service-name-starts-with-a-digit": (
        "/api/v1/namespaces/research/services",
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "0gpt"}, "spec": {"clusterIP": "None"}},
        422,
        f'Service "0gpt" is invalid: metadata.name: Invalid value: "0gpt": {admission.DNS1035_MESSAGE}',
    ),
    "namespace-name-with-a-dot": (
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team.a"}},
        422,
        f'Namespace "team.a" is invalid: metadata.name: Invalid value: "team.a": {admission.LABEL_MESSAGE}',
    ),
    "label-value-over-63-characters": (
        PODS,
        pod(metadata={"name": "p", "labels": {"paralleljob.io/job": LONG_VALUE}}),
        422,
        f'Pod "p" is invalid: metadata.labels: Invalid value: "{LONG_VALUE}": must be no more than 63 characters',
    ),
    "label-key-with-a-bad-prefix": (
        PODS,
        pod(metadata={"name": "p", "labels": {"Paralleljob.IO/job": "gpt"}}),
        422,
        f'metadata.labels: Invalid value: "Paralleljob.IO/job": prefix part {admission.SUBDOMAIN_MESSAGE}',
    ),
    "annotations-over-256-KiB": (
        PODS,
        pod(metadata={"name": "p", "annotations": {"note": "x" * (256 * 1024)}}),
        422,
        'Pod "p" is invalid: metadata.annotations: Too long: must have at most 262144 bytes',
    ),
    "configmap-over-1-MiB": (
        "/api/v1/namespaces/research/configmaps",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "plan"}, "data": {"plan.json": "x" * (1 << 20)}},
        422,
        'ConfigMap "plan" is invalid: []: Too long: must have at most 1048576 bytes',
    ),
    "configmap-key-with-a-slash": (
        "/api/v1/namespaces/research/configmaps",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "plan"}, "data": {"a/b": "x"}},
        422,
        f'ConfigMap "plan" is invalid: data[a/b]: Invalid value: "a/b": {admission.CONFIG_KEY_MESSAGE}',
    ),
    "request-over-3-MiB": (
        "/api/v1/namespaces/research/configmaps",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big"}, "binaryData": {"a": "x" * (3 << 20)}},
        413,
        "Request entity too large: limit is 3145728",
    ),
    "container-without-a-name": (
        PODS,
        pod(spec={"containers": [{"image": "trainer:1"}]}),
        422,
        'Pod "trainer" is invalid: spec.containers[0].name: Required value',
    ),
    "image-of-the-wrong-type": (
        PODS,
        pod(spec={"containers": [{"name": "t", "image": 3}]}),
        400,
        'Pod in version "v1" cannot be handled as a Pod: json: cannot unmarshal number into Go struct field '
        "spec.containers[0].image of type string",
    ),
    "namespace-that-does-not-exist": (
        "/api/v1/namespaces/absent/pods",
        pod(),
        404,
        'namespaces "absent" not found',
    ),
    "service-account-that-does-not-exist": (
        PODS,
        pod(spec={"serviceAccountName": "gpt-progress", "containers": POD_YAML["spec"]["containers"]}),
        403,
        'pods "trainer" is forbidden: error looking up service account research/gpt-progress: '
        'serviceaccount "gpt-progress" not found',
    ),
}


@pytest.mark.parametrize(("path", "body", "code", "message"), CREATES.values(), ids=CREATES.keys())
def test_a_create_the_api_refuses_is_refused_with_its_code_and_message(admin: Client, path, body, code, message):
    got_code, _, got_message = refusal(admin.create(path, body))
    assert got_code == code
    assert message in got_message


def test_an_unknown_field_is_refused_under_strict_field_validation_and_pruned_with_a_warning_otherwise(admin):
    body = pod(metadata={"name": "unknown-field"})
    body["spec"]["containers"][0]["gpus"] = 8
    assert refusal(admin.create(PODS, body, fieldValidation="Strict")) == (
        400,
        "BadRequest",
        'strict decoding error: unknown field "spec.containers[0].gpus"',
    )
    response = admin.create(PODS, body)
    assert response.status_code == 201
    assert "gpus" not in response.json()["spec"]["containers"][0]
    assert response.headers["Warning"] == '299 - "unknown field "spec.containers[0].gpus""'


def test_a_second_create_of_the_same_name_is_already_exists(admin):
    admin.ok(admin.create(PODS, pod(metadata={"name": "twice"})))
    assert refusal(admin.create(PODS, pod(metadata={"name": "twice"}))) == (
        409,
        "AlreadyExists",
        'pods "twice" already exists',
    )


@pytest.mark.parametrize(
    ("path", "message"),
    [
        (f"{PODS}/nobody", 'pods "nobody" not found'),
        (
            "/apis/coordination.k8s.io/v1/namespaces/research/leases/nobody",
            'leases.coordination.k8s.io "nobody" not found',
        ),
    ],
    ids=["core", "group"],
)
def test_reading_a_missing_object_is_not_found_with_the_servers_date(cluster, admin, path, message):
    cluster.server.clock_offset = -3600.0  # an API server an hour behind this machine
    try:
        response = admin.send("GET", path)
    finally:
        cluster.server.clock_offset = 0.0
    assert refusal(response) == (404, "NotFound", message)
    said = email.utils.parsedate_to_datetime(response.headers["Date"])
    assert abs((datetime.datetime.now(datetime.UTC) - said).total_seconds() - 3600) < 5


@pytest.fixture(scope="module")
def running_pod(admin: Client) -> dict[str, Any]:
    return admin.ok(admin.create(PODS, pod(metadata={"name": "running"})))


UPDATES = {
    "pod-command": ({"spec": {"containers": [{"name": "trainer", "image": "trainer:1", "command": ["sh"]}]}}, 422),
    "pod-node-name": ({"spec": {"nodeName": "gpu-001"}}, 422),
    "pod-volumes": ({"spec": {"volumes": [{"name": "shm", "emptyDir": {}}]}}, 422),
}


@pytest.mark.parametrize(("patch", "code"), UPDATES.values(), ids=UPDATES.keys())
def test_a_pod_spec_is_immutable_but_for_images_and_deadlines(admin, running_pod, patch, code):
    got = refusal(admin.patch(f"{PODS}/running", patch))
    assert got == (code, "Invalid", f'Pod "running" is invalid: spec: Forbidden: {admission.POD_UPDATABLE}')


def test_a_pod_image_and_labels_may_change(admin, running_pod):
    patch = {
        "metadata": {"labels": {"app": "other"}},
        "spec": {"containers": [{"name": "trainer", "image": "trainer:2", "command": ["python", "-m", "train"]}]},
    }
    updated = admin.ok(admin.patch(f"{PODS}/running", patch))
    assert updated["spec"]["containers"][0]["image"] == "trainer:2"


def test_a_service_cluster_ip_is_immutable(admin):
    services = "/api/v1/namespaces/research/services"
    admin.ok(
        admin.create(
            services,
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "gpt"}, "spec": {"clusterIP": "None"}},
        )
    )
    assert refusal(admin.patch(f"{services}/gpt", {"spec": {"clusterIP": "10.0.0.7"}})) == (
        422,
        "Invalid",
        'Service "gpt" is invalid: spec.clusterIP: Invalid value: "10.0.0.7": field is immutable',
    )


@pytest.mark.parametrize("method", ["PATCH", "PUT"])
def test_a_write_with_a_stale_resource_version_is_a_conflict(admin, method):
    configmaps = "/api/v1/namespaces/research/configmaps"
    name = f"stale-{method.lower()}"
    created = admin.ok(
        admin.create(
            configmaps, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"a": "1"}}
        )
    )
    admin.ok(admin.patch(f"{configmaps}/{name}", {"data": {"a": "2"}}))
    stale = {**created, "data": {"a": "3"}}
    response = admin.send(method, f"{configmaps}/{name}", stale)
    assert refusal(response) == (
        409,
        "Conflict",
        f'Operation cannot be fulfilled on configmaps "{name}": the object has been modified; please apply your '
        "changes to the latest version and try again",
    )


def test_spec_node_name_is_set_through_the_binding_subresource_once(admin):
    admin.ok(admin.create(PODS, pod(metadata={"name": "bound"})))
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "bound"},
        "target": {"kind": "Node", "name": "gpu-001"},
    }
    assert admin.create(f"{PODS}/bound/binding", binding).status_code == 201
    assert admin.ok(admin.send("GET", f"{PODS}/bound"))["spec"]["nodeName"] == "gpu-001"
    assert refusal(admin.create(f"{PODS}/bound/binding", binding))[:2] == (409, "Conflict")
