"""A ParallelJob dispatched by MultiKueue (testcluster/multikueue.py): two upstream control planes on this
machine, a manager and a worker, each with the real Kueue (the manager's with `multiKueue.externalFrameworks`
naming the kind) and the chart installed with kueue.enabled, as docs/install.md (MultiKueue) tells a user.

Covered: a job labelled for the manager's ClusterQueue, whose admission check is MultiKueue's, with
`spec.managedBy: kueue.x-k8s.io/multikueue`, runs on the worker (its pod there, none on the manager); the
worker's status (phase, step, loss) shows in `kubectl get pj` on the manager; deleting the job on the manager
deletes it, its Workload and its pod on the worker; a job that ends on the worker ends on the manager
(Succeeded at its last step, its Workload Finished) and Kueue removes the worker's copy. The job is the quickstart's model on one rank, without
checkpoints, long enough to be running when it is deleted.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from testcluster import kueue, multikueue, polling
from testcluster.product import Product
from testcluster.quickstart import cluster_quickstart

pytestmark = pytest.mark.slow
KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"
JOBS_API = "/apis/paralleljob.io/v1alpha1"
QUEUE = "team"
CLUSTER_QUEUE = "dispatch"


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Product, Product]]:
    """(manager, worker): one 1-GPU node each, Kueue on both, the chart with kueue.enabled on both, and the
    manager's MultiKueue objects naming the worker."""
    folder = tmp_path_factory.mktemp("multikueue")
    started: list[Product] = []
    try:
        manager = Product(folder / "manager", nodes=1, gpus_per_node=1)
        started.append(manager)
        worker = Product(folder / "worker", nodes=1, gpus_per_node=1)
        started.append(worker)
        kueue.up(manager.cluster.state, multikueue=True)
        kueue.up(worker.cluster.state)
        for product in (manager, worker):
            product.install("kueue.enabled=true")
        multikueue.connect(manager.cluster.state, worker.cluster.state, "worker")
        yield manager, worker
    finally:
        for product in reversed(started):
            product.stop()


def apply(product: Product, *objects: dict[str, Any]) -> None:
    product.kubectl("apply", "-f", "-", stdin="\n---\n".join(yaml.safe_dump(obj) for obj in objects))


def queues(namespace: str, admission_check: str | None) -> list[dict[str, Any]]:
    """A flavour, a ClusterQueue of 1 GPU (with the admission check on the manager) and a LocalQueue."""
    flavor = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "any"}}
    quotas = [{"name": "nvidia.com/gpu", "nominalQuota": 1}, {"name": "cpu", "nominalQuota": 64}]
    spec: dict[str, Any] = {
        "namespaceSelector": {},
        "resourceGroups": [
            {"coveredResources": ["nvidia.com/gpu", "cpu"], "flavors": [{"name": "any", "resources": quotas}]}
        ],
    }
    if admission_check:
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": admission_check}]}
    cluster_queue = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": CLUSTER_QUEUE},
        "spec": spec,
    }
    local = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": QUEUE, "namespace": namespace},
        "spec": {"clusterQueue": CLUSTER_QUEUE},
    }
    return [flavor, cluster_queue, local]


def dispatched_job(name: str, namespace: str) -> dict[str, Any]:
    """The quickstart's model on one rank, synthetic data, no checkpoints, many steps; managed by MultiKueue."""
    job = cluster_quickstart(steps=100000)
    job["metadata"] = {"name": name, "namespace": namespace, "labels": {"kueue.x-k8s.io/queue-name": QUEUE}}
    job["spec"]["parallelism"] = {"pipeline": 1, "tensor": 1, "data": 1}
    job["spec"]["gpusPerNode"] = 1
    job["spec"].pop("checkpoint", None)
    job["spec"]["training"]["logInterval"] = 1
    job["spec"]["template"] = {"env": [{"name": "PARALLELJOB_STATUS_INTERVAL", "value": "1"}]}
    job["spec"]["managedBy"] = multikueue.CONTROLLER
    return job


def get(product: Product, path: str) -> dict[str, Any] | None:
    response = product.admin.send("GET", path)
    return dict(response.json()) if response.ok else None


def pods(product: Product, namespace: str, job: str) -> list[dict[str, Any]]:
    found = get(product, f"/api/v1/namespaces/{namespace}/pods?labelSelector=paralleljob.io/job%3D{job}") or {}
    return list(found.get("items") or [])


def row(product: Product, namespace: str, job: str) -> dict[str, str]:
    """`kubectl get pj` as a user reads it: header -> cell, cut at the header's columns."""
    header, line = product.kubectl("get", "pj", job, "-n", namespace).splitlines()
    starts = [i for i, c in enumerate(header) if c != " " and (i == 0 or header[i - 1] == " ")]
    return {header[a:b].strip(): line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)}


def wait_for(clusters: tuple[Product, Product], what: str, met: Any, timeout: float = 240) -> Any:
    try:
        return polling.wait_for(met, timeout, what)
    except TimeoutError as error:
        seen = []
        for name, product in zip(("manager", "worker"), clusters, strict=True):
            log = (product.cluster.folder / "logs" / "kueue.log").read_text(errors="replace")[-4000:]
            listed = product.kubectl("get", "pj,workloads,clusterqueues,pods", "-A", "-o", "wide")
            seen.append(f"=== {name}\n{listed}\n--- kueue:\n{log}\n{product.what_was_seen()}")
        pytest.fail(f"{error}\n" + "\n".join(seen))


def queued_namespace(clusters: tuple[Product, Product]) -> str:
    """A namespace of its own on both clusters, its LocalQueue dispatching through MultiKueue on the manager."""
    manager, worker = clusters
    namespace = f"mk-{uuid.uuid4().hex[:6]}"
    for product in clusters:
        product.kubectl("create", "namespace", namespace)
    apply(worker, *queues(namespace, None))
    apply(manager, *queues(namespace, multikueue.ADMISSION_CHECK))
    return namespace


def test_a_job_on_the_manager_runs_on_the_worker_shows_its_progress_on_the_manager_and_its_deletion_cascades(
    clusters: tuple[Product, Product],
) -> None:
    manager, worker = clusters
    namespace = queued_namespace(clusters)
    job = "dispatched"
    apply(manager, dispatched_job(job, namespace))
    path = f"{JOBS_API}/namespaces/{namespace}/paralleljobs/{job}"

    # Kueue made the job on the worker, labelled with the Workload it made there, which the worker's operator
    # adopted; the gang runs there, and nothing runs on the manager.
    wait_for(clusters, "the job's pod on the worker", lambda: pods(worker, namespace, job))
    remote = get(worker, path) or {}
    assert remote["metadata"]["labels"][multikueue_label()] == f"paralleljob-{job}", remote["metadata"]
    assert "managedBy" not in remote["spec"], remote["spec"]
    workload = get(worker, f"{KUEUE_API}/namespaces/{namespace}/workloads/paralleljob-{job}") or {}
    owners = workload["metadata"].get("ownerReferences") or []
    assert [(o["kind"], o["uid"], o.get("controller")) for o in owners] == [
        ("ParallelJob", remote["metadata"]["uid"], True)
    ], owners
    assert [p["spec"]["nodeName"] for p in pods(worker, namespace, job)] == ["gpu-0"]

    # The worker's progress shows on the manager, as `kubectl get pj` prints it.
    def progressed() -> dict[str, str] | None:
        status = (get(manager, path) or {}).get("status") or {}
        steps = int((status.get("progress") or {}).get("step") or 0)
        return row(manager, namespace, job) if status.get("phase") == "Running" and steps >= 2 else None

    shown = wait_for(clusters, "Running at step 2 on the manager", progressed)
    assert shown["PHASE"] == "Running" and int(shown["STEP"]) >= 2 and shown["LOSS"], shown
    assert pods(manager, namespace, job) == []
    assert get(manager, f"/api/v1/namespaces/{namespace}/configmaps/{job}-config") is None

    # Deleting the job on the manager deletes it on the worker, with its Workload and its pod.
    manager.kubectl("delete", "pj", job, "-n", namespace, "--wait=false")
    gone = lambda: get(worker, path) is None and not pods(worker, namespace, job)  # noqa: E731
    wait_for(clusters, "the job and its pod gone from the worker", gone, 120)
    wl_path = f"{KUEUE_API}/namespaces/{namespace}/workloads/paralleljob-{job}"
    wait_for(clusters, "the worker's Workload gone", lambda: get(worker, wl_path) is None, 60)


def test_a_job_that_ends_on_the_worker_ends_on_the_manager_and_leaves_the_worker(
    clusters: tuple[Product, Product],
) -> None:
    manager, worker = clusters
    namespace = queued_namespace(clusters)
    job = dispatched_job("short", namespace)
    job["spec"]["training"]["steps"] = 3
    apply(manager, job)
    path = f"{JOBS_API}/namespaces/{namespace}/paralleljobs/short"
    wl_path = f"{KUEUE_API}/namespaces/{namespace}/workloads/paralleljob-short"

    def finished() -> bool:
        found = get(manager, wl_path) or {}
        conditions = {c["type"]: c["status"] for c in (found.get("status") or {}).get("conditions") or []}
        return conditions.get("Finished") == "True"

    wait_for(clusters, "the manager's Workload Finished", finished, 300)
    # The worker's final status stays on the manager; Kueue then removes the worker's copy.
    shown = row(manager, namespace, "short")
    assert shown["PHASE"] == "Succeeded" and shown["STEP"] == "3", shown
    wait_for(clusters, "the worker's copy removed", lambda: get(worker, path) is None, 120)
    assert pods(manager, namespace, "short") == []


def multikueue_label() -> str:
    return "kueue.x-k8s.io/prebuilt-workload-name"
