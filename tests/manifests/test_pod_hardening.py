"""Every pod runs hardened by default: non-root as the trainer's uid with volumes group-owned by it, no privilege
escalation, every capability dropped (IPC_LOCK only with RDMA devices), the runtime's seccomp profile, a
read-only root with writable scratch folders; the administrator's flags relax it; the operator's labels win."""

from __future__ import annotations

import dataclasses

import pytest

from paralleljob.manifests import children, labels, security
from tests.manifests.helpers import make_node, make_plan, resolve

OWNER = {"metadata": {"name": "gpt", "namespace": "research", "uid": "u-1"}}
IB_NODES = [make_node(f"node-{i}", {}, {"nvidia.com/gpu": "4", "rdma/ib": "1"}) for i in range(4)]
PLAIN_NODES = [make_node(f"node-{i}", {}, {"nvidia.com/gpu": "4"}) for i in range(4)]


def pods_of(nodes=PLAIN_NODES, pod_security=security.DEFAULT, resolved=None):
    resolved = resolved or resolve()
    plan = make_plan()
    made = children.build_attempt(OWNER, resolved, plan, nodes, attempt=0)
    placed = plan.node_names()
    return children.build_children(
        OWNER, resolved, made.config_map, placed, image="t:1", pod_security=pod_security
    ).pods


def test_every_pod_runs_as_the_trainer_uid_with_volumes_it_can_write():
    for pod in pods_of():
        context = pod["spec"]["securityContext"]
        assert context == {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "runAsGroup": 10001,
            "fsGroup": 10001,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        }


def test_the_container_has_no_capabilities_no_escalation_and_a_read_only_root_with_scratch_folders():
    pod = pods_of()[1]
    container = pod["spec"]["containers"][0]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    for path in ("/tmp", "/home/trainer"):
        assert volumes[mounts[path]] == {"name": mounts[path], "emptyDir": {}}


@pytest.mark.parametrize(
    ("nodes", "pod_security", "added"),
    [
        (IB_NODES, security.DEFAULT, ["IPC_LOCK"]),
        (PLAIN_NODES, security.DEFAULT, None),
        (IB_NODES, security.PodSecurity(rdma_ipc_lock=False), None),
    ],
    ids=["rdma-devices", "tcp", "rdma-with-ipc-lock-turned-off"],
)
def test_ipc_lock_is_added_only_for_pods_that_use_rdma_devices(nodes, pod_security, added):
    capabilities = pods_of(nodes, pod_security)[0]["spec"]["containers"][0]["securityContext"]["capabilities"]
    assert capabilities.get("add") == added
    assert capabilities["drop"] == ["ALL"]


def test_an_administrator_relaxes_the_root_filesystem_and_picks_the_uid():
    relaxed = security.PodSecurity(run_as_user=2000, run_as_group=3000, fs_group=4000, read_only_root_filesystem=False)
    pod = pods_of(pod_security=relaxed)[0]
    context = pod["spec"]["securityContext"]
    assert (context["runAsUser"], context["runAsGroup"], context["fsGroup"]) == (2000, 3000, 4000)
    container = pod["spec"]["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is False
    assert not [m for m in container["volumeMounts"] if m["mountPath"] in ("/tmp", "/home/trainer")]


def test_the_operator_labels_win_over_template_labels():
    # The API refuses such labels (tests/api/test_policy.py); the pods are built so even a job that slipped
    # past it could not blind the operator to its pods or take another job's name.
    valid = resolve()
    template = dataclasses.replace(
        valid.spec.template, labels={labels.JOB_LABEL: "other", labels.MANAGED_BY_LABEL: "x"}
    )
    forged = dataclasses.replace(
        valid, job=dataclasses.replace(valid.job, spec=dataclasses.replace(valid.spec, template=template))
    )
    for pod in pods_of(resolved=forged):
        assert pod["metadata"]["labels"][labels.JOB_LABEL] == "gpt"
        assert pod["metadata"]["labels"][labels.MANAGED_BY_LABEL] == labels.MANAGED_BY
