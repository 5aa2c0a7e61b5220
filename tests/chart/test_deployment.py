"""The operator's Deployment: hardened replicas that elect a leader on a Lease (or one replica, replaced with
Recreate, without it), probed through kopf's health endpoint, configured from values, and the metrics Service
and ServiceMonitor in front of it."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.chart.helpers import CHART, NON_DEFAULT_VALUES, RELEASE_NAMESPACE, RenderError, only, render

APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]


def pod_spec(values: dict[str, Any] | None = None) -> dict[str, Any]:
    return only(render(values), "Deployment")["spec"]["template"]["spec"]


def container(values: dict[str, Any] | None = None) -> dict[str, Any]:
    containers = pod_spec(values)["containers"]
    assert len(containers) == 1
    return containers[0]


ROLLING = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}


@pytest.mark.parametrize(
    ("values", "replicas", "strategy", "lease"),
    [
        ({}, 1, ROLLING, "pj-paralleljob-operator"),
        ({"replicas": 2, "leaderElection": {"leaseName": "ml-pj"}}, 2, ROLLING, "ml-pj"),
        ({"leaderElection": {"enabled": False}}, 1, {"type": "Recreate"}, None),
    ],
    ids=["default-elects-a-leader", "two-replicas-share-a-lease", "no-election-recreates-one"],
)
def test_replicas_elect_a_leader_so_that_two_operators_never_act_at_once(values, replicas, strategy, lease) -> None:
    deployment = only(render(values), "Deployment")
    assert deployment["spec"]["replicas"] == replicas
    assert deployment["spec"]["strategy"] == strategy
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    election = [a for a in args if a.startswith(("--leader-elect", "--lease-seconds"))]
    expected = [
        "--leader-elect",
        f"--leader-election-namespace={RELEASE_NAMESPACE}",
        f"--leader-election-lease={lease}",
    ]
    assert election == ([*expected, "--lease-seconds=15"] if lease else [])


def test_two_replicas_without_leader_election_are_refused() -> None:
    with pytest.raises(RenderError, match=r"replicas > 1 needs leaderElection.enabled"):
        render({"replicas": 2, "leaderElection": {"enabled": False}})


def test_the_pod_runs_as_a_numeric_non_root_user_with_the_default_seccomp_profile() -> None:
    security = pod_spec()["securityContext"]
    assert security["runAsNonRoot"] is True
    assert isinstance(security["runAsUser"], int) and security["runAsUser"] > 0
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}


def test_the_container_is_locked_down() -> None:
    security = container()["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert "privileged" not in security


def test_the_read_only_root_filesystem_leaves_a_writable_tmp() -> None:
    mounts = {m["mountPath"]: m["name"] for m in container()["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec()["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]


def test_liveness_goes_to_kopf_health_endpoint_on_the_port_the_operator_listens_on() -> None:
    for values in ({}, NON_DEFAULT_VALUES):
        c = container(values)
        probe = c["livenessProbe"]["httpGet"]
        port = next(p["containerPort"] for p in c["ports"] if p["name"] == probe["port"])
        assert f"--liveness=http://0.0.0.0:{port}{probe['path']}" in c["args"]


def test_resources_have_requests_and_a_memory_limit() -> None:
    resources = container()["resources"]
    assert set(resources["requests"]) == {"cpu", "memory"}
    assert "memory" in resources["limits"]


def test_the_image_defaults_to_the_app_version_and_a_digest_pins_it() -> None:
    assert container()["image"] == f"ghcr.io/paralleljob/operator:{APP_VERSION}"
    assert container(NON_DEFAULT_VALUES)["image"] == (
        "registry.example.com/ml/paralleljob-operator@sha256:" + "ab" * 32
    )


def test_all_namespaces_by_default_and_one_flag_per_listed_namespace() -> None:
    assert "--all-namespaces" in container()["args"]
    args = container(NON_DEFAULT_VALUES)["args"]
    assert "--all-namespaces" not in args
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=ml-team-a", "--namespace=ml-team-b"]


def test_job_defaults_reach_the_operator_as_flags() -> None:
    args = container(NON_DEFAULT_VALUES)["args"]
    assert "--trainer-image=registry.example.com/ml/trainer:2026.11" in args
    assert "--default-fabric=infiniband" in args
    assert [a for a in args if a.startswith("--default-nccl-env")] == [
        "--default-nccl-env=NCCL_DEBUG=INFO",
        "--default-nccl-env=NCCL_IB_HCA==mlx5_0,mlx5_1",
    ]
    defaults = container()["args"]
    assert f"--trainer-image=ghcr.io/paralleljob/trainer:{APP_VERSION}" in defaults
    assert "--default-fabric=auto" in defaults
    assert not any(a.startswith("--default-nccl-env") for a in defaults)


def test_priority_class_scheduling_and_pod_metadata_come_from_values() -> None:
    spec = pod_spec(NON_DEFAULT_VALUES)
    assert spec["priorityClassName"] == "platform-critical"
    assert spec["nodeSelector"] == NON_DEFAULT_VALUES["nodeSelector"]
    assert spec["tolerations"] == NON_DEFAULT_VALUES["tolerations"]
    assert spec["affinity"] == NON_DEFAULT_VALUES["affinity"]
    assert spec["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert "priorityClassName" not in pod_spec()
    template = only(render(NON_DEFAULT_VALUES), "Deployment")["spec"]["template"]
    assert template["metadata"]["labels"]["team"] == "ml-platform"
    assert template["metadata"]["annotations"] == {"example.com/owner": "ml-platform"}


def test_the_metrics_service_selects_the_operator_pod_and_targets_the_metrics_port() -> None:
    objects = render(NON_DEFAULT_VALUES)
    service = only(objects, "Service", "-metrics")
    pod_labels = only(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9464, "targetPort": "metrics", "protocol": "TCP"}]
    assert "--metrics-port=9464" in container(NON_DEFAULT_VALUES)["args"]


def test_the_service_monitor_is_off_by_default_and_scrapes_the_metrics_service_when_on() -> None:
    assert [o for o in render() if o["kind"] == "ServiceMonitor"] == []
    objects = render(NON_DEFAULT_VALUES)
    monitor = only(objects, "ServiceMonitor")
    service = only(objects, "Service", "-metrics")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "15s", "scrapeTimeout": "5s"}
    ]


def test_the_service_account_is_the_one_the_pod_uses() -> None:
    objects = render(NON_DEFAULT_VALUES)
    assert only(objects, "ServiceAccount")["metadata"]["name"] == "pj-operator"
    assert pod_spec(NON_DEFAULT_VALUES)["serviceAccountName"] == "pj-operator"
