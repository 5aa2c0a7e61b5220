"""A node declared shut down (Kubernetes' non-graceful node shutdown: NotReady and tainted
node.kubernetes.io/out-of-service) is lost at once, whatever the NotReady grace: the pod garbage collector
force-deletes its pods straight away, and a gang with a hot spare must move that node rank to the spare, not take
the vanished pod for a broken gang and restart every pod (the 3-node upstream bench did: bench/upstream_spare_node.py
--then out-of-service)."""

from __future__ import annotations

import contextlib

import kubernetes
import pytest

from tests.operator.helpers import job_doc, wait_for

OUT_OF_SERVICE = {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}
FOUR_NODES_ONE_SPARE = {
    "parallelism": {"pipeline": 2, "tensor": 4, "data": 2},
    "failurePolicy": {"backoffLimit": 2, "spareNodes": 1},
}


@pytest.fixture
def operator_args():
    # Kubernetes' own NotReady toleration (the operator's default): only the taint may cut it short.
    return ["--force-delete-after", "1", "--not-ready-grace", "300"]


@pytest.mark.parametrize("node_watch", ["live", "late"])
def test_an_out_of_service_node_moves_to_the_spare_at_once_without_a_gang_restart(cluster, operator, node_watch):
    cluster.add_nodes(6)
    cluster.apply(job_doc(**FOUR_NODES_ONE_SPARE))
    status = cluster.start_running(pods=4)
    if node_watch == "late":
        # The pod's deletion reaches the operator before the Node watch brings the taint (CI saw it): here the
        # Node watch brings nothing more, so only a fresh look at the node of the vanished pod can tell.
        cluster.server.muted.add("nodes")
    (spare,) = status["spareNodes"]
    lost = next(entry["node"] for entry in status["placement"] if entry["nodeRank"] == 2)
    before = {pod["metadata"]["name"]: pod["metadata"]["uid"] for pod in cluster.pods()}

    # The node shuts down: NotReady, tainted out-of-service, and its pod force-deleted by the pod GC.
    cluster.set_node_ready(lost, False)
    cluster.core.patch_node(lost, {"spec": {"taints": [OUT_OF_SERVICE]}})
    # By uid, as the pod GC does: the operator may have made gpt-2 again on the spare already.
    old = kubernetes.client.V1DeleteOptions(grace_period_seconds=0, preconditions={"uid": before["gpt-2"]})
    with contextlib.suppress(kubernetes.client.ApiException):
        cluster.core.delete_namespaced_pod("gpt-2", "research", body=old)

    def replaced() -> list | None:
        pods = cluster.pods()
        return pods if len(pods) == 4 and {p["metadata"]["name"] for p in pods} == set(before) else None

    pods = {pod["metadata"]["name"]: pod for pod in wait_for(replaced, timeout=30, what="gpt-2 made again")}
    assert pods["gpt-2"]["metadata"]["labels"]["paralleljob.io/node"] == spare
    for name in ("gpt-0", "gpt-1", "gpt-3"):
        assert pods[name]["metadata"]["uid"] == before[name], f"{name} was made again"
    # The Event follows the pod's create.
    reasons = wait_for(
        lambda: "SpareReplaced" in (found := [event["reason"] for event in cluster.events()]) and found,
        timeout=30,
        what="the SpareReplaced Event",
    )
    assert "Restarting" not in reasons, reasons
    assert cluster.status().get("restarts", 0) == 0
