"""Faults a test can inflict on the strict cluster's nodes, as they happen on real ones: a kubelet that stops
heartbeating (its node turns NotReady; its processes go on), a node that is lost (its processes are killed
too, and nothing reports their end), and an image that cannot be pulled."""

from __future__ import annotations

from tests.cluster.apiserver import ClusterThread
from tests.cluster.kubelet import ProcessKubelet


def kubelet_of(cluster: ClusterThread) -> ProcessKubelet:
    (kubelet,) = (c for c in cluster.components if isinstance(c, ProcessKubelet))
    return kubelet


async def _set_ready(cluster: ClusterThread, node: str, ready: bool) -> None:
    server = cluster.server
    async with server._lock:
        key = server.key_of("nodes", "", node)
        current = server.lookup("nodes", "", node)
        assert key is not None and current is not None, f"no node {node}"
        status = current.setdefault("status", {})
        others = [c for c in status.get("conditions") or [] if c.get("type") != "Ready"]
        reason = "KubeletReady" if ready else "NodeStatusUnknown"
        ready_condition = {"type": "Ready", "status": "True" if ready else "Unknown", "reason": reason}
        status["conditions"] = [*others, ready_condition]
        await server.replace_stored(key, current)


def stop_heartbeat(cluster: ClusterThread, node: str) -> None:
    """The node's kubelet stops reporting: the node goes NotReady (Unknown), its pods keep running unseen."""
    kubelet_of(cluster).silent_nodes.add(node)
    cluster.call(_set_ready(cluster, node, False))


def lose_node(cluster: ClusterThread, node: str) -> None:
    """The machine is gone: its pods' processes die and nobody reports it; the node goes NotReady."""
    stop_heartbeat(cluster, node)
    cluster.loop.call_soon_threadsafe(kubelet_of(cluster).kill_processes_of, node)


def fail_image_pulls(cluster: ClusterThread, image: str) -> None:
    """Pods using `image` stay Pending: ErrImagePull, then ImagePullBackOff until the kubelet tries again."""
    kubelet_of(cluster).pull_errors.add(image)


def kill_container(cluster: ClusterThread, namespace: str, pod: str) -> None:
    """SIGKILL to a pod's process (an OOM kill, a crash): it is reported Failed with exit code 137."""
    cluster.loop.call_soon_threadsafe(kubelet_of(cluster).kill_container, namespace, pod)
