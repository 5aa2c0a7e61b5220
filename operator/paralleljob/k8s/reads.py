"""Reads: ParallelJobs, their pods and ConfigMap, single Nodes and PriorityClasses, as plain camelCase dicts.

Called by the handlers at the start of each reconcile, so every decision is made on the cluster's state.
Nothing here lists every pod or node of the cluster: those arrive through `paralleljob.k8s.informer`.
A missing object (404) is None, not an error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import kubernetes

from paralleljob.api import types as api_types
from paralleljob.k8s.session import Session
from paralleljob.manifests import labels

JOB_API = (api_types.GROUP, api_types.VERSION)
# Objects per page of a list that may hold one object per job of the cluster.
PAGE_SIZE = 500
# Where each kubelet renews its node's Lease, its heartbeat.
NODE_LEASE_NAMESPACE = "kube-node-lease"


def get_job(session: Session, namespace: str, name: str) -> dict[str, Any] | None:
    """The ParallelJob, or None when it is gone."""
    call = session.custom.get_namespaced_custom_object
    reply = session.send(call, *JOB_API, namespace, api_types.PLURAL, name, tolerate={404})
    return _object(reply.body)


def list_jobs(
    session: Session, namespaces: Iterable[str] | None = None, *, missing_ok: bool = False
) -> list[dict[str, Any]]:
    """ParallelJobs in these namespaces (None: all namespaces); with `missing_ok`, none where the CRD is not
    installed (the CLI's live path), instead of an error."""
    tolerate = {404} if missing_ok else set()
    if namespaces is None:
        everywhere = session.custom.list_cluster_custom_object
        return _items(session.send(everywhere, *JOB_API, api_types.PLURAL, tolerate=tolerate).body)
    found: list[dict[str, Any]] = []
    for namespace in namespaces:
        call = session.custom.list_namespaced_custom_object
        found += _items(session.send(call, *JOB_API, namespace, api_types.PLURAL).body)
    return found


def node_exists(session: Session, name: str) -> bool:
    return session.send(session.core.read_node, name, tolerate={404}).body is not None


def get_node(session: Session, name: str) -> dict[str, Any] | None:
    """The Node as the API server has it now (None when there is none of that name)."""
    return _object(session.send(session.core.read_node, name, tolerate={404}).body)


def node_lease_renewed(session: Session, node: str) -> str | None:
    """When the node's kubelet last renewed its Lease in kube-node-lease (RFC 3339); None without one."""
    api = kubernetes.client.CoordinationV1Api(session.client)
    body = session.send(api.read_namespaced_lease, node, NODE_LEASE_NAMESPACE, tolerate={404}).body
    renewed = ((body or {}).get("spec") or {}).get("renewTime")
    return str(renewed) if renewed else None


def priority_value(session: Session, name: str) -> int | None:
    """The value of a PriorityClass, or None when there is none of that name."""
    reply = session.send(session.scheduling.read_priority_class, name, tolerate={404})
    return int(reply.body["value"]) if reply.body is not None and "value" in reply.body else None


def list_job_pods(session: Session, namespace: str, job: str) -> list[dict[str, Any]]:
    """The pods labelled with the job's name: the job's own, and any left by a deleted job of the same name
    that the garbage collector has not removed yet (`labels.owned_by` tells them apart)."""
    selector = f"{labels.JOB_LABEL}={job}"
    return _items(session.send(session.core.list_namespaced_pod, namespace, label_selector=selector).body)


def list_reserving_config_maps(
    session: Session, namespaces: Iterable[str] | None = None, page_size: int = PAGE_SIZE
) -> Iterator[dict[str, Any]]:
    """The jobs' `-config` ConfigMaps whose attempt record reserves nodes (labelled so, selected by the API
    server), in these namespaces (None: all namespaces, as reservations are counted), page by page: a caller
    that turns each into a few records never holds the ConfigMaps of thousands of jobs at once."""
    selector = f"{labels.RESERVING_LABEL}=true"
    if namespaces is None:
        yield from _pages(session, session.core.list_config_map_for_all_namespaces, (), selector, page_size)
        return
    for namespace in namespaces:
        yield from _pages(session, session.core.list_namespaced_config_map, (namespace,), selector, page_size)


def _pages(
    session: Session, call: Callable[..., Any], args: tuple[str, ...], selector: str, page_size: int
) -> Iterator[dict[str, Any]]:
    """Every object a label-selected list returns, asked for `page_size` at a time (limit and continue)."""
    token: str | None = None
    while True:
        options: dict[str, Any] = {
            "label_selector": selector,
            "limit": page_size,
            **({"_continue": token} if token else {}),
        }
        body = session.send(call, *args, **options).body or {}
        yield from _items(body)
        token = (body.get("metadata") or {}).get("continue")
        if not token:
            return


def get_config_map(session: Session, namespace: str, name: str) -> dict[str, Any] | None:
    return _object(session.send(session.core.read_namespaced_config_map, name, namespace, tolerate={404}).body)


def _object(body: Any) -> dict[str, Any] | None:
    return dict(body) if body is not None else None


def _items(body: Any) -> list[dict[str, Any]]:
    return list((body or {}).get("items") or [])
