"""What the soak reads: the cluster's objects as the admin lists them (None while the API does not answer) and the
operator's process (its memory and its connections to the API server). Called by `run` and `faults`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import psutil
import requests

from bench.soak import jobs
from testcluster.api import Api

PARALLELJOBS = "/apis/paralleljob.io/v1alpha1/paralleljobs"
WORKLOADS = "/apis/kueue.x-k8s.io/v1beta2/workloads"
TIMEOUT = 10.0


def listing(api: Api, path: str, **params: str) -> list[dict[str, Any]] | None:
    """Every item under `path`, page by page; None when the API server does not answer in time or refuses."""
    items: list[dict[str, Any]] = []
    token = ""
    try:
        while True:
            query = {"limit": "500", **params, **({"continue": token} if token else {})}
            response = api.session.get(api.server + path, params=query, timeout=TIMEOUT, verify=str(api.state.ca))
            if not response.ok:
                return None
            page = response.json()
            items += page["items"]
            token = page["metadata"].get("continue") or ""
            if not token:
                return items
    except requests.RequestException:
        return None


@dataclasses.dataclass(frozen=True)
class Snapshot:
    nodes: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    configmaps: list[dict[str, Any]]
    workloads: list[dict[str, Any]]
    parallel_jobs: list[dict[str, Any]]


def snapshot(api: Api) -> Snapshot | None:
    """The objects the invariants read, each listed once; None if any listing failed (an outage)."""
    configmaps: list[dict[str, Any]] = []
    for namespace in jobs.NAMESPACES:
        found = listing(api, f"/api/v1/namespaces/{namespace}/configmaps")
        if found is None:
            return None
        configmaps += found
    parts = [listing(api, path) for path in ("/api/v1/nodes", "/api/v1/pods", WORKLOADS, PARALLELJOBS)]
    if any(part is None for part in parts):
        return None
    nodes, pods, workloads, parallel_jobs = parts
    assert nodes is not None and pods is not None and workloads is not None and parallel_jobs is not None
    return Snapshot(nodes, pods, configmaps, workloads, parallel_jobs)


def operator_process(pid: int, apiserver_port: int) -> tuple[float, int] | None:
    """The operator's resident memory in MiB and its TCP connections to the API server (its watches and its
    connection pool); None when it is not running."""
    try:
        process = psutil.Process(pid)
        rss = process.memory_info().rss / 2**20
        connections = [
            c
            for c in process.net_connections(kind="tcp")
            if c.raddr and c.raddr.port == apiserver_port and c.status == "ESTABLISHED"
        ]
    except psutil.Error:
        return None
    return rss, len(connections)
