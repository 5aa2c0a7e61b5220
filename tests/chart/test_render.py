"""`helm template` output is valid Kubernetes: every built-in object (the CRD included) passes strict schema
validation for the oldest and the newest Kubernetes the chart supports."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from tests.chart.helpers import NON_DEFAULT_VALUES, render

# Chart.yaml's kubeVersion floor, and the kubectl the tools script installs.
KUBERNETES_VERSIONS = ["1.29.0", "1.34.0"]
# Kinds served by CRDs of other projects; kubernetes-validate has no schema for them (checked in test_deployment.py).
FOREIGN_KINDS = {"ServiceMonitor", "PrometheusRule"}
# Kinds the chart renders only when asked (policy.validatingAdmissionPolicy), for clusters that serve them.
NEWER_KINDS = {"ValidatingAdmissionPolicy": "1.30.0", "ValidatingAdmissionPolicyBinding": "1.30.0"}

CASES = {"default-values": {}, "non-default-values": NON_DEFAULT_VALUES}


def validate_strictly(obj: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("case", CASES)
def test_every_rendered_object_is_valid_kubernetes(case: str, version: str) -> None:
    objects = render(CASES[case])
    errors = []
    for obj in objects:
        if obj["kind"] in FOREIGN_KINDS or _older(version, NEWER_KINDS.get(obj["kind"], version)):
            continue
        try:
            validate_strictly(obj, version)
        except kubernetes_validate.ValidationError as error:
            errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {error.message} at {list(error.path)}")
    assert errors == []


@pytest.mark.parametrize("case", CASES)
def test_the_expected_kinds_are_rendered(case: str) -> None:
    kinds = sorted(obj["kind"] for obj in render(CASES[case]))
    if case == "default-values":
        assert kinds == sorted(
            [
                "CustomResourceDefinition",
                "ServiceAccount",
                "ClusterRole",
                "ClusterRole",
                "ClusterRoleBinding",
                "ClusterRoleBinding",
                "Role",
                "Role",
                "Role",
                "RoleBinding",
                "RoleBinding",
                "RoleBinding",
                "Deployment",
                "Service",
                "ConfigMap",
            ]
        )
    else:
        # Two watched namespaces: a Role and a RoleBinding in each (and the leader election's in the release
        # namespace, the admission lock's in its own, the node Leases' in kube-node-lease), and the ServiceMonitor,
        # the dashboard and the rules are on.
        assert kinds == sorted(
            [
                "CustomResourceDefinition",
                "ServiceAccount",
                "ClusterRole",
                "ClusterRoleBinding",
                "Role",
                "Role",
                "Role",
                "Role",
                "Role",
                "RoleBinding",
                "RoleBinding",
                "RoleBinding",
                "RoleBinding",
                "RoleBinding",
                "Deployment",
                "Service",
                "ServiceMonitor",
                "ConfigMap",
                "PrometheusRule",
                "ValidatingAdmissionPolicy",
                "ValidatingAdmissionPolicyBinding",
            ]
        )


def _older(version: str, than: str) -> bool:
    return tuple(map(int, version.split("."))) < tuple(map(int, than.split(".")))


def test_strict_validation_rejects_an_unknown_field() -> None:
    """The validator used above does fail on a typo, so its silence means something."""
    deployment = copy.deepcopy(next(o for o in render() if o["kind"] == "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFileSystem"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_strictly(deployment, KUBERNETES_VERSIONS[-1])


def test_every_namespaced_object_is_in_the_release_namespace_or_a_watched_one() -> None:
    objects = render(NON_DEFAULT_VALUES, namespace="platform")
    namespaces = {
        o["metadata"].get("namespace")
        for o in objects
        if o["kind"] not in {"CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", *NEWER_KINDS}
    }
    # ... or the dashboard's, which goes where the Grafana sidecar looks (grafanaDashboard.namespace), or the
    # Role that reads the node Leases, in kube-node-lease where the kubelets keep them.
    assert namespaces == {"platform", "ml-team-a", "ml-team-b", "monitoring", "kube-node-lease"}
