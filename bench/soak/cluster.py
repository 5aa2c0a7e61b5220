"""What the soak runs on: the upstream control plane with the ParallelJob CRD, the process kubelet's few real
nodes (pool=real, the trainer runs there), kwok's fake nodes for the bulk of the cluster (pool=fake), Kueue with
a queue over the fake nodes, the checkpoint claim of the real jobs, and the operator as a process. Called by
`run`; everything is stopped at the end of `started`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import common, kwok
from bench.soak import jobs
from testcluster import cluster as process_cluster
from testcluster import controlplane, kueue
from testcluster import server as upstream
from testcluster.api import Api
from testcluster.operators import Operator

REAL_NODES, REAL_GPUS = 2, 2
FAKE_NODES = 40
# kwok renews every quarter of its Lease: 2 s here, so that the controller-manager's node grace can stay short
# for the process kubelet's nodes too (a hung real node is NotReady 10 s after its last heartbeat).
LEASE_SECONDS = 8
OPERATOR_ARGS = (*Operator.ARGS, "--kueue", "--trainer-image", "ghcr.io/paralleljob/trainer:soak")
QUEUE_GPUS = 64


@dataclasses.dataclass
class Soaked:
    cluster: process_cluster.Cluster
    api: Api
    fakes: kwok.Kwok
    operator: Operator
    real_nodes: list[str]
    fake_count: int = FAKE_NODES

    @property
    def state(self) -> controlplane.State:
        return self.cluster.state

    def new_fake_node(self) -> str:
        """One more kwok node (a lost node's replacement joining the cluster)."""
        doc = fake_node(self.fake_count)
        self.fake_count += 1
        self.api.ok(self.api.send("POST", "/api/v1/nodes", doc))
        return str(doc["metadata"]["name"])

    def checkpoints(self, name: str) -> Path:
        return self.cluster.folder / "kubelet" / "pvc" / jobs.REAL / jobs.CLAIM / jobs.REAL / name


def fake_node(i: int) -> dict[str, Any]:
    doc = common.node(i, jobs.FAKE_GPUS_PER_NODE)
    name = f"fake-{i:04d}"
    doc["metadata"]["name"] = name
    doc["metadata"]["labels"].update({"kubernetes.io/hostname": name, "pool": "fake"})
    return doc


def kueue_object(kind: str, name: str, spec: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
    metadata = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": kind, "metadata": metadata, "spec": spec}


def _queue(api: Api) -> None:
    quotas = [
        {"name": "nvidia.com/gpu", "nominalQuota": QUEUE_GPUS},
        {"name": "cpu", "nominalQuota": 100000},
        {"name": "memory", "nominalQuota": "100Ti"},
    ]
    groups = [
        {"coveredResources": ["nvidia.com/gpu", "cpu", "memory"], "flavors": [{"name": "fake", "resources": quotas}]}
    ]
    base = "/apis/kueue.x-k8s.io/v1beta2"
    api.create(f"{base}/resourceflavors", kueue_object("ResourceFlavor", "fake", {"nodeLabels": {"pool": "fake"}}))
    api.create(
        f"{base}/clusterqueues",
        kueue_object("ClusterQueue", "soak", {"namespaceSelector": {}, "resourceGroups": groups}),
    )
    local = kueue_object("LocalQueue", jobs.QUEUE, {"clusterQueue": "soak"}, jobs.QUEUED)
    api.create(f"{base}/namespaces/{jobs.QUEUED}/localqueues", local)


def _claim(api: Api) -> None:
    claim = {
        "metadata": {"name": jobs.CLAIM},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    api.create(f"/api/v1/namespaces/{jobs.REAL}/persistentvolumeclaims", claim)


@contextlib.contextmanager
def started(folder: Path) -> Iterator[Soaked]:
    made = process_cluster.up(
        folder / "cluster",
        nodes=REAL_NODES,
        gpus_per_node=REAL_GPUS,
        node_grace=kwok.node_grace(LEASE_SECONDS),
        before_controllers=upstream.install_crd,
    )
    try:
        api = Api(made.state, made.state.tokens["admin"])
        real = [f"gpu-{i}" for i in range(REAL_NODES)]
        for node in real:
            patch = {"metadata": {"labels": {"pool": "real"}}}
            api.ok(api.send("PATCH", f"/api/v1/nodes/{node}", patch))
        for namespace in jobs.NAMESPACES:
            api.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
        _claim(api)
        kueue.up(made.state)
        _queue(api)
        with kwok.Kwok(made.state, folder / "kwok.log", lease_seconds=LEASE_SECONDS) as fakes:
            kwok.write_nodes(api, [fake_node(i) for i in range(FAKE_NODES)], fakes, threads=8, timeout=300)
            operator = Operator(None, folder / "operator.log", made.state.kubeconfig, OPERATOR_ARGS).start()
            try:
                yield Soaked(made, api, fakes, operator, real)
            finally:
                operator.stop()
    finally:
        process_cluster.down(made.folder)
