"""ParallelJobs under Kueue's Topology-Aware Scheduling (TAS): the real Kueue controller (testcluster/kueue.py,
TAS on by default in the pinned v0.17.0) and the chart with `kueue.enabled`, on six 2-GPU nodes in two blocks of
a rack of two nodes and a rack of one, a Kueue `Topology` of block, rack and hostname, and a ResourceFlavor
naming it, as docs/install.md sets them up.

Covered: a 2x2x2 job (four 2-GPU nodes, a pipeline replica = two nodes) is admitted with a topology request
(a slice per replica, required in a rack), placed on exactly the nodes Kueue assigned, by the planner's cost
model, with each pipeline replica inside one rack and so one block; its pods carry Kueue's TAS annotation and
hostname nodeSelector; a plain TAS batch Job queued beside it gets the other GPUs. A job whose one pipeline
replica (four nodes) fits no block waits Queued with Kueue's reason and is never admitted, so never released.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from paralleljob import planning
from paralleljob.api import validate_document
from paralleljob.planning.inventory import build_cluster
from testcluster import controlplane, kueue
from testcluster.api import CHART, RELEASE, RELEASE_NAMESPACE
from testcluster.product import Product
from testcluster.quickstart import cluster_quickstart
from tests.upstream.helpers import wait_for_kueue

pytestmark = [pytest.mark.slow, pytest.mark.both_releases]
KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"
BLOCK, RACK, HOST = "example.com/block", "example.com/rack", "kubernetes.io/hostname"
# Node -> (block, rack): block b0 = rack r0 (gpu-0, gpu-1) + rack r1 (gpu-2); block b1 = r2 (gpu-3, gpu-4) + r3.
RACKS = {
    "gpu-0": ("b0", "r0"),
    "gpu-1": ("b0", "r0"),
    "gpu-2": ("b0", "r1"),
    "gpu-3": ("b1", "r2"),
    "gpu-4": ("b1", "r2"),
    "gpu-5": ("b1", "r3"),
}


@pytest.fixture(scope="module")
def product(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Product]:
    made = Product(tmp_path_factory.mktemp("kueue-tas"), nodes=6, gpus_per_node=2)
    try:
        for node, (block, rack) in RACKS.items():
            patch = {"metadata": {"labels": {BLOCK: block, RACK: rack, "pool": "racks"}}}
            made.admin.ok(made.admin.send("PATCH", f"/api/v1/nodes/{node}", patch))
        kueue.up(made.cluster.state)
        ports = [f"operator.healthPort={controlplane.free_port()}", f"metrics.port={controlplane.free_port()}"]
        made.helm(
            "install", RELEASE, str(CHART), "-n", RELEASE_NAMESPACE, "--create-namespace",
            "--set", ",".join([*ports, "kueue.enabled=true"]),
        )  # fmt: skip
        made.kubectl(
            "rollout", "status", "-n", RELEASE_NAMESPACE, f"deployment/{RELEASE}-paralleljob-operator", "--timeout=180s"
        )
        yield made
    finally:
        made.stop()


def apply(product: Product, *objects: dict[str, Any]) -> None:
    product.kubectl("apply", "-f", "-", stdin="\n---\n".join(yaml.safe_dump(obj) for obj in objects))


def kueue_object(kind: str, name: str, spec: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
    metadata = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": kind, "metadata": metadata, "spec": spec}


@pytest.fixture
def namespace(product: Product) -> Iterator[str]:
    """A namespace with a LocalQueue `team` on a ClusterQueue of 12 GPUs in the flavour `racks`, whose
    Topology is block, rack, hostname (the objects docs/install.md shows)."""
    name = f"t-{uuid.uuid4().hex[:6]}"
    product.kubectl("create", "namespace", name)
    levels = [{"nodeLabel": BLOCK}, {"nodeLabel": RACK}, {"nodeLabel": HOST}]
    quotas = [{"name": "nvidia.com/gpu", "nominalQuota": 12}, {"name": "cpu", "nominalQuota": 64}]
    groups = [{"coveredResources": ["nvidia.com/gpu", "cpu"], "flavors": [{"name": "racks", "resources": quotas}]}]
    apply(
        product,
        kueue_object("Topology", "racks", {"levels": levels}),
        kueue_object("ResourceFlavor", "racks", {"nodeLabels": {"pool": "racks"}, "topologyName": "racks"}),
    )
    apply(product, kueue_object("ClusterQueue", f"{name}-cq", {"namespaceSelector": {}, "resourceGroups": groups}))
    apply(product, kueue_object("LocalQueue", "team", {"clusterQueue": f"{name}-cq"}, name))
    yield name
    product.kubectl("delete", "namespace", name, "--wait=false")
    product.kubectl("delete", "clusterqueue", f"{name}-cq", "--wait=false")


def job(name: str, namespace: str, pipeline: int, tensor: int, data: int) -> dict[str, Any]:
    made = cluster_quickstart(2, 2)
    made["metadata"] = {"name": name, "namespace": namespace, "labels": {"kueue.x-k8s.io/queue-name": "team"}}
    made["spec"]["parallelism"] = {"pipeline": pipeline, "tensor": tensor, "data": data}
    made["spec"]["gpusPerNode"] = 2
    made["spec"]["model"]["layers"] = 4
    made["spec"]["checkpoint"]["volume"] = {"emptyDir": {}}
    made["spec"]["topology"] = {"levels": [BLOCK, RACK]}
    return made


def get(product: Product, path: str) -> dict[str, Any] | None:
    response = product.admin.send("GET", path)
    return dict(response.json()) if response.ok else None


def workload(product: Product, namespace: str, name: str) -> dict[str, Any]:
    return get(product, f"{KUEUE_API}/namespaces/{namespace}/workloads/{name}") or {}


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    found = [c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind]
    return found[0] if found else {}


def status(product: Product, namespace: str, name: str) -> dict[str, Any]:
    found = get(product, f"/apis/paralleljob.io/v1alpha1/namespaces/{namespace}/paralleljobs/{name}") or {}
    return dict(found.get("status") or {})


def hosts_of(found: dict[str, Any]) -> dict[str, int]:
    """Pods per host of a Workload's TopologyAssignment (the hostname level is the lowest: only it is listed)."""
    assignment = found["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"]
    assert assignment["levels"] == [HOST], assignment
    hosts: dict[str, int] = {}
    for piece in assignment["slices"]:
        values = piece["valuesPerLevel"][0]
        individual = values.get("individual") or {}
        names = [values["universal"]] * piece["domainCount"] if "universal" in values else [
            f"{individual.get('prefix', '')}{root}{individual.get('suffix', '')}" for root in individual["roots"]
        ]  # fmt: skip
        counts = piece["podCounts"]
        pods = [counts["universal"]] * piece["domainCount"] if "universal" in counts else counts["individual"]
        for host, count in zip(names, pods, strict=True):
            hosts[host] = hosts.get(host, 0) + count
    return hosts


def replicas_of(placement: list[dict[str, Any]], axis_order: str, sizes: dict[str, int]) -> dict[int, set[str]]:
    """Each data-parallel replica's nodes, from status.placement's ranks and the rank axis order."""
    axes = axis_order.split(",")  # slowest first, e.g. pipe,data,model
    strides, stride = {}, 1
    for axis in reversed(axes):
        strides[axis], stride = stride, stride * sizes[axis]
    found: dict[int, set[str]] = {}
    for entry in placement:
        first = int(str(entry["ranks"]).split("-")[0])
        found.setdefault(first // strides["data"] % sizes["data"], set()).add(entry["node"])
    return found


def test_a_2x2x2_job_gets_a_topology_request_lands_each_pipeline_replica_in_one_rack_and_shares_no_gpu(
    product: Product, namespace: str
) -> None:
    apply(product, job("gpt", namespace, 2, 2, 2))
    admitted = lambda: condition(workload(product, namespace, "paralleljob-gpt"), "Admitted").get("status") == "True"  # noqa: E731
    wait_for_kueue(product, "the Workload admitted", admitted)
    found = workload(product, namespace, "paralleljob-gpt")
    request = found["spec"]["podSets"][0]["topologyRequest"]
    # Four nodes fit no block (three nodes each): the gang is preferred in a block; a replica of two fits a rack.
    assert request == {"preferred": BLOCK, "podSetSliceRequiredTopology": RACK, "podSetSliceSize": 2}, request
    assigned = hosts_of(found)
    assert assigned == {"gpu-0": 1, "gpu-1": 1, "gpu-3": 1, "gpu-4": 1}, "one slice in each rack of two nodes"

    placed = wait_for_kueue(product, "placed", lambda: status(product, namespace, "gpt").get("placement"))
    seen = status(product, namespace, "gpt")
    assert {entry["node"] for entry in placed} == set(assigned), "exactly the nodes Kueue assigned"
    # Each pipeline replica (its two stages) inside one rack, hence one block: the cost model's choice of rank
    # to node, since Kueue's slices say nothing of which pod runs which rank.
    sizes = {"pipe": 2, "data": 2, "model": 2}
    for replica, nodes in replicas_of(placed, seen["axisOrder"], sizes).items():
        assert len({RACKS[node][1] for node in nodes}) == 1, (replica, nodes, placed)
    # The planner on those four nodes alone places the ranks the same way: the operator's cost model did it.
    nodes = [get(product, f"/api/v1/nodes/{name}") or {} for name in sorted(assigned)]
    resolved = validate_document(job("gpt", namespace, 2, 2, 2)).resolved
    assert resolved is not None
    plan = planning.plan_job(resolved, build_cluster(nodes))
    assert isinstance(plan, planning.Plan), plan
    assert {e.node_rank: e.node for e in plan.nodes} == {e["nodeRank"]: e["node"] for e in placed}

    pods = wait_for_kueue(
        product,
        "four pods",
        lambda: len(pods_of(product, namespace, "gpt")) == 4 and pods_of(product, namespace, "gpt"),
    )
    for pod in pods:
        annotations = pod["metadata"].get("annotations") or {}
        assert annotations.get("kueue.x-k8s.io/podset-preferred-topology") == BLOCK, annotations
        assert annotations.get("kueue.x-k8s.io/workload") == "paralleljob-gpt", annotations
        assert pod["spec"]["nodeSelector"][HOST] == pod["metadata"]["labels"]["paralleljob.io/node"], pod["spec"]

    # A plain batch Job asking Kueue's TAS for two 1-GPU pods in one block gets GPUs ours do not hold.
    apply(product, plain_tas_job(namespace))

    def plain_admitted() -> bool:
        found = workload(product, namespace, plain_workload_name(product, namespace))
        return condition(found, "Admitted").get("status") == "True"

    wait_for_kueue(product, "the plain Job's Workload admitted", plain_admitted)
    theirs = hosts_of(workload(product, namespace, plain_workload_name(product, namespace)))
    assert not set(theirs) & set(assigned), (theirs, assigned)
    assert sum(theirs.values()) == 2 and set(theirs) <= {"gpu-2", "gpu-5"}, theirs


def pods_of(product: Product, namespace: str, name: str) -> list[dict[str, Any]]:
    found = get(product, f"/api/v1/namespaces/{namespace}/pods?labelSelector=paralleljob.io/job%3D{name}") or {}
    return list(found.get("items") or [])


def plain_tas_job(namespace: str) -> dict[str, Any]:
    """A suspended batch Job in the same queue asking for two 1-GPU pods in one block (Kueue's annotation)."""
    container = {
        "name": "c",
        "image": "busybox",
        "command": ["sleep", "600"],
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
    }
    template = {
        "metadata": {"annotations": {"kueue.x-k8s.io/podset-required-topology": BLOCK}},
        "spec": {"restartPolicy": "Never", "containers": [container]},
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "plain", "namespace": namespace, "labels": {"kueue.x-k8s.io/queue-name": "team"}},
        "spec": {"suspend": True, "parallelism": 2, "completions": 2, "template": template},
    }


def plain_workload_name(product: Product, namespace: str) -> str:
    found = get(product, f"{KUEUE_API}/namespaces/{namespace}/workloads") or {}
    names = [w["metadata"]["name"] for w in found.get("items") or [] if w["metadata"]["name"].startswith("job-plain")]
    return names[0] if names else "job-plain-none"


def test_a_job_whose_pipeline_replica_fits_no_block_waits_with_kueues_reason_and_is_never_admitted(
    product: Product, namespace: str
) -> None:
    # One pipeline replica of four 2-GPU nodes (pipeline 4 x tensor 2): no block has four nodes.
    apply(product, job("wide", namespace, 4, 2, 1))

    def refused() -> dict[str, Any] | None:
        found = workload(product, namespace, "paralleljob-wide")
        reserved = condition(found, "QuotaReserved")
        return found if reserved.get("status") == "False" and "topology" in reserved.get("message", "") else None

    found = wait_for_kueue(product, "Kueue's reason on the Workload", refused)
    assert found["spec"]["podSets"][0]["topologyRequest"] == {"required": BLOCK}
    kueue_says = condition(found, "QuotaReserved")["message"]
    # The job says what Kueue says, in its Queued condition and message.
    said = wait_for_kueue(
        product,
        "the job's message",
        lambda: (
            kueue_says in str(status(product, namespace, "wide").get("message")) and status(product, namespace, "wide")
        ),
    )
    assert said["phase"] == "Queued"
    # A small job queued after it is admitted and placed: Kueue has considered the wide one since, and still
    # never admitted it, so the operator never had a quota to give back.
    apply(product, job("small", namespace, 1, 2, 1))
    wait_for_kueue(product, "the small job placed", lambda: status(product, namespace, "small").get("placement"))
    wide = workload(product, namespace, "paralleljob-wide")
    assert not (wide.get("status") or {}).get("admission") and condition(wide, "Admitted").get("status") != "True"
    events = product.kubectl("get", "events", "-n", namespace, "--field-selector", "involvedObject.name=wide")
    assert "QuotaReleased" not in events, events
    kueue_events = product.kubectl(
        "get", "events", "-n", namespace, "--field-selector", "involvedObject.name=paralleljob-wide"
    )
    assert "QuotaReserved" not in kueue_events and "Admitted" not in kueue_events, kueue_events
