"""A NotReady node: a blip shorter than the grace period costs nothing; the only pod of a single-node gang is
never force-deleted while its node may still run it."""

from __future__ import annotations

import time

import pytest

from tests.operator.helpers import job_doc, wait_for

ONE_NODE = {"parallelism": {"pipeline": 1, "tensor": 4, "data": 1}, "gpusPerNode": 4}


@pytest.fixture
def operator_args():
    return ["--force-delete-after", "1", "--not-ready-grace", "4"]


def running_gang_with_a_not_ready_node(cluster, nodes: int) -> str:
    """The 16-node job Running on `nodes` nodes, then the node of one of its pods NotReady; that node."""
    cluster.add_nodes(nodes)
    cluster.apply(job_doc())
    cluster.start_running()
    node = cluster.pods()[3]["metadata"]["labels"]["paralleljob.io/node"]
    cluster.set_node_ready(node, False)
    return node


def test_a_not_ready_blip_shorter_than_the_grace_period_keeps_the_gang(cluster, operator):
    node = running_gang_with_a_not_ready_node(cluster, 16)
    time.sleep(2)
    cluster.set_node_ready(node, True)
    time.sleep(4)
    assert cluster.status().get("restarts", 0) == 0
    assert cluster.status()["phase"] == "Running"


def test_a_node_not_ready_past_the_grace_period_restarts_the_gang(cluster, operator):
    node = running_gang_with_a_not_ready_node(cluster, 17)
    status = wait_for(lambda: cluster.status().get("restarts") == 1 and cluster.status(), timeout=30, what="restart")
    assert "NotReady for" in status["message"]
    assert node in status["excludedNodes"]


def test_the_only_pod_of_a_single_node_gang_is_not_force_deleted_until_its_node_is_out_of_service(
    cluster, operator, apiserver
):
    cluster.add_nodes(2)
    cluster.apply(job_doc(**ONE_NODE))
    wait_for(lambda: len(cluster.pods()) == 1, what="1 pod")
    cluster.bind_all()
    wait_for(lambda: cluster.status().get("phase") == "Running", what="Running")
    node = cluster.pods()[0]["metadata"]["labels"]["paralleljob.io/node"]
    cluster.set_node_ready(node, False)
    wait_for(lambda: cluster.status().get("restarts") == 1, timeout=30, what="restart")
    stuck = wait_for(lambda: "stuck Terminating" in cluster.status().get("message", ""), timeout=20, what="message")
    assert stuck
    time.sleep(3)  # well past --force-delete-after
    assert [p["metadata"]["labels"]["paralleljob.io/attempt"] for p in cluster.pods()] == ["0"]
    assert [e for e in cluster.events() if e["reason"] == "StuckTerminating"]
    taint = {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}
    cluster.core.patch_node(node, {"spec": {"taints": [taint]}})
    wait_for(
        lambda: [p["metadata"]["labels"]["paralleljob.io/attempt"] for p in cluster.pods()] == ["1"],
        timeout=30,
        what="the next attempt, after the force-delete",
    )
