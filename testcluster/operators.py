"""The operator as a process (`Operator`: `paralleljob operator` with a kubeconfig, killed or stopped as a
test or benchmark needs), what a restarted operator's watches would list (`fresh_view`), and another replica
holding the leader-election Lease (`OtherHolder`). The operator's tests (tests/operator) and the cluster
benchmarks (bench/) use it.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import kubernetes

from paralleljob.handlers import reconcile
from paralleljob.handlers.nodes import NodeWatch
from paralleljob.planning.usage import UsageIndex
from testcluster.admin import Cluster


class Operator:
    """`paralleljob operator` as a process; `kill()` is SIGKILL, `start()` runs a fresh one."""

    # Short enough for tests: pods stuck Terminating on a lost node go after a second, and a NotReady node
    # breaks its gang at once (tests/operator/test_not_ready.py gives it a grace period).
    ARGS = ("--force-delete-after", "1", "--not-ready-grace", "0")

    def __init__(self, server: Any, log: Path, kubeconfig: Path, args: Sequence[str] = ARGS) -> None:
        self.server, self.log, self.kubeconfig, self.args = server, log, kubeconfig, list(args)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Operator:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        scoped = any(arg.startswith("--namespace") for arg in self.args)
        command = [
            sys.executable,
            "-m",
            "paralleljob",
            "operator",
            *([] if scoped else ["--all-namespaces"]),
            "--liveness",
            "",
            "--metrics-port",
            "0",
            "--log-format",
            "plain",
            "--log-level",
            "warning",
            "--trainer-image",
            "trainer:test",
            *self.args,
        ]
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        return self

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(3)
            except subprocess.TimeoutExpired:
                self.kill()


def fresh_view(cluster: Cluster) -> reconcile.NodeView:
    """What a restarted operator's watches list: the node records and the bound pods' usage."""
    client = cluster.core.api_client
    nodes, usage = NodeWatch(), UsageIndex()
    nodes.replace(client.sanitize_for_serialization(n) for n in cluster.core.list_node().items)
    usage.replace(
        client.sanitize_for_serialization(p)
        for p in cluster.core.list_pod_for_all_namespaces().items
        if p.spec.node_name and p.status.phase not in ("Succeeded", "Failed")
    )
    snapshot = nodes.snapshot()
    return reconcile.NodeView(snapshot.known, snapshot.not_ready, snapshot, usage.snapshot())


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


def micro_time() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
