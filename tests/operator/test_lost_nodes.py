"""A lost node on the upstream control plane. With a hot spare (spec.failurePolicy.spareNodes) the job holds a
spare node beside its own, shown in status; when one of its nodes is deleted, exactly one pod is made again, on
the spare, with the same name and node rank, and the pods on healthy nodes stay, with no gang restart; a free node becomes the
next spare, and a lost spare is replaced when a node is free again. With no
spare and spec.failurePolicy.allowDataShrink, the gang restarts at a smaller DP with the same TP, PP and global
batch, and grows back after its next checkpoint once the full size fits again."""

from __future__ import annotations

import datetime
import json

import kubernetes
import pytest

from tests.operator.helpers import Operator, job_doc, wait_for


@pytest.fixture
def operator_args():
    # A pass every second: the grow-back waits on rank 0's reported checkpoint, which no watch event brings.
    return [*Operator.ARGS, "--resync-period", "1"]


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
    assert {entry["nodeRank"]: entry["node"] for entry in status["placement"]} == {**placed, 2: spare}
    # The spare is used up; the sixth node, free, becomes the next one.
    (free,) = {f"gpu-{i:03d}" for i in range(6)} - {*placed.values(), spare}
    wait_for(lambda: cluster.status().get("spareNodes") == [free], timeout=30, what="a new spare")
    # A spare that is lost itself is dropped, and replaced once a node is free again.
    cluster.core.delete_node(free)
    wait_for(lambda: not cluster.status().get("spareNodes"), timeout=30, what="the lost spare dropped")
    cluster.add_nodes(1, start=10)
    wait_for(lambda: cluster.status().get("spareNodes") == ["gpu-010"], timeout=30, what="a spare on the new node")
    # Each Event is posted after the status write it goes with.
    wanted = {"SpareTaken", "SpareReplaced", "SpareAdded", "SpareLost"}
    reasons = wait_for(
        lambda: wanted <= set(found := [event["reason"] for event in cluster.events()]) and found, what="the Events"
    )
    assert "Restarting" not in reasons and cluster.status().get("restarts", 0) == 0


def test_with_no_spare_and_allow_data_shrink_the_job_resumes_at_a_smaller_dp_and_grows_back(cluster, operator):
    cluster.add_nodes(4)
    shrinking = {**FOUR_NODES_ONE_SPARE, "failurePolicy": {"backoffLimit": 1, "allowDataShrink": True}}
    cluster.apply(job_doc(**shrinking))
    status = cluster.start_running(pods=4)
    assert status["layout"] == "2x4x2"
    cluster.core.delete_node(status["placement"][1]["node"])
    # What the pod garbage collector does to a pod of a deleted node (after its 40 s quarantine): the gang
    # restart's draining would otherwise wait out the pod's 30 s termination grace period before forcing it.
    cluster.core.delete_namespaced_pod("gpt-1", "research", grace_period_seconds=0)

    def attempt_pods(attempt: str, count: int) -> list | None:
        pods = cluster.pods()
        return (
            pods
            if len(pods) == count
            and all(pod["metadata"]["labels"]["paralleljob.io/attempt"] == attempt for pod in pods)
            else None
        )

    wait_for(lambda: attempt_pods("1", 2), timeout=45, what="two pods of attempt 1")
    job_json = json.loads(cluster.core.read_namespaced_config_map("gpt-config", "research").data["job.json"])
    assert job_json["plan"]["layout"] == {"pipeline": 2, "tensor": 4, "data": 1}
    deepspeed = job_json["deepspeed"]
    assert (deepspeed["train_batch_size"], deepspeed["train_micro_batch_size_per_gpu"]) == (32, 2)
    assert deepspeed["gradient_accumulation_steps"] == 16  # was 8 at DP 2
    wait_for(lambda: any(event["reason"] == "DataShrunk" for event in cluster.events()), what="DataShrunk")
    status = cluster.start_running(pods=2)
    assert status["layout"] == "2x4x1" and status["restarts"] == 1

    # A node returns: the full size fits again, and the gang grows back after the next checkpoint, a restart that
    # does not count against backoffLimit (1, spent on the lost node).
    report_checkpoint(cluster, 10)
    cluster.add_nodes(1, start=10)
    wait_for(lambda: "GrowBack" in [e["reason"] for e in cluster.events()], timeout=30, what="the GrowBack Event")
    assert cluster.status()["restarts"] == 1 and attempt_pods("1", 2)
    report_checkpoint(cluster, 20)
    wait_for(lambda: attempt_pods("2", 4), timeout=45, what="four pods of attempt 2")
    status = cluster.start_running(pods=4)
    assert status["layout"] == "2x4x2" and status["restarts"] == 2 and status["phase"] == "Running"


def report_checkpoint(cluster, step: int) -> None:
    """What rank 0's progress hook does after a checkpoint: merge-patch the job's progress ConfigMap."""
    data = {"step": str(step), "lastCheckpointStep": str(step)}
    cluster.core.patch_namespaced_config_map("gpt-progress", "research", {"data": data})


def test_a_not_ready_nodes_pod_is_replaced_without_waiting_out_its_grace_period(cluster, operator):
    # A NotReady node's kubelet honours no termination grace period: the lost rank's old pod is force-deleted
    # --force-delete-after (1 s here) after its deletion is asked, not after its 30 s deadline as well.
    cluster.add_nodes(6)
    cluster.apply(job_doc(**FOUR_NODES_ONE_SPARE))
    status = cluster.start_running(pods=4)
    (spare,) = status["spareNodes"]
    lost = next(entry["node"] for entry in status["placement"] if entry["nodeRank"] == 2)
    old = next(pod for pod in cluster.pods() if pod["metadata"]["name"] == "gpt-2")["metadata"]["uid"]
    # Watched, not polled: the pod is force-deleted a second after its deletion is asked, and a loaded machine's
    # poll can miss that second.
    since = cluster.core.list_namespaced_pod("research").metadata.resource_version

    cluster.set_node_ready(lost, False)

    deadline = None
    for event in kubernetes.watch.Watch().stream(
        cluster.core.list_namespaced_pod, "research", resource_version=since, timeout_seconds=60
    ):
        meta = event["object"].metadata
        if meta.uid == old and meta.deletion_timestamp is not None:
            deadline = meta.deletion_timestamp
            break
    assert deadline is not None, "the lost rank's pod was not deleted within 60 s"

    def made_again() -> dict | None:
        found = [pod for pod in cluster.pods() if pod["metadata"]["name"] == "gpt-2"]
        return found[0] if found and found[0]["metadata"]["uid"] != old else None

    new = wait_for(made_again, timeout=60, what="gpt-2 made again on the spare")
    assert new["metadata"]["labels"]["paralleljob.io/node"] == spare
    created = datetime.datetime.fromisoformat(new["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
    assert created < deadline, (created, deadline)


def test_a_budget_job_with_allow_relayout_resumes_at_another_pipeline_x_tensor_and_grows_back(cluster, operator):
    """Sixteen GPUs with data fixed at 4 (so the search chooses some PP x TP of 4); a node lost and no spare:
    the gang restarts on fewer GPUs at the layout search's best layout for them, whose PP x TP differs, global
    batch kept, and grows back to the chosen layout after its next checkpoint once a node returns."""
    cluster.add_nodes(4)
    doc = job_doc(parallelism={"nodes": 4, "data": 4}, failurePolicy={"backoffLimit": 1, "allowRelayout": True})
    doc["spec"]["deepspeed"] = {"train_batch_size": 32}
    cluster.apply(doc)
    status = cluster.start_running(pods=4)
    full = status["layout"]
    pipeline, tensor, data = map(int, full.split("x"))
    assert pipeline * tensor == 4 and data == 4
    cluster.core.delete_node(status["placement"][1]["node"])
    cluster.core.delete_namespaced_pod("gpt-1", "research", grace_period_seconds=0)
    wait_for(lambda: "Relayout" in [e["reason"] for e in cluster.events()], timeout=45, what="the Relayout Event")
    (event,) = [e for e in cluster.events() if e["reason"] == "Relayout"]

    def new_attempt() -> dict | None:
        found = json.loads(cluster.core.read_namespaced_config_map("gpt-config", "research").data["job.json"])
        layout = found["plan"]["layout"]
        return found if f"{layout['pipeline']}x{layout['tensor']}x{layout['data']}" != full else None

    # The pass posts the Event as it decides and writes the new attempt's ConfigMap after it (a CI rehearsal
    # read the old job.json in between).
    job_json = wait_for(new_attempt, timeout=30, what="the new attempt's job.json")
    smaller = job_json["plan"]["layout"]
    new = f"{smaller['pipeline']}x{smaller['tensor']}x{smaller['data']}"
    assert f"{full} does not fit on the nodes left" in event["message"] and f"resuming at {new}" in event["message"]
    assert smaller["pipeline"] * smaller["tensor"] * smaller["data"] < 16
    assert (smaller["pipeline"], smaller["tensor"]) != (pipeline, tensor)
    assert job_json["deepspeed"]["train_batch_size"] == 32
    status = cluster.start_running(pods=smaller["pipeline"] * smaller["tensor"] * smaller["data"] // 4)
    assert status["layout"] == new and status["restarts"] == 1

    report_checkpoint(cluster, 10)
    cluster.add_nodes(1, start=10)
    wait_for(lambda: "GrowBack" in [e["reason"] for e in cluster.events()], timeout=30, what="the GrowBack Event")
    report_checkpoint(cluster, 20)
    wait_for(lambda: len(cluster.pods()) == 4 and cluster.status().get("layout") == full, timeout=45, what="grown")
    status = cluster.start_running(pods=4)
    assert status["layout"] == full and status["restarts"] == 2
