"""Writes: create children, delete pods, patch a job's status; all idempotent.

Creating an object that exists (AlreadyExists, 409) and deleting one that is gone (NotFound, 404) are
normal outcomes after an operator restart, so they return False instead of raising.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import kubernetes

from paralleljob.api import types as api_types
from paralleljob.k8s.session import Session

Creator = Callable[[Session, str, Mapping[str, Any]], Any]

CREATORS: dict[str, Creator] = {
    "Pod": lambda s, ns, body: s.core.create_namespaced_pod(ns, body, _preload_content=False),
    "Service": lambda s, ns, body: s.core.create_namespaced_service(ns, body, _preload_content=False),
    "ConfigMap": lambda s, ns, body: s.core.create_namespaced_config_map(ns, body, _preload_content=False),
    "ServiceAccount": lambda s, ns, body: s.core.create_namespaced_service_account(ns, body, _preload_content=False),
    "Role": lambda s, ns, body: s.rbac.create_namespaced_role(ns, body, _preload_content=False),
    "RoleBinding": lambda s, ns, body: s.rbac.create_namespaced_role_binding(ns, body, _preload_content=False),
}


def create(session: Session, body: Mapping[str, Any]) -> bool:
    """Create a child object; False when it already exists."""
    try:
        CREATORS[body["kind"]](session, body["metadata"]["namespace"], body)
    except kubernetes.client.ApiException as error:
        if error.status == 409:
            return False
        raise
    return True


def delete_pod(session: Session, namespace: str, name: str) -> bool:
    """Delete a pod now (no grace: its gang is already broken); False when it is gone."""
    try:
        session.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0, _preload_content=False)
    except kubernetes.client.ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


def delete_config_map(session: Session, namespace: str, name: str) -> bool:
    try:
        session.core.delete_namespaced_config_map(name, namespace, _preload_content=False)
    except kubernetes.client.ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


def patch_job_status(session: Session, namespace: str, name: str, status: Mapping[str, Any]) -> None:
    """One JSON merge patch of the status subresource (None values delete keys)."""
    session.custom.patch_namespaced_custom_object_status(
        api_types.GROUP,
        api_types.VERSION,
        namespace,
        api_types.PLURAL,
        name,
        {"status": dict(status)},
        _preload_content=False,
    )


def patch_job_annotations(session: Session, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
    """Merge-patch annotations of the job (the operator's notes that must survive its restarts)."""
    session.custom.patch_namespaced_custom_object(
        api_types.GROUP,
        api_types.VERSION,
        namespace,
        api_types.PLURAL,
        name,
        {"metadata": {"annotations": dict(annotations)}},
        _preload_content=False,
    )
