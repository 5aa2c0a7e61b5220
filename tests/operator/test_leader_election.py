"""One active operator: with `--leader-elect` (as the chart runs it, with its RBAC), a replica that does not hold
the Lease acts on nothing, its watches' wake-ups and timers included, and says who holds it; once the Lease is
free it leads, reports another operator whose Lease says it manages the same namespaces, and when another
holder takes the Lease it exits at once."""

from __future__ import annotations

import socket
import time
import urllib.request

import pytest

from tests.chart.helpers import RELEASE_NAMESPACE
from tests.operator.helpers import (
    TWO_NODES,
    Operator,
    OtherHolder,
    chart_leader_election_args,
    chart_lease_name,
    install_operator_rbac,
    job_doc,
    operator_requests,
    read_chart_lease,
    wait_for,
)

LEASE_SECONDS = "6"  # short, for the test; still above what this loaded machine needs to renew in time
WRITES = ("create", "patch", "update", "delete")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


HEALTH_PORT = free_port()


@pytest.fixture
def operator_args():
    liveness = f"http://127.0.0.1:{HEALTH_PORT}/healthz"
    return [*Operator.ARGS, *chart_leader_election_args(), "--lease-seconds", LEASE_SECONDS, "--liveness", liveness]


def healthy() -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{HEALTH_PORT}/healthz", timeout=5) as reply:
        return reply.status == 200


def operator_writes(apiserver) -> list[tuple[str, str, str, str]]:
    return [call for call in operator_requests(apiserver) if call[0] in WRITES and call[2] != "leases"]


def test_only_the_lease_holder_acts_reports_a_rival_and_exits_once_the_lease_is_taken(
    cluster, apiserver, operator_args, tmp_path
):
    kubeconfig = install_operator_rbac(apiserver, cluster.client)
    holder = OtherHolder(cluster, RELEASE_NAMESPACE, chart_lease_name(), "replica-b").take()
    cluster.core.create_namespace({"metadata": {"name": "other-ops"}})
    rival = OtherHolder(
        cluster, "other-ops", "second-release", "operator-2", {"paralleljob.io/managed-namespaces": "*"}
    )
    rival.take()
    log = tmp_path / "operator.log"
    operator = Operator(apiserver, log, kubeconfig, operator_args).start()
    try:
        # Standing by: nodes arrive (the node watch wakes the admission) and a job is created, and nothing is
        # written; the replica says who holds the Lease, and its liveness endpoint answers.
        cluster.add_nodes(2)
        cluster.apply(job_doc(parallelism=TWO_NODES))
        wait_for(lambda: "is held by replica-b" in log.read_text(), timeout=60, what="the holder reported")
        time.sleep(2)
        assert operator_writes(apiserver) == [] and cluster.pods() == [] and cluster.status() == {}
        assert healthy()

        # The holder stops renewing: this replica takes the Lease over, acts on the job it saw while standing
        # by, and reports the operator whose Lease manages every namespace too.
        holder.release()
        wait_for(lambda: len(cluster.pods()) == 2, timeout=30, what="the job's pods once it leads")
        (event,) = wait_for(lambda: rival_events(cluster), timeout=30, what="the RivalOperator Event")
        lease = read_chart_lease(cluster.client)
        assert event["involvedObject"]["uid"] == lease.metadata.uid  # what `kubectl describe lease` matches
        assert (
            "operator-2 (Lease other-ops/second-release) also manages ParallelJobs in every namespace"
            in (event["message"])
        )

        # Another replica takes the Lease: this one exits before that one may act.
        usurper = OtherHolder(cluster, RELEASE_NAMESPACE, chart_lease_name(), "usurper").take()
        wait_for(lambda: operator.process.poll() is not None, timeout=20, what="the old leader to exit")
        assert operator.process.returncode == 3
        usurper.release()
    finally:
        holder.release()
        rival.release()
        operator.stop()


def rival_events(cluster) -> list[dict]:
    return [e for e in cluster.events(RELEASE_NAMESPACE) if e["reason"] == "RivalOperator"]
