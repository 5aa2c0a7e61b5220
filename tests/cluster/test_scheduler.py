"""The strict cluster's scheduler binds a pending pod to a node that fits, as default-scheduler would, or marks it
PodScheduled=False, reason Unschedulable, with the real `0/N nodes are available: ...` message."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.apiserver import ClusterThread
from tests.cluster.conftest import Client
from tests.cluster.scheduler import Scheduler

PODS = "/api/v1/namespaces/research/pods"


@pytest.fixture
def scheduled(tmp_path: Path) -> Iterator[Client]:
    thread = ClusterThread(tmp_path, components=[Scheduler]).start()
    client = Client(thread, thread.server.tokens.admin_token)
    client.ok(client.create("/api/v1/namespaces", {"metadata": {"name": "research"}}))
    yield client
    thread.stop()


def node(name: str, gpus: int = 8, *, ready: bool = True, **extra: Any) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name, **extra.pop("labels", {})}
    status = {
        "allocatable": {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": str(gpus), **extra.pop("allocatable", {})},
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": extra,
        "status": status,
    }


def pod(name: str, gpus: int = 8, **spec: Any) -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": str(gpus), **spec.pop("limits", {})}}
    container = {"name": "trainer", "image": "trainer:1", "resources": resources}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {"containers": [container], **spec}}


def pinned(node_name: str) -> dict[str, Any]:
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node_name]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def outcome(client: Client, name: str) -> str:
    """The node the pod was bound to, or its PodScheduled=False message."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = client.ok(client.send("GET", f"{PODS}/{name}"))
        if found["spec"].get("nodeName"):
            return str(found["spec"]["nodeName"])
        for condition in (found.get("status") or {}).get("conditions") or []:
            if condition["type"] == "PodScheduled" and condition["status"] == "False":
                assert condition["reason"] == "Unschedulable"
                return str(condition["message"])
        time.sleep(0.05)
    raise AssertionError(f"pod {name} was neither bound nor marked unschedulable")


TAINT = {"key": "dedicated", "value": "inference", "effect": "NoSchedule"}
CASES = {
    "fits-the-only-node": ([node("a")], pod("p"), "a"),
    "pinned-by-affinity": ([node("a"), node("b")], pod("p", affinity=pinned("b")), "b"),
    "node-selector": ([node("a"), node("b", labels={"pool": "train"})], pod("p", nodeSelector={"pool": "train"}), "b"),
    "too-few-gpus": (
        [node("a", 4), node("b", 4)],
        pod("p"),
        "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: 0/2 nodes are available: 2 No preemption "
        "victims found for incoming pod.",
    ),
    "an-extended-resource-the-node-lacks": (
        [node("a")],
        pod("p", limits={"rdma/ib": "1"}),
        "0/1 nodes are available: 1 Insufficient rdma/ib. preemption: 0/1 nodes are available: 1 No preemption "
        "victims found for incoming pod.",
    ),
    "an-extended-resource-the-node-has": (
        [node("a", allocatable={"vpc.amazonaws.com/efa": "32"})],
        pod("p", limits={"vpc.amazonaws.com/efa": "32"}),
        "a",
    ),
    "cpu-and-memory": (
        [node("a")],
        pod("p", limits={"cpu": "200", "memory": "2Ti"}),
        "0/1 nodes are available: 1 Insufficient cpu, 1 Insufficient memory. preemption: 0/1 nodes are available: 1 "
        "No preemption victims found for incoming pod.",
    ),
    "untolerated-taint": (
        [node("a", taints=[TAINT])],
        pod("p"),
        "0/1 nodes are available: 1 node(s) had untolerated taint {dedicated: inference}. preemption: 0/1 nodes are "
        "available: 1 Preemption is not helpful for scheduling.",
    ),
    "tolerated-taint": (
        [node("a", taints=[TAINT])],
        pod("p", tolerations=[{"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoSchedule"}]),
        "a",
    ),
    "cordoned-and-not-ready-and-elsewhere": (
        [node("a", unschedulable=True), node("b", ready=False), node("c"), node("d")],
        pod("p", affinity=pinned("x")),
        "0/4 nodes are available: 1 node(s) had untolerated taint {node.kubernetes.io/not-ready: }, 1 node(s) were "
        "unschedulable, 2 node(s) didn't match Pod's node affinity/selector. preemption: 0/4 nodes are available: 4 "
        "Preemption is not helpful for scheduling.",
    ),
}


@pytest.mark.parametrize(("nodes", "the_pod", "expected"), CASES.values(), ids=CASES.keys())
def test_a_pending_pod_is_bound_where_it_fits_or_told_why_not(scheduled, nodes, the_pod, expected):
    for each in nodes:
        scheduled.ok(scheduled.create("/api/v1/nodes", each))
    scheduled.ok(scheduled.create(PODS, the_pod))
    assert outcome(scheduled, the_pod["metadata"]["name"]) == expected


def test_pods_are_bound_first_come_first_served_against_what_bound_pods_request(scheduled):
    scheduled.ok(scheduled.create("/api/v1/nodes", node("a", 8)))
    for name in ("first", "second", "third"):
        scheduled.ok(scheduled.create(PODS, pod(name, 4)))
    assert [outcome(scheduled, name) for name in ("first", "second")] == ["a", "a"]
    assert outcome(scheduled, "third").startswith("0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")
    # A finished pod frees what it held: the waiting pod is bound.
    scheduled.ok(scheduled.patch(f"{PODS}/first/status", {"status": {"phase": "Succeeded"}}))
    deadline = time.monotonic() + 30
    while outcome(scheduled, "third") != "a" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert outcome(scheduled, "third") == "a"
