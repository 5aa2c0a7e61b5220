"""Hot spares (spec.failurePolicy.spareNodes) on the upstream control plane: the job holds a spare node beside
its own, shown in status; when one of its nodes is deleted, exactly one pod is made again, on the spare, with
the same name and node rank, and the pods on healthy nodes stay, with no gang restart."""

from __future__ import annotations

from tests.operator.conftest import job_doc, wait_for

# PP 2 x TP 4 x DP 2 on 4-GPU nodes: four node ranks, and one spare.
FOUR_NODES_ONE_SPARE = {
    "parallelism": {"pipeline": 2, "tensor": 4, "data": 2},
    "failurePolicy": {"backoffLimit": 2, "spareNodes": 1},
}


def test_a_lost_node_is_replaced_by_the_spare_recreating_only_its_pod(cluster, operator):
    cluster.add_nodes(6)
    cluster.apply(job_doc(**FOUR_NODES_ONE_SPARE))
    status = cluster.start_running(pods=4)
    (spare,) = status["spareNodes"]
    placed = {entry["nodeRank"]: entry["node"] for entry in status["placement"]}
    assert spare not in placed.values()
    before = {pod["metadata"]["name"]: pod for pod in cluster.pods()}
    assert {pod["spec"]["nodeName"] for pod in before.values()} == set(placed.values())

    cluster.core.delete_node(placed[2])

    def replaced() -> list | None:
        pods = cluster.pods()
        new = [pod for pod in pods if pod["metadata"]["uid"] not in {p["metadata"]["uid"] for p in before.values()}]
        return pods if len(pods) == 4 and len(new) == 1 else None

    pods = {pod["metadata"]["name"]: pod for pod in wait_for(replaced, timeout=30, what="the pod made again")}
    (new,) = [
        pod for pod in pods.values() if pod["metadata"]["uid"] != before[pod["metadata"]["name"]]["metadata"]["uid"]
    ]
    assert new["metadata"]["name"] == "gpt-2"
    assert new["metadata"]["labels"]["paralleljob.io/node-rank"] == "2"
    assert new["metadata"]["labels"]["paralleljob.io/node"] == spare
    assert (
        new["metadata"]["labels"]["paralleljob.io/attempt"]
        == before["gpt-2"]["metadata"]["labels"]["paralleljob.io/attempt"]
    )
    # The same environment, but for the node the pod runs on.
    moved = {"name": "PARALLELJOB_NODE_NAME", "value": spare}
    old_env = [
        moved if entry["name"] == "PARALLELJOB_NODE_NAME" else entry
        for entry in before["gpt-2"]["spec"]["containers"][0]["env"]
    ]
    assert new["spec"]["containers"][0]["env"] == old_env
    for name in ("gpt-0", "gpt-1", "gpt-3"):
        assert pods[name]["metadata"]["uid"] == before[name]["metadata"]["uid"]
        assert pods[name]["metadata"].get("deletionTimestamp") is None

    cluster.bind_all()
    status = wait_for(
        lambda: (s := cluster.status()).get("phase") == "Running" and s.get("podsReady") == 4 and s,
        timeout=30,
        what="Running again",
    )
    assert status.get("restarts", 0) == 0
    assert not status.get("spareNodes")
    assert {entry["nodeRank"]: entry["node"] for entry in status["placement"]} == {**placed, 2: spare}
    reasons = [event["reason"] for event in cluster.events()]
    assert "SpareTaken" in reasons and "SpareReplaced" in reasons and "Restarting" not in reasons
