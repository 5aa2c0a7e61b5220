"""A 16-node job from apply to Succeeded, through a gang restart and the backoff limit, over HTTP."""

from __future__ import annotations

from tests.operator.conftest import job_doc, wait_for


def env_of(pod):
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def test_sixteen_node_job_gets_its_children_and_status(cluster, operator):
    cluster.add_nodes(16, allocatable={"rdma/ib": "1"})
    cluster.apply(job_doc())
    pods = wait_for(lambda: len(cluster.pods()) == 16 and cluster.pods(), what="16 pods")
    config = cluster.core.read_namespaced_config_map("gpt-config", "research")
    assert set(config.data) == {"job.json", "deepspeed.json", "plan.json", "nccl.env"}
    service = cluster.core.read_namespaced_service("gpt", "research")
    assert service.spec.cluster_ip == "None"
    nodes = [p["metadata"]["labels"]["paralleljob.io/node"] for p in pods]
    assert len(set(nodes)) == 16
    for pod in pods:
        rank = int(pod["metadata"]["labels"]["paralleljob.io/node-rank"])
        env = env_of(pod)
        assert env["PARALLELJOB_NODE_RANK"] == str(rank)
        assert env["NCCL_IB_TIMEOUT"] == "22"
        container = pod["spec"]["containers"][0]
        assert container["resources"]["limits"] == {"nvidia.com/gpu": "4", "rdma/ib": "1"}
        assert container["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    status = wait_for(lambda: cluster.status().get("message", "").startswith("16 pods") and cluster.status())
    assert status["layout"] == "4x4x4"
    assert status["worldSize"] == 64
    assert status["ncclEnv"]["NCCL_IB_DISABLE"] == "0"
    assert [c["type"] for c in status["conditions"]] == ["Valid", "Scheduled"]

    cluster.bind_all()
    wait_for(lambda: cluster.status().get("phase") == "Running", what="Running")
    cluster.set_pod_phase("gpt-0", "Succeeded")
    wait_for(lambda: cluster.status().get("phase") == "Succeeded", what="Succeeded")
    wait_for(lambda: [p["metadata"]["name"] for p in cluster.pods()] == ["gpt-0"], what="cleanup")


def test_failed_pod_restarts_the_gang_and_backoff_limit_fails_the_job(cluster, operator):
    cluster.add_nodes(17)
    cluster.apply(job_doc(failurePolicy={"backoffLimit": 1}))
    wait_for(lambda: len(cluster.pods()) == 16, what="16 pods")
    wait_for(lambda: cluster.status().get("message", "").startswith("16 pods"), what="placed")
    cluster.bind_all()
    wait_for(lambda: cluster.status().get("phase") == "Running", what="Running")
    broken_node = cluster.pods()[5]["metadata"]["labels"]["paralleljob.io/node"]
    cluster.set_pod_phase(cluster.pods()[5]["metadata"]["name"], "Failed", reason="Error")

    def restarted():
        pods = cluster.pods()
        attempts = {p["metadata"]["labels"]["paralleljob.io/attempt"] for p in pods}
        return len(pods) == 16 and attempts == {"1"} and cluster.status().get("restarts") == 1

    wait_for(restarted, what="a new generation of 16 pods")
    nodes = {p["metadata"]["labels"]["paralleljob.io/node"] for p in cluster.pods()}
    assert broken_node not in nodes  # 17 nodes: the failed one is left out
    assert "Restarting" in {e["reason"] for e in cluster.events()}

    wait_for(lambda: cluster.status().get("message", "").startswith("16 pods"), what="placed again")
    cluster.bind_all()
    wait_for(lambda: cluster.status().get("phase") == "Running", what="Running again")
    cluster.core.delete_namespaced_pod("gpt-3", "research")
    status = wait_for(lambda: cluster.status().get("phase") == "Failed" and cluster.status(), what="Failed")
    assert "backoffLimit 1" in status["message"]
    assert status["restarts"] == 1
    wait_for(lambda: cluster.pods() == [], what="pods deleted")
    assert "Failed" in {e["reason"] for e in cluster.events()}
