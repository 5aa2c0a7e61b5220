"""A network that is not what the job planned, over HTTP: the failing rank's termination message becomes the
NetworkReady condition, and the job fails at once instead of spending its restarts on the same failure."""

from __future__ import annotations

from paralleljob.manifests import labels
from paralleljob_trainer import k8s_status, nccl_log
from tests.operator.helpers import job_doc, wait_for

# What the trainer writes to /dev/termination-log on a node without RDMA devices (paralleljob_trainer.preflight).
NO_RDMA_DEVICE = (
    "NetworkReady NoRdmaDevice: fabric infiniband but the pod sees no RDMA device (/sys/class/infiniband is "
    "empty): request the node's RDMA resource (spec.network.rdmaResource) or declare the fabric the nodes have\n"
)


def conditions(status):
    return {c["type"]: c for c in status.get("conditions") or ()}


def test_a_job_declaring_infiniband_on_nodes_without_rdma_fails_with_network_ready_false(cluster, operator):
    cluster.add_nodes(4)
    cluster.apply(job_doc(parallelism={"pipeline": 4, "tensor": 4, "data": 1}, network={"fabric": "infiniband"}))
    wait_for(lambda: len(cluster.pods()) == 4, what="4 pods")
    # The RDMA request could not be made; a person hears it at placement, before any pod fails.
    wait_for(lambda: "NetworkWarning" in {e["reason"] for e in cluster.events()}, what="a NetworkWarning event")
    cluster.bind_all()
    wait_for(lambda: cluster.status().get("phase") == "Running", what="Running")
    terminated = {"terminated": {"exitCode": 1, "reason": "Error", "message": NO_RDMA_DEVICE}}
    container = {"name": "trainer", "image": "trainer:1", "imageID": "", "ready": False, "restartCount": 0}
    cluster.set_pod_phase("gpt-3", "Failed", containerStatuses=[{**container, "state": terminated}])

    status = wait_for(lambda: cluster.status().get("phase") == "Failed" and cluster.status(), what="Failed")
    network = conditions(status)["NetworkReady"]
    assert (network["status"], network["reason"]) == ("False", "NoRdmaDevice")
    assert "sees no RDMA device" in network["message"]
    assert conditions(status)["Failed"]["reason"] == "NetworkNotReady"
    assert "not restarted" in status["message"] and "gpt-3" in status["message"]
    assert status["restarts"] == 0
    # The others are deleted to free their GPUs; the failed pod stays for its logs and termination message.
    wait_for(lambda: [p["metadata"]["name"] for p in cluster.pods()] == ["gpt-3"], what="the others deleted")


def test_rank_zeros_network_verdict_becomes_the_network_verified_condition(cluster, operator, apiserver, tmp_path):
    cluster.add_nodes(4, allocatable={"rdma/ib": "4"})
    cluster.apply(job_doc(parallelism={"pipeline": 4, "tensor": 4, "data": 1}))
    wait_for(lambda: len(cluster.pods()) == 4, what="4 pods")
    cluster.bind_all()
    wait_for(lambda: cluster.status().get("phase") == "Running", what="Running")
    # Rank 0's reporter, with the token of the progress account the operator made for the job.
    token = tmp_path / "token"
    token.write_text(apiserver.token_for("research", labels.progress_account_name("gpt")) + "\n")
    reporter = k8s_status.ProgressReporter(apiserver.url, "research", "gpt", token_path=token, ca_path=apiserver.ca)
    # The first step record of an attempt, as training.py writes it after the warm-up collective.
    verdict = nccl_log.Verdict("False", "NoGPUDirectRDMA", "NCCL uses IB over 4 NICs without GPUDirect RDMA")
    reporter.on_step({"event": "step", "step": 10, "loss": 2.5, "network": verdict.to_record()})
    assert reporter.wait_sent(5)

    # The verdict's condition comes from the job's pass, the progress from the copy of the ConfigMap: two writes.
    status = wait_for(
        lambda: "NetworkVerified" in conditions(s := cluster.status()) and "progress" in s and s, what="verdict"
    )
    verified = conditions(status)["NetworkVerified"]
    assert (verified["status"], verified["reason"]) == ("False", "NoGPUDirectRDMA")
    assert "without GPUDirect RDMA" in verified["message"]
    assert conditions(status)["NetworkReady"]["status"] == "True"
    assert status["progress"]["step"] == 10
    wait_for(lambda: "NetworkDegraded" in {e["reason"] for e in cluster.events()}, what="a NetworkDegraded event")
