"""A gang that cannot start: a pod the scheduler refuses, a container whose image cannot be pulled, or a
planned node deleted from the cluster. The attempt fails (a condition and an Event say why) and the gang
restarts elsewhere, instead of the job waiting forever."""

from __future__ import annotations

import pytest

from tests.operator.conftest import Operator, job_doc, wait_for

UNSCHEDULABLE = {
    "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/17 nodes are available"}
    ]
}
PULL_BACKOFF = {
    "containerStatuses": [
        {
            "name": "trainer",
            "image": "trainer:test",
            "imageID": "",
            "ready": False,
            "restartCount": 0,
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": "pull access denied"}},
        }
    ]
}


@pytest.fixture
def operator_args():
    return [*Operator.ARGS, "--start-timeout", "2"]


def set_status(status):
    def act(cluster, pod):
        cluster.core.patch_namespaced_pod_status(pod, "research", {"status": {"phase": "Pending", **status}})

    return act


def delete_its_node(cluster, pod):
    node = cluster.core.read_namespaced_pod(pod, "research").metadata.labels["paralleljob.io/node"]
    cluster.core.delete_node(node)


@pytest.mark.parametrize(
    ("stall", "reason", "mentions"),
    [
        (set_status(UNSCHEDULABLE), "StartTimeout", "0/17 nodes are available"),
        (set_status(PULL_BACKOFF), "StartTimeout", "ImagePullBackOff"),
        (delete_its_node, "GangRestart", "no longer exists"),
    ],
    ids=["unschedulable", "image-pull-backoff", "planned-node-deleted"],
)
def test_a_gang_that_cannot_start_restarts_with_the_reason(cluster, operator, stall, reason, mentions):
    cluster.add_nodes(17)
    cluster.apply(job_doc())
    wait_for(lambda: cluster.status().get("message", "").startswith("16 pods"), what="placed")
    stall(cluster, "gpt-3")
    status = wait_for(lambda: cluster.status().get("restarts") == 1 and cluster.status(), timeout=20, what="restart")
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", reason)
    assert mentions in ready["message"]
    if reason == "StartTimeout":
        events = [e for e in cluster.events() if e["reason"] == "StartTimeout"]
        assert events and mentions in events[0]["message"]
    wait_for(lambda: {p["metadata"]["labels"]["paralleljob.io/attempt"] for p in cluster.pods()} == {"1"})
