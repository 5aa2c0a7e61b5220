"""Reads: ParallelJobs, their pods and ConfigMap, single Nodes and PriorityClasses, as plain camelCase dicts.

Called by the handlers at the start of each reconcile, so every decision is made on the cluster's state.
Nothing here lists every pod or node of the cluster: those arrive through `paralleljob.k8s.informer`.
A missing object (404) is None, not an error.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from paralleljob.api import types as api_types
from paralleljob.k8s.session import Session
from paralleljob.manifests import labels

JOB_API = (api_types.GROUP, api_types.VERSION)


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


def priority_value(session: Session, name: str) -> int | None:
    """The value of a PriorityClass, or None when there is none of that name."""
    reply = session.send(session.scheduling.read_priority_class, name, tolerate={404})
    return int(reply.body["value"]) if reply.body is not None and "value" in reply.body else None


def list_job_pods(session: Session, namespace: str, job: str) -> list[dict[str, Any]]:
    """The pods labelled with the job's name: the job's own, and any left by a deleted job of the same name
    that the garbage collector has not removed yet (`labels.owned_by` tells them apart)."""
    selector = f"{labels.JOB_LABEL}={job}"
    return _items(session.send(session.core.list_namespaced_pod, namespace, label_selector=selector).body)


def get_config_map(session: Session, namespace: str, name: str) -> dict[str, Any] | None:
    return _object(session.send(session.core.read_namespaced_config_map, name, namespace, tolerate={404}).body)


def _object(body: Any) -> dict[str, Any] | None:
    return dict(body) if body is not None else None


def _items(body: Any) -> list[dict[str, Any]]:
    return list((body or {}).get("items") or [])
