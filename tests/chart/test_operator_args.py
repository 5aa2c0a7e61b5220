"""The Deployment's arguments are ones `paralleljob operator` accepts, and mean what the values say: parsed here
by the operator's own argument parser, so a renamed flag fails this test rather than the operator's pod."""

from __future__ import annotations

from typing import Any

from paralleljob import cli
from paralleljob.api import policy
from paralleljob.commands import operator as operator_command
from paralleljob.manifests import security
from tests.chart.helpers import NON_DEFAULT_VALUES, only, render

WITHOUT_NCCL_DEFAULTS = {**NON_DEFAULT_VALUES, "jobDefaults": {**NON_DEFAULT_VALUES["jobDefaults"], "ncclEnv": {}}}


def parse_rendered_args(values: dict[str, Any]) -> Any:
    deployment = only(render(values), "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    # The image's ENTRYPOINT is ["paralleljob", "operator"]; the chart supplies the rest.
    return cli.build_parser().parse_args(["operator", *container["args"]])


def test_the_default_arguments_parse_and_watch_every_namespace() -> None:
    args = parse_rendered_args({})
    assert args.all_namespaces is True and args.namespaces is None
    assert args.liveness == "http://0.0.0.0:8080/healthz"
    assert (args.metrics_port, args.log_format, args.log_level) == (9090, "json", "info")
    assert args.default_fabric == "auto"
    assert args.trainer_image.startswith("ghcr.io/paralleljob/trainer:")


def test_non_default_arguments_parse_and_carry_the_values() -> None:
    args = parse_rendered_args(WITHOUT_NCCL_DEFAULTS)
    assert args.namespaces == ["ml-team-a", "ml-team-b"] and args.all_namespaces is False
    assert args.liveness == "http://0.0.0.0:8181/healthz"
    assert (args.metrics_port, args.log_format, args.log_level) == (9464, "plain", "debug")
    assert args.default_fabric == "infiniband"
    assert args.trainer_image == "registry.example.com/ml/trainer:2026.11"


def test_the_charts_default_admission_lock_is_the_binarys_default() -> None:
    binary = cli.build_parser().parse_args(["operator"])
    assert parse_rendered_args({}).admission_lock == binary.admission_lock == operator_command.DEFAULT_ADMISSION_LOCK


def test_default_nccl_env_reaches_the_operator() -> None:
    args = parse_rendered_args(NON_DEFAULT_VALUES)
    assert args.default_nccl_env == [("NCCL_DEBUG", "INFO"), ("NCCL_IB_HCA", "=mlx5_0,mlx5_1")]


def test_the_admission_policy_and_pod_security_reach_the_operator() -> None:
    defaults, custom = parse_rendered_args({}), parse_rendered_args(NON_DEFAULT_VALUES)
    assert reconcile_settings(defaults) == (policy.AdmissionPolicy(), security.PodSecurity())
    assert reconcile_settings(custom) == (
        policy.AdmissionPolicy(
            volume_types=("persistentVolumeClaim", "emptyDir", "hostPath"),
            service_accounts=("default", "trainer"),
            forbidden_env=("LD_*", "PYTHONPATH"),
            priority_classes=("research-low",),
            metadata_domains=("app.kubernetes.io", "example.com"),
        ),
        security.PodSecurity(2000, 2001, 2002, read_only_root_filesystem=False, rdma_ipc_lock=False),
    )


def reconcile_settings(args: Any) -> tuple[policy.AdmissionPolicy, security.PodSecurity]:
    return operator_command.policy_of(args), operator_command.pod_security_of(args)


RECOVERY = {
    "startTimeoutSeconds": 900,
    "containerCreatingTimeoutSeconds": 2400,
    "imagePullRetries": 5,
    "notReadyGraceSeconds": 45,
    "forceDeleteAfterSeconds": 30,
    "restartHoldSeconds": 0,
    "resyncPeriodSeconds": 20,
}
RECOVERY_FLAGS = (
    "start_timeout",
    "container_creating_timeout",
    "image_pull_retries",
    "not_ready_grace",
    "force_delete_after",
    "restart_hold",
    "resync_period",
)


def test_the_charts_recovery_defaults_are_the_binarys_and_its_values_reach_the_operator() -> None:
    binary = cli.build_parser().parse_args(["operator"])
    defaults = parse_rendered_args({})
    assert [getattr(defaults, flag) for flag in RECOVERY_FLAGS] == [getattr(binary, flag) for flag in RECOVERY_FLAGS]
    custom = parse_rendered_args({"recovery": RECOVERY})
    assert [getattr(custom, flag) for flag in RECOVERY_FLAGS] == list(RECOVERY.values())


def test_the_lost_node_lease_and_the_slow_node_label_reach_the_operator() -> None:
    defaults = parse_rendered_args({})
    assert (defaults.lost_node_lease, defaults.not_ready_grace, defaults.slow_node_label) == (20.0, 300.0, "")
    values = {"recovery": {"lostNodeLeaseSeconds": 30}, "slowNodeLabel": {"enabled": True, "key": "example.com/slow"}}
    args = parse_rendered_args(values)
    assert (args.lost_node_lease, args.slow_node_label) == (30.0, "example.com/slow")
