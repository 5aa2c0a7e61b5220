"""spec.network.preflight: fail, on the operator's side: a gang whose link check named a slow node restarts
planned without that node (status.excludedNodes), not the node of the pod that happened to report, with
NetworkVerified saying which link; any other network failure still fails the job at once (tests/operator/
test_network.py). The check itself, on real slowed links, is tests/trainer/test_linkcheck.py."""

from __future__ import annotations

import pytest

from paralleljob.handlers import gang
from paralleljob_contract.network import SLOW_LINK, NetworkFailure, slow_link_message
from tests.operator.helpers import job_doc, wait_for

SLOW = NetworkFailure("NetworkVerified", SLOW_LINK, slow_link_message(["gpu-009"], "data gpu-001-gpu-009 0.02 GB/s"))
PAIR = NetworkFailure("NetworkVerified", SLOW_LINK, slow_link_message(["gpu-002", "gpu-003"], "pipeline ..."))
NO_NODE = NetworkFailure("NetworkVerified", SLOW_LINK, "links slow but nobody named")
OTHER = NetworkFailure("NetworkVerified", "SocketFallback", "slow node gpu-009: NCCL uses sockets")


@pytest.mark.parametrize(
    ("network", "blamed_before", "restart_blames"),
    [
        (SLOW, (), ("gpu-009",)),
        (PAIR, (), ("gpu-002", "gpu-003")),
        (SLOW, ("gpu-004",), ("gpu-004", "gpu-009")),
        (NO_NODE, (), None),
        (OTHER, (), None),
        (None, (), None),
    ],
    ids=["one-node", "a-pair", "keeps-earlier-blame", "names-nobody", "other-reason", "no-network-failure"],
)
def test_slow_link_restart_blames_the_named_nodes_only(network, blamed_before, restart_blames) -> None:
    state = gang.GangState(
        "broken", 15, "pod gpt-0 failed", "gpt-0", "gpu-000", gang.NETWORK, network=network, blamed=blamed_before
    )
    restart = gang.slow_link_restart(state)
    if restart_blames is None:
        assert restart is None
        return
    assert restart is not None
    assert (restart.blamed, restart.node, restart.network) == (restart_blames, None, None)
    assert restart.cause == gang.NETWORK


def _conditions(status):
    return {c["type"]: c for c in status.get("conditions") or ()}


def test_a_slow_link_under_preflight_fail_restarts_the_gang_without_the_named_node(cluster, operator):
    cluster.add_nodes(17)
    cluster.apply(job_doc(network={"preflight": "fail"}))
    wait_for(lambda: len(cluster.pods()) == 16, what="16 pods")
    pods = cluster.pods()
    env = {e["name"]: e.get("value") for e in pods[0]["spec"]["containers"][0]["env"]}
    assert env["PARALLELJOB_NETWORK_PREFLIGHT"] == "fail"
    cluster.bind_all()
    wait_for(lambda: cluster.status().get("phase") == "Running", what="Running")
    reporter, slow = pods[0], pods[5]["metadata"]["labels"]["paralleljob.io/node"]
    # Every rank stops with the same line (linkcheck.check_at_start); the first pod to fail is rank 0's.
    line = NetworkFailure("NetworkVerified", SLOW_LINK, slow_link_message([slow], "data link 0.02 GB/s")).line()
    terminated = {"terminated": {"exitCode": 5, "reason": "Error", "message": line + "\n"}}
    container = {"name": "trainer", "image": "trainer:1", "imageID": "", "ready": False, "restartCount": 0}
    cluster.set_pod_phase(
        reporter["metadata"]["name"], "Failed", containerStatuses=[{**container, "state": terminated}]
    )

    def restarted():
        found = cluster.pods()
        attempts = {p["metadata"]["labels"]["paralleljob.io/attempt"] for p in found}
        return len(found) == 16 and attempts == {"1"} and cluster.status()

    status = wait_for(restarted, what="a new generation of 16 pods")
    assert status["excludedNodes"] == [slow]
    assert slow not in {p["metadata"]["labels"]["paralleljob.io/node"] for p in cluster.pods()}
    verified = _conditions(status)["NetworkVerified"]
    assert (verified["status"], verified["reason"]) == ("False", SLOW_LINK)
    assert verified["message"].startswith(f"slow node {slow}: ")
    assert status["phase"] in {"Restarting", "Pending", "Running"}
