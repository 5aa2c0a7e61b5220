"""A one-off read of a live cluster for `paralleljob plan --kubeconfig`: node records, the usage index of the
bound pods, and the ParallelJobs.

Read as the operator reads them (`paralleljob.k8s.informer`): Nodes and bound, unfinished pods listed in pages
of 500 and turned into the planner's records page by page, so a cluster of 50,000 pods is never in memory at
once. Through the kubeconfig (or the in-cluster config), without a kopf session. Any failure to reach the
cluster is one `LiveClusterError` line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from paralleljob.planning import inventory
from paralleljob.planning.usage import UsageIndex


class LiveClusterError(RuntimeError):
    """The live cluster could not be read; the message says why in one line."""


@dataclasses.dataclass(frozen=True)
class LiveCluster:
    """Node records in natural name order, the bound pods' usage, and every ParallelJob."""

    nodes: tuple[inventory.NodeInfo, ...]
    usage: UsageIndex
    jobs: list[Mapping[str, Any]]


class NodeRecords:
    """A listing's sink that keeps each node's planner record only."""

    def __init__(self) -> None:
        self.records: list[inventory.NodeInfo] = []

    def replace(self, objects: Iterable[Mapping[str, Any]]) -> int:
        self.records = [inventory.node_info(node) for node in objects]
        return len(self.records)

    def observe(self, event_type: str, obj: Mapping[str, Any]) -> bool:
        raise NotImplementedError("a one-off read does not watch")


def read_cluster(kubeconfig: str | None = None) -> LiveCluster:
    """The cluster through the kubeconfig (or in-cluster config); none of its ParallelJobs without the CRD."""
    # Lazy: only this path talks to a cluster, and `paralleljob` starts faster without the client.
    from paralleljob.k8s import informer, reads, session

    try:
        api = session.connect(kubeconfig)
        nodes, usage = NodeRecords(), UsageIndex()
        informer.Informer(api, informer.NODES, nodes).relist()
        informer.Informer(api, informer.BOUND_PODS, usage).relist()
        jobs = reads.list_jobs(api, missing_ok=True)
    except Exception as exc:  # any failure to reach the cluster is one line, never a traceback
        raise LiveClusterError(f"cannot read the live cluster ({exc.__class__.__name__}: {exc})") from None
    return LiveCluster(inventory.sort_nodes(nodes.records), usage, list(jobs))
