"""A whole test cluster on the upstream control plane: `controlplane` plus the process kubelet with a number of
fake GPU nodes, and a ReadWriteMany PersistentVolume pool so that checkpoint claims bind as they do on a
cluster with a shared filesystem. `scripts/local_cluster.py`, `make cluster-demo` and the tests use it.

    cluster = up(folder, nodes=2, gpus_per_node=4)   # returns once every node is Ready
    cluster.fault("kill-node", node="gpu-1")
    down(folder)

With `network_namespaces=True` (root and iproute2 only, `netns.available()`) each pod runs in a network
namespace of its own on a bridge (testcluster/podnet.py), and `fault("slow-link", ...)` slows a node's link.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testcluster import controlplane, netns, podnet

# Each claim of the tests binds one of these; the kubelet gives a claim a folder of its own by its name.
VOLUMES = 8


def gpu_nodes(count: int, gpus_per_node: int = 4) -> list[dict[str, Any]]:
    """Nodes as the NVIDIA GPU operator labels an H100 node; one NVLink domain per node."""
    return [
        {
            "metadata": {
                "name": f"gpu-{i}",
                "labels": {
                    "kubernetes.io/hostname": f"gpu-{i}",
                    "kubernetes.io/os": "linux",
                    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                    "nvidia.com/gpu.count": str(gpus_per_node),
                },
            },
            "status": {
                "capacity": {"nvidia.com/gpu": str(gpus_per_node), "cpu": "64", "memory": "512Gi", "pods": "110"},
                "allocatable": {"nvidia.com/gpu": str(gpus_per_node), "cpu": "64", "memory": "512Gi", "pods": "110"},
            },
        }
        for i in range(count)
    ]


@dataclasses.dataclass
class Cluster:
    state: controlplane.State

    @property
    def folder(self) -> Path:
        return self.state.folder

    @property
    def kubeconfig(self) -> Path:
        return self.state.kubeconfig

    def fault(self, kind: str, **where: str) -> None:
        """A kubelet fault: silence / resume a node, kill-node (its processes die too), kill-container, throttle (a
        pod held to `cores` CPUs by a cgroup quota), slow-link (with a pod network: `node`'s link, or that of the
        node where pod `namespace`/`pod` runs or next starts, held to `mbit` Mbit/s by tc, its later pods too)."""
        port = (self.folder / "kubelet-faults-port").read_text().strip()
        query = "&".join(f"{key}={value}" for key, value in where.items())
        request = urllib.request.Request(f"http://127.0.0.1:{port}/faults/{kind}?{query}", method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 204

    def container_folders(self) -> list[Path]:
        return sorted((self.folder / "kubelet" / "pods").glob("*"))


def _persistent_volumes(state: controlplane.State) -> None:
    for i in range(VOLUMES):
        volume = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"shared-{i}"},
            "spec": {
                "capacity": {"storage": "100Gi"},
                "accessModes": ["ReadWriteMany", "ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Delete",
                "storageClassName": "",
                "hostPath": {"path": f"/var/lib/paralleljob-test/shared-{i}"},
            },
        }
        controlplane.post(state, "/api/v1/persistentvolumes", volume)


def _nodes_ready(state: controlplane.State, names: set[str]) -> bool:
    code, body = controlplane.get(state, "/api/v1/nodes")
    if code != 200:
        return False
    ready = set()
    for node in json.loads(body)["items"]:
        conditions = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions") or []}
        taints = {t["key"] for t in node.get("spec", {}).get("taints") or []}
        if conditions.get("Ready") == "True" and "node.kubernetes.io/not-ready" not in taints:
            ready.add(node["metadata"]["name"])
    return names <= ready


def up(
    folder: Path,
    nodes: int = 2,
    gpus_per_node: int = 4,
    network_namespaces: bool = False,
    *,
    node_grace: str = controlplane.NODE_MONITOR_GRACE,
    before_controllers: Callable[[controlplane.State], None] | None = None,
) -> Cluster:
    """`node_grace` and `before_controllers` as `controlplane.up` takes them (the soak, bench/soak, shares the
    controller-manager with kwok's nodes and wants the CRD's dependents collected from the start)."""
    folder = folder.resolve()
    addresses: tuple[str, ...] = ()
    if network_namespaces:
        if not netns.available():
            raise controlplane.ControlPlaneError("network_namespaces needs root, iproute2 and tc")
        folder.mkdir(parents=True, exist_ok=True)
        subnet = netns.free_subnet()
        podnet.write_config(folder, f"k{subnet}", subnet)
        addresses = (f"{netns.SUBNET_PREFIX}.{subnet}.254",)
    state = controlplane.up(
        folder, serving_addresses=addresses, node_grace=node_grace, before_controllers=before_controllers
    )
    try:
        definitions = gpu_nodes(nodes, gpus_per_node)
        (folder / "nodes.json").write_text(json.dumps(definitions, indent=1))
        with (folder / "logs" / "kubelet.log").open("ab") as log:
            kubelet = subprocess.Popen(
                [sys.executable, "-m", "testcluster.kubelet", str(folder)],
                cwd=controlplane.REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        state.pids["kubelet"] = kubelet.pid
        state.save()
        _persistent_volumes(state)
        names = {n["metadata"]["name"] for n in definitions}
        controlplane.wait_until(state, "kubelet", lambda: _nodes_ready(state, names))
    except BaseException:
        controlplane.down(folder)
        raise
    return Cluster(state)


def down(folder: Path) -> None:
    controlplane.down(folder)
    if (config := podnet.read_config(folder.resolve())) is not None:
        netns.remove_leftovers(str(config["tag"]))


def attach(folder: Path) -> Cluster:
    """The cluster that `up` started in `folder` (from another process)."""
    return Cluster(controlplane.State.load(folder.resolve()))
