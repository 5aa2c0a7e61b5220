"""A one-off read of a live cluster for `paralleljob plan --kubeconfig`: nodes, bound pods and ParallelJobs.

The operator reads through `Session` (reads.py); this is the CLI's path, through the kubeconfig (or the
in-cluster config), without a kopf session. Any failure to reach the cluster is one `LiveClusterError` line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from paralleljob.api import types as api_types
from paralleljob.planning import inventory


class LiveClusterError(RuntimeError):
    """The live cluster could not be read; the message says why in one line."""


def read_cluster(kubeconfig: str | None = None) -> inventory.ClusterObjects:
    """Nodes, bound pods and ParallelJobs through the kubeconfig (or in-cluster config), as camelCase dicts."""
    import kubernetes  # lazy: only this path talks to a cluster, and `paralleljob` starts faster without it

    try:
        try:
            kubernetes.config.load_kube_config(config_file=kubeconfig)
        except kubernetes.config.ConfigException:
            kubernetes.config.load_incluster_config()
        api = kubernetes.client.CoreV1Api()
        serialise = kubernetes.client.ApiClient().sanitize_for_serialization
        nodes = [serialise(node) for node in api.list_node().items]
        selector = "status.phase!=Succeeded,status.phase!=Failed"
        pods = [serialise(pod) for pod in api.list_pod_for_all_namespaces(field_selector=selector).items]
        jobs = _live_jobs(kubernetes)
    except Exception as exc:  # any failure to reach the cluster is one line, never a traceback
        raise LiveClusterError(f"cannot read the live cluster ({exc.__class__.__name__}: {exc})") from None
    return inventory.ClusterObjects(nodes, pods, jobs)


def _live_jobs(kubernetes: Any) -> list[Mapping[str, Any]]:
    """Every ParallelJob; none when the CRD is not installed. Others' placements not yet bound hold GPUs."""
    custom = kubernetes.client.CustomObjectsApi()
    try:
        listed = custom.list_cluster_custom_object(api_types.GROUP, api_types.VERSION, api_types.PLURAL)
    except kubernetes.client.exceptions.ApiException as exc:
        if exc.status == 404:
            return []
        raise
    return list(listed.get("items") or [])
