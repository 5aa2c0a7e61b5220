"""A lost node, noticed by its gang, on the upstream control plane, with the chart's recovery defaults (a 300 s
NotReady grace, force deletion 120 s after asking, a 20 s Lease threshold). The test plays the node's kubelet
(its Lease in kube-node-lease) and node rank 0's coordinator (the `lostPeers` report in the progress ConfigMap).
A node whose Lease has stopped and whose peers report it lost is replaced by the spare at once, though the Node
is still Ready; with only one of the two signals (a blip), nothing happens."""

from __future__ import annotations

import datetime
import time
from pathlib import Path

import kubernetes
import pytest
import yaml

from tests.operator.helpers import job_doc, wait_for

LAYOUT = {
    "parallelism": {"pipeline": 2, "tensor": 4, "data": 2},
    "failurePolicy": {"backoffLimit": 2, "spareNodes": 1},
}


VALUES = Path(__file__).resolve().parents[2] / "charts" / "paralleljob-operator" / "values.yaml"


@pytest.fixture
def operator_args():
    """The chart's default recovery values, as its Deployment passes them (templates/_operator.tpl)."""
    recovery = yaml.safe_load(VALUES.read_text())["recovery"]
    assert (recovery["notReadyGraceSeconds"], recovery["lostNodeLeaseSeconds"]) == (300, 20)
    return [
        f"--not-ready-grace={recovery['notReadyGraceSeconds']}",
        f"--force-delete-after={recovery['forceDeleteAfterSeconds']}",
        f"--lost-node-lease={recovery['lostNodeLeaseSeconds']}",
        f"--restart-hold={recovery['restartHoldSeconds']}",
    ]


def renew(cluster, node: str, seconds_ago: float) -> None:
    """What the node's kubelet does: its Lease in kube-node-lease, renewed `seconds_ago` (created if need be)."""
    api = kubernetes.client.CoordinationV1Api(cluster.client)
    renewed = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=seconds_ago)
    spec = {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}
    try:
        api.patch_namespaced_lease(node, "kube-node-lease", {"spec": spec})
    except kubernetes.client.ApiException as error:
        if error.status != 404:
            raise
        api.create_namespaced_lease("kube-node-lease", {"metadata": {"name": node}, "spec": spec})


def report_lost(cluster, peers: str) -> None:
    """What node rank 0's coordinator does through its progress hook: the peers it no longer hears from."""
    cluster.core.patch_namespaced_config_map("gpt-progress", "research", {"data": {"lostPeers": peers}})


def running_with_a_spare(cluster) -> tuple[dict[int, str], dict[str, str]]:
    """The 4-node job Running with its spare, every node's Lease fresh; its placement and its pods' uids."""
    cluster.add_nodes(6)
    for index in range(6):
        renew(cluster, f"gpu-{index:03d}", 0)
    cluster.apply(job_doc(**LAYOUT))
    status = cluster.start_running(pods=4)
    placed = {entry["nodeRank"]: entry["node"] for entry in status["placement"]}
    return placed, {pod["metadata"]["name"]: pod["metadata"]["uid"] for pod in cluster.pods()}


def moved_events(cluster) -> list[str]:
    return [event["message"] for event in cluster.events() if event["reason"] == "SpareTaken"]


def test_a_node_its_gang_reports_lost_with_its_lease_stopped_is_replaced_by_the_spare_at_once(cluster, operator):
    placed, uids = running_with_a_spare(cluster)
    lost = placed[2]
    renew(cluster, lost, 30)  # its kubelet stopped renewing 30 s ago; the Node is still Ready
    report_lost(cluster, f'[{{"nodeRank":2,"node":"{lost}","silentSeconds":8.0}}]')

    def replaced() -> list | None:
        pods = cluster.pods()
        new = [pod for pod in pods if pod["metadata"]["uid"] not in uids.values()]
        return new if len(pods) == 4 and len(new) == 1 else None

    (new,) = wait_for(replaced, timeout=30, what="gpt-2 made again on the spare")
    assert new["metadata"]["name"] == "gpt-2" and new["metadata"]["labels"]["paralleljob.io/node"] != lost
    (message,) = moved_events(cluster)
    assert f"node rank 2 from {lost} (stopped answering its gang (8s) and its Lease was last renewed" in message
    for name in ("gpt-0", "gpt-1", "gpt-3"):
        assert next(p for p in cluster.pods() if p["metadata"]["name"] == name)["metadata"]["uid"] == uids[name]
    assert cluster.status().get("restarts", 0) == 0


@pytest.mark.parametrize("signal", ["gang-only", "lease-only"])
def test_one_signal_alone_is_a_blip_and_costs_nothing_until_the_other_agrees(cluster, operator, signal):
    placed, uids = running_with_a_spare(cluster)
    node = placed[1]
    report = f'[{{"nodeRank":1,"node":"{node}","silentSeconds":6.0}}]'
    if signal == "gang-only":
        renew(cluster, node, 0)  # its Lease is fresh: the kubelet is alive
        report_lost(cluster, report)
    else:
        renew(cluster, node, 30)  # its gang does not report it: the gang still hears from it
    time.sleep(5)
    assert {pod["metadata"]["name"]: pod["metadata"]["uid"] for pod in cluster.pods()} == uids
    assert moved_events(cluster) == [] and cluster.status()["phase"] == "Running"
    # The other signal agrees: now the node is lost.
    if signal == "gang-only":
        renew(cluster, node, 30)
        report_lost(cluster, report.replace("6.0", "21.0"))  # the coordinator's next report
    else:
        report_lost(cluster, report)
    wait_for(lambda: moved_events(cluster), timeout=30, what="the move to the spare")


def test_a_lease_going_stale_in_the_middle_of_a_pass_moves_the_node_rank_not_the_gang(cluster, server, operator):
    """A pass weighs the gang's report once for all its steps. Each Lease read here takes 6 s, so the Lease
    (renewed 15 s ago, threshold 20 s) is fresh when the pass first reads it and stale 6 s later: a pass that
    read it again in supervision, after its spare step had found nothing, restarted the whole gang (a CI
    rehearsal's failure of the test above, when its report landed between those two reads)."""
    placed, uids = running_with_a_spare(cluster)
    lost = placed[2]
    server.latency[("get", "leases")] = 6.0
    renew(cluster, lost, 15)
    report_lost(cluster, f'[{{"nodeRank":2,"node":"{lost}","silentSeconds":8.0}}]')

    def reasons() -> list[str]:
        return [event["reason"] for event in cluster.events()]

    wait_for(lambda: {"SpareTaken", "Restarting"} & set(reasons()), timeout=60, what="the lost node acted on")
    (message,) = moved_events(cluster)
    assert f"node rank 2 from {lost} (stopped answering its gang" in message

    def made_again() -> list | None:
        return [pod for pod in cluster.pods() if pod["metadata"]["uid"] not in uids.values()] or None

    new = wait_for(made_again, timeout=30, what="gpt-2 made again on the spare")
    assert [pod["metadata"]["name"] for pod in new] == ["gpt-2"]
    for name in ("gpt-0", "gpt-1", "gpt-3"):
        assert next(p for p in cluster.pods() if p["metadata"]["name"] == name)["metadata"]["uid"] == uids[name]
    assert "Restarting" not in reasons() and cluster.status().get("restarts", 0) == 0
