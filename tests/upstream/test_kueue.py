"""ParallelJobs queued through the real Kueue controller (testcluster/kueue.py) on the upstream control plane,
with the chart installed by `helm install --set kueue.enabled=true` as docs/install.md tells a user: the
operator runs in a pod as the chart's ServiceAccount, and its pods run the bundled trainer (one rank each, to
keep CI's time) under the process kubelet.

Covered: admission by a ClusterQueue's quota inside its flavour's nodes, a second job waiting Queued while the
first holds the quota (no pod, no reservation, the first's pods untouched), Finished returning the quota to it;
borrowing within a cohort; preemption of a lower-priority job by a higher one with a checkpoint asked of rank 0,
a resume from it on the single-process loss curve, not counted as a restart; and a job without the queue label
ignoring Kueue (no Workload) while the queues are full.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from paralleljob_contract import jobfile
from testcluster import controlplane, kueue
from testcluster.api import CHART, RELEASE, RELEASE_NAMESPACE
from testcluster.product import Product
from testcluster.quickstart import LOSS_TOLERANCE, cluster_quickstart, losses
from tests.trainer.reference import train_reference
from tests.upstream.helpers import wait_for_kueue

pytestmark = [pytest.mark.slow, pytest.mark.both_releases]
CLAIM = "checkpoints"
KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"


@pytest.fixture(scope="module")
def product(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Product]:
    """Two 4-GPU nodes, gpu-0 labelled pool=a and gpu-1 pool=b; Kueue; the chart with kueue.enabled."""
    made = Product(tmp_path_factory.mktemp("kueue"))
    try:
        for node, pool in (("gpu-0", "a"), ("gpu-1", "b")):
            made.admin.ok(made.admin.send("PATCH", f"/api/v1/nodes/{node}", {"metadata": {"labels": {"pool": pool}}}))
        kueue.up(made.cluster.state)
        ports = [f"operator.healthPort={controlplane.free_port()}", f"metrics.port={controlplane.free_port()}"]
        # Always ask for a checkpoint before an eviction stops a gang (the default asks only past 5 minutes).
        values = [*ports, "kueue.enabled=true", "kueue.checkpointGraceSeconds=0"]
        made.helm(
            "install", RELEASE, str(CHART), "-n", RELEASE_NAMESPACE, "--create-namespace", "--set", ",".join(values)
        )
        made.kubectl(
            "rollout", "status", "-n", RELEASE_NAMESPACE, f"deployment/{RELEASE}-paralleljob-operator", "--timeout=180s"
        )
        yield made
    finally:
        made.stop()


@pytest.fixture
def namespace(product: Product) -> Iterator[str]:
    name = f"k-{uuid.uuid4().hex[:6]}"
    product.kubectl("create", "namespace", name)
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": CLAIM, "namespace": name},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": "1Gi"}},
            "storageClassName": "",
        },
    }
    apply(product, claim)
    yield name
    # What a test leaves running (a failed one included) must not hold GPUs or port 29500 for the next one.
    product.kubectl("delete", "namespace", name, "--wait=false")


def apply(product: Product, *objects: dict[str, Any]) -> None:
    product.kubectl("apply", "-f", "-", stdin="\n---\n".join(yaml.safe_dump(obj) for obj in objects))


def flavor(name: str, **node_labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": {"nodeLabels": node_labels} if node_labels else {},
    }


def cluster_queue(name: str, flavor_name: str, gpus: int, **spec: Any) -> dict[str, Any]:
    quotas = [
        {"name": "nvidia.com/gpu", "nominalQuota": gpus, **spec.pop("gpu_limits", {})},
        {"name": "cpu", "nominalQuota": 64},
    ]
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {"coveredResources": ["nvidia.com/gpu", "cpu"], "flavors": [{"name": flavor_name, "resources": quotas}]}
            ],
            **spec,
        },
    }


def local_queue(namespace: str, name: str, cluster_queue_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue_name},
    }


def small_job(
    name: str, namespace: str, *, queue: str | None, steps: int = 4, checkpoint_every: int = 0, priority: str = ""
) -> dict[str, Any]:
    """The quickstart's model on one rank (one pod, one GPU), synthetic data, checkpoints on the claim."""
    job = cluster_quickstart(steps, checkpoint_every or steps)
    job["metadata"] = {"name": name, "namespace": namespace, "labels": {}}
    if queue:
        job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = queue
    if priority:
        job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = priority
    job["spec"]["parallelism"] = {"pipeline": 1, "tensor": 1, "data": 1}
    job["spec"]["gpusPerNode"] = 1
    job["spec"]["checkpoint"]["volume"] = {"persistentVolumeClaim": {"claimName": CLAIM}}
    job["spec"]["training"]["logInterval"] = 1
    # Rank 0 reports every second, so that a checkpoint request reaches it within a step or two.
    job["spec"]["template"] = {"env": [{"name": "PARALLELJOB_STATUS_INTERVAL", "value": "1"}]}
    return job


def get(product: Product, path: str) -> dict[str, Any] | None:
    response = product.admin.send("GET", path)
    return dict(response.json()) if response.ok else None


def job_of(product: Product, namespace: str, name: str) -> dict[str, Any]:
    return get(product, f"/apis/paralleljob.io/v1alpha1/namespaces/{namespace}/paralleljobs/{name}") or {}


def phase(product: Product, namespace: str, name: str) -> str:
    return str((job_of(product, namespace, name).get("status") or {}).get("phase") or "")


def workload(product: Product, namespace: str, job: str) -> dict[str, Any] | None:
    return get(product, f"{KUEUE_API}/namespaces/{namespace}/workloads/paralleljob-{job}")


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    found = [c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c["type"] == kind]
    return found[0] if found else {}


def pods(product: Product, namespace: str, job: str) -> list[dict[str, Any]]:
    found = get(product, f"/api/v1/namespaces/{namespace}/pods?labelSelector=paralleljob.io/job%3D{job}") or {}
    return list(found.get("items") or [])


def test_quota_admits_one_job_inside_its_flavour_the_second_waits_queued_and_gets_the_quota_when_it_finishes(
    product: Product, namespace: str
) -> None:
    apply(product, flavor("pool-a", pool="a"), cluster_queue(f"{namespace}-cq", "pool-a", gpus=1))
    apply(product, local_queue(namespace, "team", f"{namespace}-cq"))
    apply(product, small_job("first", namespace, queue="team", steps=30))
    wait_for_kueue(product, "first Running", lambda: phase(product, namespace, "first") == "Running")
    apply(product, small_job("second", namespace, queue="team", steps=2))
    wait_for_kueue(product, "second Queued", lambda: phase(product, namespace, "second") == "Queued")

    # `kubectl get pj` says Queued, `kubectl get workloads` lists both, `kubectl describe pj` names the queue.
    table = product.kubectl("get", "pj", "-n", namespace)
    assert "second" in table and "Queued" in table, table
    assert "paralleljob-second" in product.kubectl("get", "workloads", "-n", namespace)
    described = product.kubectl("describe", "pj", "second", "-n", namespace)
    assert "queued in LocalQueue team" in described, described
    queued = condition(job_of(product, namespace, "second"), "Queued")
    assert queued["status"] == "True" and "LocalQueue team" in queued["message"], queued

    # The waiting job holds nothing: no pod, no attempt record (no reservation); the first's pod is untouched.
    first_pods = pods(product, namespace, "first")
    assert [p["spec"]["nodeName"] for p in first_pods] == ["gpu-0"], "placed inside pool-a (gpu-0)"
    assert pods(product, namespace, "second") == []
    assert get(product, f"/api/v1/namespaces/{namespace}/configmaps/second-config") is None
    second = workload(product, namespace, "second")
    assert second is not None and second["spec"]["podSets"][0]["count"] == 1
    assert (
        second["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"]
        == "1"
    )
    assert second["metadata"]["ownerReferences"][0]["kind"] == "ParallelJob"
    assert condition(second, "QuotaReserved").get("status") != "True"

    wait_for_kueue(product, "first Succeeded", lambda: phase(product, namespace, "first") == "Succeeded", 300)
    # Finished on its Workload returns the quota, and the second runs.
    finished = lambda: condition(workload(product, namespace, "first"), "Finished").get("status") == "True"  # noqa: E731
    wait_for_kueue(product, "first's Workload Finished", finished, 30)
    assert [p["metadata"]["uid"] for p in pods(product, namespace, "first")] == [
        p["metadata"]["uid"] for p in first_pods
    ]
    wait_for_kueue(product, "second Succeeded", lambda: phase(product, namespace, "second") == "Succeeded", 300)
    assert [p["spec"]["nodeName"] for p in pods(product, namespace, "second")] == ["gpu-0"]
    finished = lambda: condition(workload(product, namespace, "second"), "Finished").get("status") == "True"  # noqa: E731
    wait_for_kueue(product, "second's Workload Finished", finished, 30)


def test_a_job_borrows_idle_quota_within_its_cohort(product: Product, namespace: str) -> None:
    apply(product, flavor("any-gpu"))
    borrowing = {"borrowingLimit": 1}
    apply(
        product,
        cluster_queue(f"{namespace}-team-a", "any-gpu", gpus=1, cohortName=f"{namespace}-org", gpu_limits=borrowing),
        cluster_queue(f"{namespace}-team-b", "any-gpu", gpus=1, cohortName=f"{namespace}-org"),
        local_queue(namespace, "team-a", f"{namespace}-team-a"),
    )
    apply(
        product,
        *(borrower(name, namespace) for name in ("one", "two")),
    )

    # Team a's quota is 1 GPU; its second job borrows team b's idle one: both are admitted and placed at once.
    # (Both gangs run on this machine's one network, where two torchrun stores cannot both listen on port
    # 29500, so one of them may gang-restart until the other is done; on a cluster each pod has its own.)
    def both_placed() -> bool:
        admitted = all(
            condition(workload(product, namespace, job), "Admitted").get("status") == "True" for job in ("one", "two")
        )
        return admitted and all(pods(product, namespace, job) for job in ("one", "two"))

    def gpu_usage() -> dict[str, Any]:
        status = (get(product, f"{KUEUE_API}/clusterqueues/{namespace}-team-a") or {}).get("status") or {}
        found = [r for f in status.get("flavorsUsage") or [] for r in f["resources"] if r["name"] == "nvidia.com/gpu"]
        return found[0] if found else {}

    # Kueue writes a ClusterQueue's usage a moment after it admits, so the usage is read while both jobs hold
    # their quota (each is admitted until its Workload is Finished), not once after: a loaded machine saw 0.
    seen: list[dict[str, Any]] = []

    def borrowing() -> bool:
        seen.append(gpu_usage())
        return both_placed() and seen[-1].get("total") == "2"

    wait_for_kueue(product, "both admitted and placed, the usage counting both", borrowing, 300)
    for job in ("one", "two"):
        admission = (workload(product, namespace, job) or {})["status"]["admission"]
        assert admission["clusterQueue"] == f"{namespace}-team-a"
    assert seen[-1]["borrowed"] == "1", seen[-1]
    for job in ("one", "two"):
        wait_for_kueue(product, f"{job} Succeeded", lambda job=job: phase(product, namespace, job) == "Succeeded", 300)


def borrower(name: str, namespace: str) -> dict[str, Any]:
    """A short job in team a's queue that tries again for as long as the other one runs: on this machine's one
    network both gangs' coordinators listen on port 29500, so the second fails to start (Address already in use)
    until the first is done (a cluster gives each pod its own network). Three restarts were not enough for it."""
    job = small_job(name, namespace, queue="team-a", steps=6)
    job["spec"]["failurePolicy"] = {"backoffLimit": 30}
    return job


def test_a_gang_the_admitted_flavour_cannot_hold_gives_the_quota_back(product: Product, namespace: str) -> None:
    # Quota for 8 GPUs in pool-b, whose one node (gpu-1) has 4: Kueue admits a 2-node gang the planner cannot place.
    apply(product, flavor("pool-b", pool="b"), cluster_queue(f"{namespace}-cq", "pool-b", gpus=8))
    apply(product, local_queue(namespace, "team", f"{namespace}-cq"))
    job = small_job("wide", namespace, queue="team")
    job["spec"]["parallelism"], job["spec"]["gpusPerNode"] = {"pipeline": 1, "tensor": 1, "data": 8}, 4
    apply(product, job)

    def released() -> dict[str, Any] | None:
        found = workload(product, namespace, "wide")
        said = "cannot hold the gang" in str(job_of(product, namespace, "wide").get("status", {}).get("message"))
        return found if said and condition(found, "Requeued").get("reason") == "PlacementFailed" else None

    found = wait_for_kueue(product, "the quota given back, and the job saying why", released, 120)
    assert found["spec"]["podSets"][0]["count"] == 2
    assert found["status"].get("requeueState", {}).get("requeueAt"), "considered again only after a backoff"
    status = job_of(product, namespace, "wide")["status"]
    assert status["phase"] == "Queued" and "cannot hold the gang" in status["message"], status
    assert pods(product, namespace, "wide") == []
    config = get(product, f"/api/v1/namespaces/{namespace}/configmaps/wide-config")
    assert config is None, "no attempt was written, so no GPU is reserved"
    events = product.kubectl("get", "events", "-n", namespace, "--field-selector", "involvedObject.name=wide")
    assert "QuotaReleased" in events, events


def test_a_job_without_the_queue_label_ignores_kueue(product: Product, namespace: str) -> None:
    # A ClusterQueue with no GPU quota at all, and a LocalQueue: a labelled job would wait forever.
    apply(product, flavor("pool-b", pool="b"), cluster_queue(f"{namespace}-none", "pool-b", gpus=0))
    apply(product, local_queue(namespace, "empty", f"{namespace}-none"))
    apply(product, small_job("waits", namespace, queue="empty"), small_job("plain", namespace, queue=None))
    wait_for_kueue(product, "plain Succeeded", lambda: phase(product, namespace, "plain") == "Succeeded", 300)
    assert workload(product, namespace, "plain") is None
    assert "Queued" not in json.dumps(job_of(product, namespace, "plain")["status"]["conditions"])
    assert phase(product, namespace, "waits") == "Queued" and pods(product, namespace, "waits") == []


def test_preemption_checkpoints_the_lower_priority_job_which_resumes_on_the_same_loss_curve(
    product: Product, namespace: str, tmp_path: Path
) -> None:
    priorities = [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": name},
            "value": value,
        }
        for name, value in ((f"{namespace}-low", 100), (f"{namespace}-high", 1000))
    ]
    preemption = {"preemption": {"withinClusterQueue": "LowerPriority"}}
    apply(product, *priorities, flavor("pool-a", pool="a"))
    apply(product, cluster_queue(f"{namespace}-cq", "pool-a", gpus=1, **preemption))
    apply(product, local_queue(namespace, "team", f"{namespace}-cq"))
    low = small_job("low", namespace, queue="team", steps=40, checkpoint_every=20, priority=f"{namespace}-low")
    apply(product, low)
    folder = product.cluster.folder / "kubelet" / "pvc" / namespace / CLAIM / namespace
    metrics = folder / "low" / "metrics" / "metrics.jsonl"
    # Well before its first checkpoint (step 20): the checkpoint asked for is what saves its progress.
    wait_for_kueue(product, "low past step 3", lambda: metrics.exists() and max(losses(metrics) or {0: 0}) >= 3, 300)
    apply(product, small_job("high", namespace, queue="team", steps=2, priority=f"{namespace}-high"))

    wait_for_kueue(product, "low Queued by the eviction", lambda: phase(product, namespace, "low") == "Queued", 120)
    events = product.kubectl("get", "events", "-n", namespace, "--field-selector", "involvedObject.name=low")
    assert "CheckpointRequested" in events and "Evicted" in events, events
    record = json.loads(get(product, f"/api/v1/namespaces/{namespace}/configmaps/low-config")["data"]["attempt.json"])
    assert record["evicted"] and record["eviction"]["reason"] == "Preempted", record
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    saved = [r for r in records if r.get("event") == "checkpoint" and "request" in r]
    assert saved and saved[-1]["step"] > 3, "the requested checkpoint"
    requested_step = saved[-1]["step"]
    # It saved progress no scheduled checkpoint had (a loaded machine took the request past step 20 once).
    scheduled = [r["step"] for r in records if r.get("event") == "checkpoint" and "request" not in r]
    assert requested_step > max((step for step in scheduled if step <= requested_step), default=0), records

    wait_for_kueue(product, "high Succeeded", lambda: phase(product, namespace, "high") == "Succeeded", 300)
    wait_for_kueue(product, "low Succeeded", lambda: phase(product, namespace, "low") == "Succeeded", 400)
    final = job_of(product, namespace, "low")["status"]
    # An eviction is not a restart against backoffLimit: the restarts are the gang failures alone (on this
    # machine's one network a gang may fail if another job's torchrun holds port 29500 as it starts).
    events = product.kubectl("get", "events", "-n", namespace, "--field-selector", "involvedObject.name=low")
    failures = sum(1 for line in events.splitlines() if " Restarting " in line)
    assert final["restarts"] == failures and record["attempt"] == 0, (final["restarts"], events)
    resumed = [json.loads(line) for line in metrics.read_text().splitlines() if '"resume"' in line]
    # From the newest checkpoint the evicted gang saved: the one asked for, or a scheduled one after it when the
    # gang ran on a few steps before it was stopped (CI, loaded: asked for at 15, stopped after step 20).
    newest = max(r["step"] for r in records if r.get("event") == "checkpoint")
    assert newest >= requested_step and [r["step"] for r in resumed] == [newest], (resumed, records)

    config = get(product, f"/api/v1/namespaces/{namespace}/configmaps/low-config") or {}
    trained = json.loads(config["data"][jobfile.FILE_NAME])
    reference = train_reference(jobfile.parse_job_config(trained))
    on_cluster = losses(metrics)
    assert max(on_cluster) == 40
    assert on_cluster == pytest.approx({step: reference[step].loss for step in on_cluster}, **LOSS_TOLERANCE)
