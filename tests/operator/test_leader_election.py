"""One active operator: with `--leader-elect` (as the chart runs it, with its RBAC), a replica that does not hold
the Lease acts on nothing, its watches' wake-ups and timers included, and says who holds it; once the Lease is
free it leads, reports another operator whose Lease says it manages the same namespaces, and when another
holder takes the Lease it exits at once."""

from __future__ import annotations

import datetime
import socket
import threading
import time
import urllib.request

import kubernetes
import pytest

from tests.chart.helpers import RELEASE_NAMESPACE, only, render
from tests.operator.helpers import Operator, install_operator_rbac, job_doc, operator_requests, wait_for

TWO_NODES = {"pipeline": 2, "tensor": 4, "data": 1}
LEASE_SECONDS = "6"  # short, for the test; still above what this loaded machine needs to renew in time
WRITES = ("create", "patch", "update", "delete")


def chart_leader_election_args() -> list[str]:
    """The leader-election flags of the chart's Deployment (its Lease, in the release namespace)."""
    args = only(render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    return [a for a in args if a.startswith(("--leader-elect", "--leader-election-"))]


def chart_lease_name() -> str:
    (flag,) = (a for a in chart_leader_election_args() if a.startswith("--leader-election-lease="))
    return flag.split("=", 1)[1]


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


def micro_time() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class OtherHolder:
    """Another operator's replica holding a Lease and renewing it every half second."""

    def __init__(self, cluster, namespace: str, name: str, identity: str, annotations: dict | None = None) -> None:
        self.api = kubernetes.client.CoordinationV1Api(cluster.client)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.metadata = {"name": name, "labels": {"paralleljob.io/operator-lease": "true"}, "annotations": annotations}
        self._stop = threading.Event()

    def spec(self) -> dict:
        now = micro_time()
        return {"holderIdentity": self.identity, "leaseDurationSeconds": 3, "acquireTime": now, "renewTime": now}

    def take(self) -> OtherHolder:
        """Create the Lease, or take it over from whoever holds it (retrying while their renewals conflict)."""
        for _ in range(50):
            try:
                lease = self.api.read_namespaced_lease(self.name, self.namespace)
            except kubernetes.client.ApiException as error:
                if error.status != 404:
                    raise
                self.api.create_namespaced_lease(self.namespace, {"metadata": self.metadata, "spec": self.spec()})
                break
            lease.spec = self.spec()
            if self._replaced(lease):
                break
        else:
            raise AssertionError(f"could not take the Lease {self.name}")
        threading.Thread(target=self._renew, daemon=True).start()
        return self

    def _replaced(self, lease) -> bool:
        try:
            self.api.replace_namespaced_lease(self.name, self.namespace, lease)
        except kubernetes.client.ApiException as error:
            if error.status != 409:
                raise
            return False
        return True

    def _renew(self) -> None:
        while not self._stop.wait(0.5):
            try:
                lease = self.api.read_namespaced_lease(self.name, self.namespace)
                lease.spec.holder_identity, lease.spec.renew_time = self.identity, micro_time()
                self._replaced(lease)
            except Exception:  # the test cluster stopping at the end of the test
                return

    def release(self) -> None:
        self._stop.set()


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
        lease = kubernetes.client.CoordinationV1Api(cluster.client).read_namespaced_lease(
            chart_lease_name(), RELEASE_NAMESPACE
        )
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
