"""The kopf handlers: each one only turns a watch event into a reconcile request.

Watches ParallelJobs (their own changes), the pods labelled with a job (phase changes, deletions), Nodes
(readiness, capacity, labels: a pending job may fit now, a running gang may have lost a node) and rank 0's
progress ConfigMaps (copied into status by `handlers.progress`, apart from reconciles). Whenever GPUs
may have been freed (a Node changed, a job's pod ended or went away, a job was deleted, finished or
restarted) the `RECHECK` pass requests every unfinished job, so a waiting job re-plans at once. No handler
stores progress in annotations and none adds a finalizer, so deleting a job never waits for the operator,
and a quiet cluster sees no writes. `configure()` must be called before kopf starts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import typing
from collections.abc import Hashable
from typing import Any

import kopf

from paralleljob.api import types as api_types
from paralleljob.handlers import metrics, progress, reconcile
from paralleljob.handlers.coalescer import Coalescer, Next
from paralleljob.handlers.nodes import NodeWatch
from paralleljob.k8s import reads
from paralleljob.k8s.session import Session, connect
from paralleljob.manifests import labels as child_labels
from paralleljob.manifests import progress as progress_manifests

log = logging.getLogger(__name__)
RECHECK = "recheck-unfinished-jobs"
# kopf's own API calls: watches end server-side after WATCH_SERVER_SECONDS and are abandoned client-side a
# little later, so a connection that died silently is noticed; other requests time out like ours.
WATCH_SERVER_SECONDS = 300
WATCH_CLIENT_SECONDS = 330
CONNECT_SECONDS = 10
REQUEST_SECONDS = 60


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


def _pass(key: Hashable) -> Next:
    assert RUNTIME.session is not None
    if key == RECHECK:
        return Next(keys=tuple(_jobs_to_recheck(RUNTIME.session)))
    if isinstance(key, progress.ProgressKey):
        progress.copy_progress(RUNTIME.session, key)
        return Next()
    namespace, name = typing.cast(tuple[str, str], key)
    nodes = reconcile.NodeView(RUNTIME.nodes.known(), RUNTIME.nodes.not_ready())
    outcome = reconcile.reconcile(RUNTIME.session, RUNTIME.settings, namespace, name, nodes)
    return Next(keys=(RECHECK,) if outcome.wake_others else (), after=outcome.requeue_after)


def _jobs_to_recheck(session: Session) -> list[tuple[str, str]]:
    """Unfinished jobs: a pending one may fit now, a running one may have lost its node."""
    jobs = reads.list_jobs(session, RUNTIME.settings.namespaces)
    unfinished = [j for j in jobs if (j.get("status") or {}).get("phase") not in reconcile.TERMINAL]
    return [(j["metadata"]["namespace"], j["metadata"]["name"]) for j in unfinished]


def _request(key: Hashable) -> None:
    if RUNTIME.coalescer is not None:
        RUNTIME.coalescer.request(key)


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Our Events are posted by paralleljob.k8s.events; kopf's own log-to-Event posting would add writes.
    settings.posting.enabled = False
    settings.watching.server_timeout = WATCH_SERVER_SECONDS
    settings.watching.client_timeout = WATCH_CLIENT_SECONDS
    settings.watching.connect_timeout = CONNECT_SECONDS
    settings.networking.connect_timeout = CONNECT_SECONDS
    settings.networking.request_timeout = REQUEST_SECONDS
    RUNTIME.session = await asyncio.to_thread(connect, RUNTIME.kubeconfig)
    RUNTIME.coalescer = Coalescer(_pass)
    metrics.serve(RUNTIME.metrics_port)
    log.info("paralleljob operator started: %s", RUNTIME.settings)


@kopf.on.event(api_types.GROUP, api_types.VERSION, api_types.PLURAL)
async def job_changed(event: kopf.RawEvent, namespace: str | None, name: str, **_: Any) -> None:
    if event["type"] == "DELETED":
        # Its reservation and pods are going: the waiting jobs may fit now.
        metrics.observe_phase(namespace or "", name, None)
        _request(RECHECK)
        return
    _request((namespace, name))


def frees_gpus(event_type: str | None, pod: kopf.Body) -> bool:
    """Whether a pod event may have released GPUs: a bound pod ended or went away."""
    bound = bool((pod.get("spec") or {}).get("nodeName"))
    ended = (pod.get("status") or {}).get("phase") in reconcile.TERMINAL
    return bound and (event_type == "DELETED" or ended)


@kopf.on.event("", "v1", "pods", labels={child_labels.JOB_LABEL: kopf.PRESENT})
async def pod_changed(
    event: kopf.RawEvent, body: kopf.Body, namespace: str | None, labels: kopf.Labels, **_: Any
) -> None:
    _request((namespace, labels[child_labels.JOB_LABEL]))
    if frees_gpus(event["type"], body):
        _request(RECHECK)


@kopf.on.event("", "v1", "configmaps", labels={progress_manifests.PROGRESS_LABEL: kopf.PRESENT})
async def progress_changed(event: kopf.RawEvent, namespace: str | None, name: str, **_: Any) -> None:
    job = progress_manifests.job_of(name)
    if job is not None and event["type"] != "DELETED":
        _request(progress.ProgressKey(namespace or "", job))


@kopf.on.event("", "v1", "nodes")
async def node_changed(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
    if RUNTIME.nodes.observe(event["type"] or "ADDED", body):
        _request(RECHECK)
