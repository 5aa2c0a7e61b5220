"""A gang that cannot start: a pod the scheduler refuses, a container whose image fails to pull again and
again, or a planned node deleted from the cluster. The attempt fails (a condition and an Event say why), the
stalled pod's node goes into status.excludedNodes, and the gang restarts on other nodes, instead of the job
waiting forever or being re-planned onto the same node."""

from __future__ import annotations

import pytest

from tests.operator.helpers import Operator, job_doc, wait_for

UNSCHEDULABLE = {
    "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/17 nodes are available"}
    ]
}


def waiting(reason, message="pull access denied"):
    container = {"name": "trainer", "image": "trainer:test", "imageID": "", "ready": False, "restartCount": 0}
    return {"containerStatuses": [{**container, "state": {"waiting": {"reason": reason, "message": message}}}]}


@pytest.fixture
def operator_args():
    return [*Operator.ARGS, "--start-timeout", "2"]


def set_status(*statuses):
    def act(cluster, pod):
        for status in statuses:
            cluster.core.patch_namespaced_pod_status(pod, "research", {"status": {"phase": "Pending", **status}})

    return act


# The kubelet's retries: each ErrImagePull is one failed pull, ImagePullBackOff the wait before the next.
THREE_FAILED_PULLS = [waiting(reason) for reason in ("ErrImagePull", "ImagePullBackOff") * 2 + ("ErrImagePull",)]


def delete_its_node(cluster, pod):
    node = cluster.core.read_namespaced_pod(pod, "research").metadata.labels["paralleljob.io/node"]
    cluster.core.delete_node(node)


@pytest.mark.parametrize(
    ("stall", "reason", "mentions"),
    [
        (set_status(UNSCHEDULABLE), "StartTimeout", "0/17 nodes are available"),
        (set_status(*THREE_FAILED_PULLS), "StartTimeout", "the image pull failed 3 times"),
        (delete_its_node, "GangRestart", "no longer exists"),
    ],
    ids=["unschedulable", "image-pull-failed-three-times", "planned-node-deleted"],
)
def test_a_gang_that_cannot_start_restarts_with_the_reason(cluster, operator, stall, reason, mentions):
    cluster.add_nodes(17)
    cluster.apply(job_doc())
    wait_for(lambda: cluster.status().get("message", "").startswith("16 pods"), what="placed")
    node = cluster.core.read_namespaced_pod("gpt-3", "research").metadata.labels["paralleljob.io/node"]
    stall(cluster, "gpt-3")
    status = wait_for(lambda: cluster.status().get("restarts") == 1 and cluster.status(), timeout=20, what="restart")
    assert status["excludedNodes"] == [node]
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", reason)
    assert mentions in ready["message"]
    if reason == "StartTimeout":
        events = [e for e in cluster.events() if e["reason"] == "StartTimeout"]
        assert events and mentions in events[0]["message"]
    wait_for(lambda: {p["metadata"]["labels"]["paralleljob.io/attempt"] for p in cluster.pods()} == {"1"})
    wait_for(lambda: len(cluster.status().get("placement") or []) == 16, what="the next attempt placed")
    assert node not in {entry["node"] for entry in cluster.status()["placement"]}
