"""A straggler rank 0 reports is named by the operator on the upstream control plane: status.progress.stragglers
(with the node from the placement), the Straggler condition, a SlowNode Event, and the wide Stragglers column."""

from __future__ import annotations

import json
import sys

from paralleljob.api import crd
from tests.operator.helpers import Operator, install_operator_rbac, job_doc, printed_row, wait_for

TWO_REPLICAS = {"parallelism": {"pipeline": 1, "tensor": 4, "data": 2}}


def report(cluster, **data: str) -> None:
    """What rank 0's hook does: merge-patch the data of the job's progress ConfigMap."""
    cluster.core.patch_namespaced_config_map("gpt-progress", "research", {"data": data})


def test_a_reported_straggler_is_named_in_status_condition_event_and_column(cluster, operator, apiserver):
    cluster.add_nodes(2)
    cluster.apply(job_doc(**TWO_REPLICAS))
    wait_for(lambda: len(cluster.pods()) == 2, what="2 pods")
    cluster.bind_all()
    status = wait_for(lambda: cluster.status().get("phase") == "Running" and cluster.status(), what="Running")
    node = next(p["node"] for p in status["placement"] if p["nodeRank"] == 1)
    named = [{"nodeRank": 1, "factor": 2.57, "stage": 0, "steps": [21, 40]}]
    report(cluster, step="40", stragglers=json.dumps(named))

    status = wait_for(
        lambda: (cluster.status().get("progress") or {}).get("stragglers") and cluster.status(), what="copied"
    )
    assert status["progress"]["stragglers"] == [{**named[0], "node": node}]
    condition = wait_for(
        lambda: next((c for c in cluster.status().get("conditions", []) if c["type"] == "Straggler"), None),
        what="the Straggler condition",
    )
    assert (condition["status"], condition["reason"]) == ("True", "SlowNode")
    assert f"{node} (node rank 1, stage 0) computed 2.57x" in condition["message"]
    event = wait_for(lambda: [e for e in cluster.events() if e["reason"] == "SlowNode"], what="a SlowNode Event")
    assert "steps 21-40" in event[0]["message"] and event[0]["type"] == "Warning"
    columns = crd.build_crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    assert printed_row(apiserver.kubeconfig, columns)["Stragglers"] == node

    # The next window names nobody: the condition turns False, no further Event, the column empties.
    report(cluster, step="60", stragglers="[]")
    wait_for(
        lambda: any(c["type"] == "Straggler" and c["status"] == "False" for c in cluster.status()["conditions"]),
        what="Straggler False",
    )
    assert cluster.status()["progress"]["stragglers"] == []
    assert len([e for e in cluster.events() if e["reason"] == "SlowNode"]) == 1
    # Rank 0 names nodes; it never moves a pod.
    assert all(pod["status"]["phase"] == "Running" for pod in cluster.pods())


def test_a_named_node_is_labelled_for_administrators_where_the_chart_enables_it(server, cluster, tmp_path):
    """The chart's slowNodeLabel: its RBAC (patch on Nodes) and its flag, on the operator process; the named node
    gets `key=true`, its peer nothing, and the label stays once the next window names nobody."""
    key = "example.com/slow"
    chart = {"slowNodeLabel": {"enabled": True, "key": key}}
    kubeconfig = install_operator_rbac(server, cluster.client, values=chart)
    operator = Operator(server, tmp_path / "operator.log", kubeconfig, [*Operator.ARGS, f"--slow-node-label={key}"])
    operator.start()
    try:
        cluster.add_nodes(2)
        cluster.apply(job_doc(**TWO_REPLICAS))
        wait_for(lambda: len(cluster.pods()) == 2, what="2 pods")
        cluster.bind_all()
        status = wait_for(lambda: cluster.status().get("phase") == "Running" and cluster.status(), what="Running")
        node, peer = (next(p["node"] for p in status["placement"] if p["nodeRank"] == rank) for rank in (1, 0))
        report(
            cluster, step="40", stragglers=json.dumps([{"nodeRank": 1, "factor": 2.57, "stage": 0, "steps": [21, 40]}])
        )

        def labels(name: str) -> dict[str, str]:
            return cluster.core.read_node(name).metadata.labels or {}

        wait_for(lambda: labels(node).get(key) == "true", what=f"{key}=true on {node}")
        assert key not in labels(peer)
        report(cluster, step="60", stragglers="[]")
        wait_for(
            lambda: any(c["type"] == "Straggler" and c["status"] == "False" for c in cluster.status()["conditions"]),
            what="Straggler False",
        )
        assert labels(node).get(key) == "true"  # the administrator removes it, once the node is fixed
        # Only the named node is labelled. Which nodes carry the label is read from the Node watch (level-triggered,
        # no memory of its own), so a pass that begins before the watch shows the label writes the same merge patch
        # again: 2 patches of gpt's node in 1 of 10 runs of tests/operator.
        label_writes = [
            (r.name, r.status)
            for r in server.proxy.requests
            if r.verb == "patch" and r.resource == "nodes" and r.agent.startswith("paralleljob")
        ]
        assert label_writes and set(label_writes) == {(node, 200)}, label_writes
    finally:
        operator.stop()
        sys.stderr.write((tmp_path / "operator.log").read_text()[-4000:])


# PP 2 x TP 4 x DP 2 on 4-GPU nodes: four node ranks, each with a peer (its stage in the other replica).
REPLACE = {
    "parallelism": {"pipeline": 2, "tensor": 4, "data": 2},
    "failurePolicy": {"backoffLimit": 2, "stragglers": {"action": "Replace"}},
}


def confirm_deleted(cluster, name: str) -> None:
    """What a kubelet does for a pod being deleted on a healthy node: confirm it (no kubelet runs here)."""
    pod = next((p for p in cluster.pods() if p["metadata"]["name"] == name), None)
    if pod is not None and pod["metadata"].get("deletionTimestamp"):
        cluster.core.delete_namespaced_pod(name, "research", grace_period_seconds=0)


def test_replace_with_a_spare_moves_the_slow_node_rank_to_it_and_excludes_the_node(cluster, operator):
    cluster.add_nodes(6)
    cluster.apply(job_doc(**{**REPLACE, "failurePolicy": {**REPLACE["failurePolicy"], "spareNodes": 1}}))
    status = cluster.start_running(pods=4)
    (spare,) = status["spareNodes"]
    placed = {entry["nodeRank"]: entry["node"] for entry in status["placement"]}
    before = {pod["metadata"]["name"]: pod["metadata"]["uid"] for pod in cluster.pods()}
    slow = [{"nodeRank": 1, "node": placed[1], "factor": 2.4, "stage": 0, "steps": [21, 40]}]
    report(cluster, step="40", stragglers=json.dumps(slow))

    def moved() -> bool:
        confirm_deleted(cluster, "gpt-1")
        pods = {pod["metadata"]["name"]: pod for pod in cluster.pods()}
        new = pods.get("gpt-1")
        # Made again, pinned to the spare (bound below, as the scheduler would).
        pinned_to = (new or {}).get("metadata", {}).get("labels", {}).get("paralleljob.io/node")
        return new is not None and new["metadata"]["uid"] != before["gpt-1"] and pinned_to == spare

    wait_for(moved, timeout=60, what="gpt-1 made again on the spare")
    assert placed[1] in cluster.status()["excludedNodes"]
    for name in ("gpt-0", "gpt-2", "gpt-3"):  # the pods on the other nodes stay
        assert next(p for p in cluster.pods() if p["metadata"]["name"] == name)["metadata"]["uid"] == before[name]
    cluster.bind_all()
    status = wait_for(
        lambda: (s := cluster.status()).get("phase") == "Running" and s.get("podsReady") == 4 and s, what="Running"
    )
    assert status.get("restarts", 0) == 0
    assert {e["nodeRank"]: e["node"] for e in status["placement"]} == {**placed, 1: spare}
    # The slow node is excluded: the free sixth node becomes the next spare, never the slow one.
    (free,) = {f"gpu-{i:03d}" for i in range(6)} - {*placed.values(), spare}
    wait_for(lambda: cluster.status().get("spareNodes") == [free], timeout=30, what="a new spare, not the slow node")
    # Rank 0 reports again with the old window: it names node rank 1 on its old node, so it no longer counts
    # (dropped from status) and nothing moves again.
    moved_pod = next(p for p in cluster.pods() if p["metadata"]["name"] == "gpt-1")["metadata"]["uid"]
    report(cluster, step="41", stragglers=json.dumps(slow))
    wait_for(lambda: cluster.status()["progress"]["step"] == 41, what="step 41 copied")
    assert cluster.status()["progress"].get("stragglers") == []
    assert next(p for p in cluster.pods() if p["metadata"]["name"] == "gpt-1")["metadata"]["uid"] == moved_pod
    assert {e["reason"] for e in cluster.events()} >= {"SpareTaken", "SpareReplaced", "SlowNode"}


def test_replace_without_a_spare_restarts_the_gang_without_the_slow_node(cluster, operator):
    cluster.add_nodes(5)
    cluster.apply(job_doc(**REPLACE))
    status = cluster.start_running(pods=4)
    placed = {entry["nodeRank"]: entry["node"] for entry in status["placement"]}
    slow = [{"nodeRank": 2, "node": placed[2], "factor": 3.1, "stage": 1, "steps": [1, 20]}]
    report(cluster, step="20", stragglers=json.dumps(slow))
    status = wait_for(lambda: (s := cluster.status()).get("restarts") == 1 and s, timeout=60, what="a gang restart")
    assert status["excludedNodes"] == [placed[2]]
    restarted = [e for e in cluster.events() if e["reason"] == "SlowNode"]
    assert restarted and placed[2] in restarted[-1]["message"]
    old = {pod["metadata"]["uid"] for pod in cluster.pods()}

    def new_gang() -> list | None:
        for pod in cluster.pods():
            confirm_deleted(cluster, pod["metadata"]["name"])
        pods = [pod for pod in cluster.pods() if pod["metadata"]["uid"] not in old]
        return pods if len(pods) == 4 else None

    # Re-planned on the four other nodes.
    pods = wait_for(new_gang, timeout=60, what="the new gang's pods")
    assert placed[2] not in {pod["metadata"]["labels"]["paralleljob.io/node"] for pod in pods}
