"""The planner counts what the scheduler checks: a job's `spec.template.resources` (CPU here) against each
node's allocatable less what the pods bound there request. So a node whose CPU another workload's pod holds
is left out of the plan, and kube-scheduler binds every pod, instead of one staying Pending
with `Insufficient cpu`."""

from __future__ import annotations

import pytest

from testcluster.server import UpstreamServer
from tests.operator.helpers import job_doc, wait_for

TWO_NODES = {"pipeline": 2, "tensor": 4, "data": 1}  # on 4-GPU nodes


@pytest.fixture
def apiserver(apiserver: UpstreamServer) -> UpstreamServer:
    """The cluster with kube-scheduler: pods are bound only where their requests fit."""
    apiserver.start_scheduler()
    return apiserver


def cpu_pod(name: str, node: str, cpu: str) -> dict:
    """Another workload's pod, bound, holding CPU and no GPU."""
    container = {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}
    return {"metadata": {"name": name, "namespace": "default"}, "spec": {"nodeName": node, "containers": [container]}}


def test_a_node_whose_cpu_another_pod_holds_is_avoided(cluster, operator):
    cluster.add_nodes(3)  # 96 CPUs each
    cluster.core.create_namespaced_pod("default", cpu_pod("etl", "gpu-000", "64"))
    doc = job_doc(parallelism=TWO_NODES)
    doc["spec"]["template"] = {"resources": {"requests": {"cpu": "48", "memory": "64Gi"}}}
    # kube-scheduler binds no pod whose claim does not exist (the emulator's scheduler never looked at volumes):
    # checkpoints on the node's disk keep this test about CPU.
    doc["spec"]["checkpoint"]["volume"] = {"emptyDir": {}}
    cluster.apply(doc)

    status = wait_for(lambda: cluster.status().get("message", "").startswith("2 pods") and cluster.status())
    assert "gpu-000" not in {entry["node"] for entry in status["placement"]}

    def bound_pods():
        pods = cluster.pods()
        return pods if pods and all(pod["spec"].get("nodeName") for pod in pods) else None

    pods = wait_for(bound_pods, what="every pod bound by the scheduler")
    assert len(pods) == 2
    refused = [c for p in pods for c in p["status"].get("conditions") or [] if c["status"] == "False"]
    assert refused == []


def test_a_missing_checkpoint_claim_is_named_in_the_status_while_the_pods_wait(cluster, operator):
    # kube-scheduler binds no pod whose PersistentVolumeClaim does not exist; the job says which claim, at once,
    # rather than nothing until its start timeout.
    cluster.add_nodes(2)
    cluster.apply(job_doc(parallelism=TWO_NODES))  # checkpoints on the claim `ckpt`, which nobody created
    status = wait_for(
        lambda: 'persistentvolumeclaim "ckpt" not found' in cluster.status().get("message", "") and cluster.status(),
        what="the status naming the missing claim",
    )
    assert status["phase"] == "Pending", status
    assert [p["spec"].get("nodeName") for p in cluster.pods()] == [None, None], "no pod bound"
