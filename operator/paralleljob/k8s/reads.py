"""Reads: ParallelJobs, their pods and ConfigMap, Nodes and all pods, as plain camelCase dicts.

Called by the handlers at the start of each reconcile, so every decision is made on the cluster's state.
Responses are parsed from raw JSON (`_preload_content=False`): the client's model classes cost seconds at
thousands of pods.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import kubernetes

from paralleljob.api import types as api_types
from paralleljob.k8s.session import Session, raw_json
from paralleljob.manifests import labels

RAW = {"_preload_content": False}


def _not_found(error: kubernetes.client.ApiException) -> bool:
    return error.status == 404


def get_job(session: Session, namespace: str, name: str) -> dict[str, Any] | None:
    """The ParallelJob, or None when it is gone."""
    try:
        response = session.custom.get_namespaced_custom_object(
            api_types.GROUP, api_types.VERSION, namespace, api_types.PLURAL, name, **RAW
        )
    except kubernetes.client.ApiException as error:
        if _not_found(error):
            return None
        raise
    return dict(raw_json(response))


def list_jobs(session: Session, namespaces: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """ParallelJobs in these namespaces (None: all namespaces)."""
    group, version, plural = api_types.GROUP, api_types.VERSION, api_types.PLURAL
    if namespaces is None:
        response = session.custom.list_cluster_custom_object(group, version, plural, **RAW)
        return list(raw_json(response).get("items") or [])
    found: list[dict[str, Any]] = []
    for namespace in namespaces:
        response = session.custom.list_namespaced_custom_object(group, version, namespace, plural, **RAW)
        found += raw_json(response).get("items") or []
    return found


def list_nodes(session: Session) -> list[dict[str, Any]]:
    return list(raw_json(session.core.list_node(**RAW)).get("items") or [])


def list_all_pods(session: Session) -> list[dict[str, Any]]:
    """Every pod of the cluster (the planner subtracts the GPUs they hold)."""
    return list(raw_json(session.core.list_pod_for_all_namespaces(**RAW)).get("items") or [])


def list_job_pods(session: Session, namespace: str, job: str) -> list[dict[str, Any]]:
    """The pods of one job, by its label."""
    selector = f"{labels.JOB_LABEL}={job}"
    response = session.core.list_namespaced_pod(namespace, label_selector=selector, **RAW)
    return list(raw_json(response).get("items") or [])


def get_config_map(session: Session, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return dict(raw_json(session.core.read_namespaced_config_map(name, namespace, **RAW)))
    except kubernetes.client.ApiException as error:
        if _not_found(error):
            return None
        raise
