"""A gang that cannot start is judged from the cluster's own facts: the start clocks run from the times the API
server wrote, compared with the server's present moment; one failed image pull is waited out; a pod stuck
ContainerCreating (a volume that does not mount) fails the attempt with a status message and a Warning Event; and
pods of the previous attempt that linger Terminating on a live node are reported, not waited on in silence.

On the strict emulator this ran with the server's clock an hour behind the operator's. The real API server writes
its timestamps with the machine's clock, and the fault proxy can skew only the Date header, so a skew here would
put the server's own timestamps an hour ahead of its Date: a cluster that cannot exist. The clock skew is
tested where the operator writes the times itself (test_admission_lock.py)."""

from __future__ import annotations

import pytest

from testcluster.server import UpstreamServer
from tests.operator.helpers import Operator, job_doc, wait_for

AN_HOUR = 3600.0
TIMEOUT = 4


@pytest.fixture
def apiserver(apiserver: UpstreamServer) -> UpstreamServer:
    """Kubelets that never confirm that a deleted pod's containers stopped (the old attempt's pods stay
    Terminating on Ready nodes)."""
    apiserver.termination_seconds = AN_HOUR
    return apiserver


@pytest.fixture
def operator_args():
    return [*Operator.ARGS, "--start-timeout", str(TIMEOUT), "--container-creating-timeout", str(TIMEOUT)]


def waiting(reason):
    container = {"name": "trainer", "image": "trainer:test", "imageID": "", "ready": False, "restartCount": 0}
    return {"phase": "Pending", "containerStatuses": [{**container, "state": {"waiting": {"reason": reason}}}]}


def bind_waiting(cluster, pod, reason):
    """What the scheduler and the kubelet report: the pod is bound to its planned node, its container waits."""
    node = cluster.core.read_namespaced_pod(pod, "research").metadata.labels["paralleljob.io/node"]
    cluster.bind(pod, node)
    cluster.core.patch_namespaced_pod_status(pod, "research", {"status": waiting(reason)})
    return node


def scheduled_at(cluster, pod):
    status = cluster.core.read_namespaced_pod_status(pod, "research").status
    (condition,) = (c for c in status.conditions if c.type == "PodScheduled")
    return condition.last_transition_time


def test_stalls_are_timed_on_the_servers_clock_and_a_failed_mount_is_reported(cluster, operator):
    server = cluster.server
    cluster.add_nodes(4)
    cluster.apply(job_doc(parallelism={"pipeline": 2, "tensor": 4, "data": 1}))
    wait_for(lambda: cluster.status().get("message", "").startswith("2 pods"), what="placed")
    # One failed pull is waited out (the kubelet tries again), however old the pod looks.
    pulling = bind_waiting(cluster, "gpt-0", "ErrImagePull")
    mounting = bind_waiting(cluster, "gpt-1", "ContainerCreating")
    since = scheduled_at(cluster, "gpt-1")
    status = wait_for(lambda: cluster.status().get("restarts") == 1 and cluster.status(), timeout=30, what="restart")
    restarted = server.clock()

    assert (restarted - since).total_seconds() >= TIMEOUT - 1, "restarted before the timeout on the server's clock"
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert ready["reason"] == "StartTimeout"
    assert ready["message"].startswith(f"pod gpt-1 stayed ContainerCreating on node {mounting} for {TIMEOUT}s")
    # Each Event is posted after the status write it goes with.
    warnings = wait_for(
        lambda: [e for e in cluster.events() if e["reason"] == "StartTimeout" and e["type"] == "Warning"],
        what="a StartTimeout Event",
    )
    assert "a volume that does not mount" in warnings[0]["message"]
    assert set(status["excludedNodes"]) == {pulling, mounting}

    # The old attempt's pods stay Terminating on their live nodes: the status and an Event say so.
    said = wait_for(lambda: "stuck Terminating" in cluster.status().get("message", "") and cluster.status())
    assert "the next attempt starts once it is gone" in said["message"]
    wait_for(lambda: [e for e in cluster.events() if e["reason"] == "StuckTerminating"], what="the Event")
    assert not server.force_deleted
