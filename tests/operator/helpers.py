"""What the tests of tests/operator share besides their fixtures (those stay in conftest.py): import these from here,
never from a conftest.
"""

from __future__ import annotations

import datetime
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from paralleljob.handlers import reconcile
from paralleljob.handlers.nodes import NodeWatch
from paralleljob.planning.usage import UsageIndex
from testcluster import polling
from testcluster import server as upstream
from testcluster.server import UpstreamServer
from tests.chart.helpers import RELEASE_NAMESPACE, only, render
from tests.manifests.helpers import JOB_YAML

OPERATOR_AGENTS = ("kopf", "paralleljob-operator")  # kopf's own requests, and paralleljob.k8s's


def operator_calls(server: UpstreamServer) -> list[tuple[str, str, str, str]]:
    """(verb, group, resource, namespace) of every resource request the operator process made (through the
    proxy)."""
    return [call[:4] for call in server.calls if call[4].startswith(OPERATOR_AGENTS) and call[2]]


# The chart's objects that make the operator's identity and permissions (the rest is its Deployment).
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


def chart_rbac(
    watch_namespaces: tuple[str, ...] = (),
    values: dict[str, Any] | None = None,
    release_namespace: str = RELEASE_NAMESPACE,
) -> tuple[dict[str, Any], ...]:
    """The operator's ServiceAccount and RBAC as `helm template` renders them with the chart's defaults (and
    these `watchNamespaces` and other values) for a release in `release_namespace`."""
    merged = {**({"watchNamespaces": list(watch_namespaces)} if watch_namespaces else {}), **(values or {})}
    return tuple(o for o in render(merged or None, release_namespace) if o["kind"] in RBAC_KINDS)


def install_operator_rbac(
    server: Any,
    client: kubernetes.client.ApiClient,
    watch_namespaces: tuple[str, ...] = (),
    values: dict[str, Any] | None = None,
    release_namespace: str = RELEASE_NAMESPACE,
) -> Path:
    """Apply the chart's ServiceAccount and RBAC (as the admin), with the namespaces they go in, and return a
    kubeconfig for that account."""
    objects = chart_rbac(watch_namespaces, values, release_namespace)
    core = kubernetes.client.CoreV1Api(client)
    existing = {n.metadata.name for n in core.list_namespace().items}
    for namespace in sorted(
        {release_namespace, *(o["metadata"].get("namespace") or release_namespace for o in objects)}
    ):
        if namespace not in existing:
            core.create_namespace({"metadata": {"name": namespace}})
    for obj in objects:
        kubernetes.utils.create_from_dict(client, obj)
    (account,) = (o for o in objects if o["kind"] == "ServiceAccount")
    return Path(server.kubeconfig_for(account["metadata"]["namespace"], account["metadata"]["name"]))


# The operator's scenarios run the manifests tests' job (tests/manifests/conftest.py) at 16 nodes: 4x4x4 on
# 4-GPU nodes, with two restarts allowed.
SIXTEEN_NODES = {"parallelism": {"pipeline": 4, "tensor": 4, "data": 4}, "failurePolicy": {"backoffLimit": 2}}


def job_doc(name: str = "gpt", namespace: str = "research", **spec: Any) -> dict[str, Any]:
    doc = yaml.safe_load(JOB_YAML)
    doc["metadata"] = {"name": name, "namespace": namespace}
    doc["spec"].update(SIXTEEN_NODES, **spec)
    return doc


def node_doc(
    name: str,
    gpus: int = 4,
    *,
    ready: bool = True,
    allocatable: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A GPU Node as GPU Feature Discovery labels it."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                "nvidia.com/gpu.memory": "81920",
                **(labels or {}),
            },
        },
        "status": {
            "allocatable": {
                "nvidia.com/gpu": str(gpus),
                "cpu": "96",
                "memory": "1Ti",
                "pods": "110",
                **(allocatable or {}),
            },
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def node_ready(doc: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in doc["status"]["conditions"])


class Cluster:
    """The test's view of the cluster, through the kubernetes client as the admin (as kubectl would)."""

    def __init__(self, server: Any, namespaces: Sequence[str] = ("research",)) -> None:
        self.server = server
        self.client = kubernetes.config.new_client_from_config(str(server.kubeconfig))
        self.core = kubernetes.client.CoreV1Api(self.client)
        self.custom = kubernetes.client.CustomObjectsApi(self.client)
        for namespace in namespaces:
            self.create_namespace(namespace)

    def create_namespace(self, name: str) -> None:
        """A namespace, once the controller-manager gave it its `default` ServiceAccount: pods are refused
        before that."""
        self.core.create_namespace({"metadata": {"name": name}})
        wait_for(lambda: self.core.read_namespaced_service_account("default", name), what=f"{name}'s ServiceAccount")

    def add_nodes(self, count: int, prefix: str = "gpu-", start: int = 0, **kwargs: Any) -> None:
        """Register Nodes as their kubelets would (the object, then its status). The API server taints every new
        Node not-ready (TaintNodesByCondition); the node-lifecycle controller lifts that from a Ready one, and the
        test plays it."""
        for index in range(start, start + count):
            doc = node_doc(f"{prefix}{index:03d}", **kwargs)
            name = doc["metadata"]["name"]
            self.core.create_node({"metadata": doc["metadata"]})
            self.core.patch_node_status(name, {"status": doc["status"]})
            if node_ready(doc):
                self.core.patch_node(name, {"spec": {"taints": None}})

    def apply(self, doc: dict[str, Any]) -> dict[str, Any]:
        ns = doc["metadata"]["namespace"]
        return self.custom.create_namespaced_custom_object("paralleljob.io", "v1alpha1", ns, "paralleljobs", doc)

    def job(self, name: str = "gpt", namespace: str = "research") -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object("paralleljob.io", "v1alpha1", namespace, "paralleljobs", name)

    def status(self, name: str = "gpt", namespace: str = "research") -> dict[str, Any]:
        return self.job(name, namespace).get("status") or {}

    def pods(self, job: str = "gpt", namespace: str = "research") -> list[dict[str, Any]]:
        client = self.core.api_client
        pods = self.core.list_namespaced_pod(namespace, label_selector=f"paralleljob.io/job={job}").items
        return sorted((client.sanitize_for_serialization(p) for p in pods), key=lambda p: p["metadata"]["name"])

    def set_pod_phase(self, name: str, phase: str, namespace: str = "research", **extra: Any) -> None:
        self.core.patch_namespaced_pod_status(name, namespace, {"status": {"phase": phase, **extra}})

    def bind(self, pod: str, node: str, namespace: str = "research") -> None:
        """What the scheduler does: POST pods/<pod>/binding (spec.nodeName cannot be patched)."""
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod},
            "target": {"kind": "Node", "name": node},
        }
        self.core.create_namespaced_pod_binding(pod, namespace, body, _preload_content=False)

    def bind_all(self, job: str = "gpt", namespace: str = "research", phase: str = "Running") -> None:
        """What the scheduler and kubelet would do: bind each pod to its pinned node and start it."""
        for pod in self.pods(job, namespace):
            if not pod["spec"].get("nodeName"):
                self.bind(pod["metadata"]["name"], pod["metadata"]["labels"]["paralleljob.io/node"], namespace)
            self.set_pod_phase(pod["metadata"]["name"], phase, namespace)

    def start_running(self, pods: int = 16, job: str = "gpt", namespace: str = "research") -> dict[str, Any]:
        """Wait for the job's pods, bind and start them as the scheduler and kubelet would, and wait until the
        job is Running; returns its status."""
        wait_for(lambda: len(self.pods(job, namespace)) == pods, what=f"{pods} pods of {job}")
        self.bind_all(job, namespace)
        return wait_for(
            lambda: self.status(job, namespace).get("phase") == "Running" and self.status(job, namespace),
            what="Running",
        )

    def set_node_ready(self, name: str, ready: bool) -> None:
        status = "True" if ready else "False"
        self.core.patch_node_status(name, {"status": {"conditions": [{"type": "Ready", "status": status}]}})

    def events(self, namespace: str = "research") -> list[dict[str, Any]]:
        client = self.core.api_client
        return [client.sanitize_for_serialization(e) for e in self.core.list_namespaced_event(namespace).items]


# What the cluster itself puts in every namespace: the controller-manager's root CA ConfigMap and `default`
# ServiceAccount.
CLUSTER_MADE = frozenset({"kube-root-ca.crt", "default"})


def made_here(listing: Any) -> list[str]:
    """Names of the objects of a listing, less what the cluster itself puts in every namespace."""
    return sorted(item.metadata.name for item in listing.items if item.metadata.name not in CLUSTER_MADE)


def wait_for(predicate: Callable[[], Any], timeout: float = 60, what: str = "condition") -> Any:
    """`testcluster.polling.wait_for`, an API error counting as not yet (the object may not exist yet)."""
    return polling.wait_for(predicate, timeout, what, tolerate=(kubernetes.client.ApiException,))


def operator_requests(server: UpstreamServer) -> list[tuple[str, str, str, str]]:
    """paralleljob.k8s's requests (kopf's list-and-watch is the framework's, made once at startup)."""
    return [c[:4] for c in server.calls if c[4].startswith("paralleljob-operator") and c[2]]


def finish_operator_passes(cluster: Cluster, name: str = "gpt", namespace: str = "research") -> None:
    """Return once the passes the operator started on the job before this call have most likely ended, shown by
    recorded requests: a job's passes run one after another (its coalescer key), so a read of the job after the
    second poke is a later pass than the one that read it after the first. Not a proof: one pass may read its
    job more than once. A test that needs one write of a pass waits for that write itself, then calls this to
    let what follows it settle."""
    for poke in ("1", "2"):
        mark = len(cluster.server.calls)
        patch = {"metadata": {"labels": {"test.paralleljob.io/poke": f"{time.monotonic_ns()}-{poke}"}}}
        cluster.custom.patch_namespaced_custom_object(
            "paralleljob.io", "v1alpha1", namespace, "paralleljobs", name, patch
        )

        def read_since(mark: int = mark) -> bool:
            later = cluster.server.calls[mark:]
            return any(
                c[0] == "get" and c[2] == "paralleljobs" and c[4].startswith("paralleljob-operator") for c in later
            )

        wait_for(read_since, what=f"the operator's pass over the change {poke}")


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


def _history(server: UpstreamServer) -> list[upstream.Change]:
    """The pod changes a test replays: the node agent's watch."""
    assert server.agent.gaps == 0, "the pod watch expired: the history has a gap"
    return server.history


def generations_overlapping(server: Any, job: str = "gpt") -> list[str]:
    """Replays the history of the job's pods (the node agent's watch): every moment a pod of one attempt was
    created while a pod of another attempt still existed (Terminating included)."""
    live: dict[str, str] = {}
    overlaps = []
    for change in _history(server):
        if change.plural != "pods" or change.labels.get("paralleljob.io/job") != job:
            continue
        attempt = change.labels.get("paralleljob.io/attempt", "")
        if change.kind == "DELETED":
            live.pop(change.name, None)
            continue
        if change.kind == "ADDED" and any(other != attempt for other in live.values()):
            overlaps.append(f"{change.name} (attempt {attempt}) created while {sorted(live.items())} existed")
        live[change.name] = attempt
    return overlaps


def gpus_oversubscribed(server: Any, gpus_per_node: int = 4) -> list[str]:
    """Replays the history of every pod: each moment the pods pinned to a node (label paralleljob.io/node)
    and not finished requested more GPUs than the node has."""
    holding: dict[tuple[str, str], tuple[str, int]] = {}
    found = []
    for change in _history(server):
        node = change.labels.get("paralleljob.io/node")
        if change.plural != "pods" or not node:
            continue
        key = (change.namespace, change.name)
        if change.kind == "DELETED" or change.phase in ("Succeeded", "Failed"):
            holding.pop(key, None)
            continue
        holding[key] = (node, change.gpus)
        used = sum(gpus for held_node, gpus in holding.values() if held_node == node)
        if used > gpus_per_node:
            found.append(f"{node}: {used} GPUs requested after {change.kind} {key}")
    return found


def restarted(cluster, attempt, pods=16):
    found = cluster.pods()
    attempts = {p["metadata"]["labels"]["paralleljob.io/attempt"] for p in found}
    return len(found) == pods and attempts == {str(attempt)} and cluster.status().get("restarts") == attempt


TWO_NODES = {"pipeline": 2, "tensor": 4, "data": 1}


def chart_leader_election_args() -> list[str]:
    """The leader-election flags of the chart's Deployment (its Lease, in the release namespace)."""
    args = only(render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    return [a for a in args if a.startswith(("--leader-elect", "--leader-election-"))]


def chart_lease_name() -> str:
    (flag,) = (a for a in chart_leader_election_args() if a.startswith("--leader-election-lease="))
    return flag.split("=", 1)[1]


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


KUBECTL = Path(__file__).resolve().parents[2] / ".tools" / "bin" / "kubectl"


def kubectl() -> str:
    if KUBECTL.is_file() and os.access(KUBECTL, os.X_OK):
        return str(KUBECTL)
    found = shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl not found: run scripts/install-k8s-tools.sh", pytrace=False)
    return found


def printed_row(kubeconfig: Path, columns: list[dict]) -> dict[str, str]:
    """One job's row of `kubectl get -o custom-columns`, split at the header's column starts."""
    spec = ",".join(f"{c['name'].upper()}:{c['jsonPath']}" for c in columns)
    completed = subprocess.run(
        [
            kubectl(),
            "--kubeconfig",
            str(kubeconfig),
            "get",
            "paralleljobs.paralleljob.io",
            "gpt",
            "-n",
            "research",
            "-o",
            f"custom-columns={spec}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    header, row = completed.stdout.splitlines()
    starts = [match.start() for match in re.finditer(r"\S+", header)]
    ends = [*starts[1:], None]
    return {column["name"]: row[start:end].strip() for column, start, end in zip(columns, starts, ends, strict=True)}
