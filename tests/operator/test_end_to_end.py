"""A 16-node job from apply to Succeeded, through gang restarts and the backoff limit, over HTTP."""

from __future__ import annotations

import json

import pytest

from tests.operator.helpers import generations_overlapping, job_doc, operator_calls, restarted, wait_for


def env_of(pod):
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def pinned_node(pod):
    affinity = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (term,) = affinity["nodeSelectorTerms"]
    (expression,) = term["matchExpressions"]
    assert (expression["key"], expression["operator"]) == ("kubernetes.io/hostname", "In")
    (node,) = expression["values"]
    return node


def placed(cluster):
    return cluster.status().get("message", "").startswith("16 pods")


def test_sixteen_node_job_gets_its_children_and_status(cluster, operator):
    cluster.add_nodes(16, allocatable={"rdma/ib": "1"})
    cluster.apply(job_doc())
    pods = wait_for(lambda: len(cluster.pods()) == 16 and cluster.pods(), what="16 pods")
    config = cluster.core.read_namespaced_config_map("gpt-config", "research")
    assert set(config.data) == {"job.json", "deepspeed.json", "plan.json", "nccl.env", "network.json", "attempt.json"}
    service = cluster.core.read_namespaced_service("gpt", "research")
    assert service.spec.cluster_ip == "None"
    status = wait_for(lambda: placed(cluster) and cluster.status(), what="placed")
    by_rank = {entry["nodeRank"]: entry for entry in status["placement"]}
    assert sorted(by_rank) == list(range(16))
    assert len({entry["node"] for entry in status["placement"]}) == 16
    # The attempt record the pods were built from: the node of each node rank, the image, the pinned spec.
    record = json.loads(cluster.core.read_namespaced_config_map("gpt-config", "research").data["attempt.json"])
    assert record["nodes"] == [by_rank[rank]["node"] for rank in range(16)]
    assert (record["attempt"], record["placed"], record["image"]) == (0, True, "trainer:test")
    # The creating pass wrote the record placed before the status said so (a reader of Placed finds it placed).
    calls = operator_calls(cluster.server)
    after_pods = len(calls) - calls[::-1].index(("create", "", "pods", "research"))
    writes = [call[2] for call in calls[after_pods:] if call[0] == "patch"]
    assert writes.index("configmaps") < writes.index("paralleljobs/status"), writes
    assert record["spec"]["parallelism"] == {"pipeline": 4, "tensor": 4, "data": 4}
    for pod in pods:
        rank = int(pod["metadata"]["labels"]["paralleljob.io/node-rank"])
        assert pod["metadata"]["name"] == by_rank[rank]["pod"] == f"gpt-{rank}"
        # Pinned by required node affinity to the planned node; the scheduler binds it.
        assert pinned_node(pod) == by_rank[rank]["node"] == pod["metadata"]["labels"]["paralleljob.io/node"]
        assert "nodeName" not in pod["spec"]
        env = env_of(pod)
        assert env["PARALLELJOB_NODE_RANK"] == str(rank)
        assert env["PARALLELJOB_CHECKPOINT_DIR"] == "/checkpoints/research/gpt"
        assert env["PARALLELJOB_OUTPUT_DIR"] == "/checkpoints/research/gpt/metrics"
        assert {key: env[key] for key in status["ncclEnv"]} == status["ncclEnv"]
        container = pod["spec"]["containers"][0]
        assert container["resources"]["limits"] == {"nvidia.com/gpu": "4", "rdma/ib": "1"}
        assert container["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert volumes["dshm"]["emptyDir"] == {"medium": "Memory"} and mounts["dshm"] == "/dev/shm"
        assert volumes["checkpoint"]["persistentVolumeClaim"] == {"claimName": "ckpt"}
        assert mounts["checkpoint"] == "/checkpoints"
        assert pod["spec"].get("automountServiceAccountToken", True) is (rank == 0)
    assert status["layout"] == "4x4x4"
    assert status["worldSize"] == 64
    assert status["ncclEnv"]["NCCL_NET"] == "IB"  # detected RDMA: fail closed, never a silent socket fallback
    assert status["podsReady"] == 0
    assert status["observedGeneration"] == cluster.job()["metadata"]["generation"]
    assert [c["type"] for c in status["conditions"]] == ["Valid", "Scheduled"]

    cluster.bind_all()
    status = wait_for(lambda: cluster.status().get("phase") == "Running" and cluster.status(), what="Running")
    assert status["podsReady"] == 16
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
    # Rank 0's progress hook reports the final checkpoint before the trainer exits (a patch of its ConfigMap).
    cluster.core.patch_namespaced_config_map("gpt-progress", "research", {"data": {"lastCheckpointStep": "100"}})
    cluster.set_pod_phase("gpt-0", "Succeeded")
    wait_for(lambda: cluster.status().get("phase") == "Succeeded", what="Succeeded")
    wait_for(lambda: [p["metadata"]["name"] for p in cluster.pods()] == ["gpt-0"], what="cleanup")
    completed = wait_for(lambda: [e for e in cluster.events() if e["reason"] == "Completed"], what="Completed")
    assert "last checkpoint step 100 in /checkpoints/research/gpt/global_step100" in completed[0]["message"]


def test_failed_pod_restarts_the_gang_and_backoff_limit_fails_the_job(cluster, operator, apiserver):
    cluster.add_nodes(17)
    cluster.apply(job_doc(failurePolicy={"backoffLimit": 1}))
    wait_for(lambda: len(cluster.pods()) == 16, what="16 pods")
    wait_for(lambda: placed(cluster), what="placed")
    cluster.bind_all()
    wait_for(lambda: cluster.status().get("phase") == "Running", what="Running")
    broken_node = cluster.pods()[5]["metadata"]["labels"]["paralleljob.io/node"]
    cluster.set_pod_phase(cluster.pods()[5]["metadata"]["name"], "Failed", reason="Error")

    wait_for(lambda: restarted(cluster, 1), what="a new generation of 16 pods")
    nodes = {p["metadata"]["labels"]["paralleljob.io/node"] for p in cluster.pods()}
    assert broken_node not in nodes  # 17 nodes: the failed one is left out
    assert cluster.status()["excludedNodes"] == [broken_node]
    wait_for(lambda: "Restarting" in {e["reason"] for e in cluster.events()}, what="the Restarting Event")

    wait_for(lambda: placed(cluster), what="placed again")
    cluster.bind_all()
    wait_for(lambda: cluster.status().get("phase") == "Running", what="Running again")
    cluster.core.delete_namespaced_pod("gpt-3", "research")
    status = wait_for(lambda: cluster.status().get("phase") == "Failed" and cluster.status(), what="Failed")
    assert "backoffLimit 1" in status["message"]
    assert status["restarts"] == 1
    wait_for(lambda: cluster.pods() == [], what="pods deleted")
    wait_for(lambda: "Failed" in {e["reason"] for e in cluster.events()}, what="the Failed Event")
    assert generations_overlapping(apiserver) == []
    assert apiserver.force_deleted == []


def evict(cluster, pod):
    cluster.set_pod_phase(pod, "Failed", reason="Evicted", message="The node was low on resource: memory.")


def delete(cluster, pod):
    cluster.core.delete_namespaced_pod(pod, "research")


def lose_node(cluster, pod):
    # A dead kubelet: the pods on it never finish terminating, so the operator must force-delete them.
    cluster.set_node_ready(cluster.core.read_namespaced_pod(pod, "research").spec.node_name, False)


@pytest.mark.parametrize(
    ("breakage", "forced"),
    [(evict, []), (delete, []), (lose_node, ["gpt-7"])],
    ids=["evicted", "deleted", "node-not-ready"],
)
def test_a_lost_pod_restarts_the_whole_gang_one_generation_at_a_time(cluster, operator, apiserver, breakage, forced):
    cluster.add_nodes(17)
    cluster.apply(job_doc())
    wait_for(lambda: len(cluster.pods()) == 16 and placed(cluster), what="placed")
    cluster.bind_all()
    wait_for(lambda: cluster.status().get("phase") == "Running", what="Running")
    broken_node = cluster.core.read_namespaced_pod("gpt-7", "research").spec.node_name
    breakage(cluster, "gpt-7")

    wait_for(lambda: restarted(cluster, 1), what="a new generation of 16 pods")
    assert broken_node not in {p["metadata"]["labels"]["paralleljob.io/node"] for p in cluster.pods()}
    status = cluster.status()
    assert status["excludedNodes"] == [broken_node]
    assert {c["type"]: c["reason"] for c in status["conditions"]}["Ready"] == "GangRestart"
    # No pod of attempt 1 was created while any pod of attempt 0 (Terminating included) still existed, and
    # only a pod whose kubelet is gone was force-deleted: the others stopped their containers first.
    assert generations_overlapping(apiserver) == []
    assert apiserver.force_deleted == forced
