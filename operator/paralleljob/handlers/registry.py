"""The kopf handlers: each one only turns a watch event into a reconcile request.

Watches ParallelJobs (their own changes), the pods labelled with a job (phase changes, deletions) and Nodes
(readiness, capacity, labels: a pending job may fit now, a running gang may have lost a node). No handler
stores progress in annotations and none adds a finalizer, so deleting a job never waits for the operator,
and a quiet cluster sees no writes. `configure()` must be called before kopf starts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Hashable
from typing import Any

import kopf

from paralleljob.api import types as api_types
from paralleljob.handlers import metrics, reconcile
from paralleljob.handlers.coalescer import Coalescer
from paralleljob.handlers.nodes import NodeWatch
from paralleljob.k8s import reads
from paralleljob.k8s.session import Session, connect
from paralleljob.manifests import labels as child_labels

log = logging.getLogger(__name__)
NODES_CHANGED = "nodes-changed"


@dataclasses.dataclass
class Runtime:
    """What the handlers share, set by `configure()` and on startup."""

    settings: reconcile.Settings = dataclasses.field(default_factory=reconcile.Settings)
    metrics_port: int = 0
    kubeconfig: str | None = None
    session: Session | None = None
    nodes: NodeWatch = dataclasses.field(default_factory=NodeWatch)
    coalescer: Coalescer | None = None


RUNTIME = Runtime()


def configure(settings: reconcile.Settings, metrics_port: int = 0, kubeconfig: str | None = None) -> None:
    RUNTIME.settings, RUNTIME.metrics_port, RUNTIME.kubeconfig = settings, metrics_port, kubeconfig


def _pass(key: Hashable) -> object:
    assert RUNTIME.session is not None
    if key == NODES_CHANGED:
        return _jobs_to_recheck(RUNTIME.session)
    namespace, name = key  # type: ignore[misc]
    return reconcile.reconcile(RUNTIME.session, RUNTIME.settings, namespace, name, RUNTIME.nodes.not_ready())


def _jobs_to_recheck(session: Session) -> list[tuple[str, str]]:
    """Unfinished jobs: a pending one may fit now, a running one may have lost its node."""
    jobs = reads.list_jobs(session, RUNTIME.settings.namespaces)
    unfinished = [j for j in jobs if (j.get("status") or {}).get("phase") not in reconcile.TERMINAL]
    return [(j["metadata"]["namespace"], j["metadata"]["name"]) for j in unfinished]


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Our Events are posted by paralleljob.k8s.events; kopf's own log-to-Event posting would add writes.
    settings.posting.enabled = False
    RUNTIME.session = await asyncio.to_thread(connect, RUNTIME.kubeconfig)
    RUNTIME.coalescer = Coalescer(_pass)
    metrics.serve(RUNTIME.metrics_port)
    log.info("paralleljob operator started: %s", RUNTIME.settings)


@kopf.on.event(api_types.GROUP, api_types.VERSION, api_types.PLURAL)
async def job_changed(event: kopf.RawEvent, namespace: str | None, name: str, **_: Any) -> None:
    if event["type"] != "DELETED" and RUNTIME.coalescer:
        RUNTIME.coalescer.request((namespace, name))


@kopf.on.event("", "v1", "pods", labels={child_labels.JOB_LABEL: kopf.PRESENT})
async def pod_changed(namespace: str | None, labels: kopf.Labels, **_: Any) -> None:
    if RUNTIME.coalescer:
        RUNTIME.coalescer.request((namespace, labels[child_labels.JOB_LABEL]))


@kopf.on.event("", "v1", "nodes")
async def node_changed(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
    if RUNTIME.nodes.observe(event["type"] or "ADDED", body) and RUNTIME.coalescer:
        RUNTIME.coalescer.request(NODES_CHANGED)
