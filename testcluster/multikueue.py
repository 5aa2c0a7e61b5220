"""MultiKueue across two upstream control planes of this machine: a manager cluster whose Kueue runs with
`multiKueue.externalFrameworks` naming the ParallelJob kind (`kueue.up(state, multikueue=True)`), and a worker
cluster with Kueue of its own. `connect` makes the manager's objects docs/install.md lists for MultiKueue:

- a Secret in kueue-system with the worker's kubeconfig under the key `kubeconfig` (Kueue v0.17 refuses a
  kubeconfig that reads a file: the CA is inline, `certificate-authority-data`, and the token too);
- a MultiKueueCluster naming that Secret, a MultiKueueConfig listing the cluster, and an AdmissionCheck of
  controller `kueue.x-k8s.io/multikueue` whose parameters name the MultiKueueConfig.

    kueue.up(manager.state, multikueue=True); kueue.up(worker.state)
    connect(manager.state, worker.state, "worker")   # returns once the MultiKueueCluster is Active
"""

from __future__ import annotations

import base64
import json
from typing import Any

from testcluster import controlplane, kueue

API = "kueue.x-k8s.io/v1beta2"
ADMISSION_CHECK = "multikueue"
CONTROLLER = "kueue.x-k8s.io/multikueue"


def worker_kubeconfig(worker: controlplane.State) -> dict[str, Any]:
    """The worker's admin kubeconfig with its CA inline, as Kueue's kubeconfig validation asks."""
    document = controlplane.kubeconfig_document(worker.server, worker.ca, "admin", worker.tokens["admin"])
    cluster = document["clusters"][0]["cluster"]
    cluster.pop("certificate-authority")
    cluster["certificate-authority-data"] = base64.b64encode(worker.ca.read_bytes()).decode()
    return document


def objects(worker: controlplane.State, cluster: str) -> list[tuple[str, dict[str, Any]]]:
    """(collection path, body) of what the manager needs to dispatch to `worker` under the name `cluster`."""
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"{cluster}-kubeconfig", "namespace": kueue.NAMESPACE},
        "stringData": {"kubeconfig": json.dumps(worker_kubeconfig(worker))},
    }
    source = {"kubeConfig": {"locationType": "Secret", "location": f"{cluster}-kubeconfig"}}
    kinds = "/apis/kueue.x-k8s.io/v1beta2"
    return [
        (f"/api/v1/namespaces/{kueue.NAMESPACE}/secrets", secret),
        (
            f"{kinds}/multikueueclusters",
            {
                "apiVersion": API,
                "kind": "MultiKueueCluster",
                "metadata": {"name": cluster},
                "spec": {"clusterSource": source},
            },
        ),
        (
            f"{kinds}/multikueueconfigs",
            {
                "apiVersion": API,
                "kind": "MultiKueueConfig",
                "metadata": {"name": cluster},
                "spec": {"clusters": [cluster]},
            },
        ),
        (
            f"{kinds}/admissionchecks",
            {
                "apiVersion": API,
                "kind": "AdmissionCheck",
                "metadata": {"name": ADMISSION_CHECK},
                "spec": {
                    "controllerName": CONTROLLER,
                    "parameters": {"apiGroup": "kueue.x-k8s.io", "kind": "MultiKueueConfig", "name": cluster},
                },
            },
        ),
    ]


def _active(manager: controlplane.State, cluster: str) -> bool:
    code, body = controlplane.get(manager, f"/apis/kueue.x-k8s.io/v1beta2/multikueueclusters/{cluster}")
    conditions = (
        {c["type"]: c for c in json.loads(body).get("status", {}).get("conditions") or []} if code == 200 else {}
    )
    return (conditions.get("Active") or {}).get("status") == "True"


def connect(manager: controlplane.State, worker: controlplane.State, cluster: str = "worker") -> None:
    """Create the manager's MultiKueue objects for `worker`; returns once Kueue says the cluster is Active."""
    for path, body in objects(worker, cluster):
        controlplane.post(manager, path, body)
    controlplane.wait_until(manager, "kueue", lambda: _active(manager, cluster))
