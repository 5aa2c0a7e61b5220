"""Writes: create children, delete pods, patch a job's status; all idempotent.

Creating an object that exists (AlreadyExists, 409) and deleting one that is gone (NotFound, 404) are
normal outcomes after an operator restart. An existing object counts as created only when it is the job's
own: a job deleted and re-created under the same name leaves children the garbage collector has not
removed yet, and adopting them would run the new job with the old one's plan (`HeldByAnother`). A refusal
that retrying cannot fix (a 4xx other than 409 Conflict and 429 Too Many Requests: an invalid volume, a
quota, a missing permission) is raised as `Rejected` with the API's message, for the handlers to report.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import kubernetes

from paralleljob.api import types as api_types
from paralleljob.k8s.session import Session
from paralleljob.manifests import labels

Creator = Callable[[Session], Callable[..., Any]]

CREATORS: dict[str, Creator] = {
    "Pod": lambda s: s.core.create_namespaced_pod,
    "Service": lambda s: s.core.create_namespaced_service,
    "ConfigMap": lambda s: s.core.create_namespaced_config_map,
    "ServiceAccount": lambda s: s.core.create_namespaced_service_account,
    "Role": lambda s: s.rbac.create_namespaced_role,
    "RoleBinding": lambda s: s.rbac.create_namespaced_role_binding,
}
# Kinds whose existing copy is read on a 409 to check its owner. Pods are not: the reconciler lists them
# (with their owners) before creating any, so a 409 on a pod is one it created itself moments before.
READERS: dict[str, Creator] = {
    "Service": lambda s: s.core.read_namespaced_service,
    "ConfigMap": lambda s: s.core.read_namespaced_config_map,
    "ServiceAccount": lambda s: s.core.read_namespaced_service_account,
    "Role": lambda s: s.rbac.read_namespaced_role,
    "RoleBinding": lambda s: s.rbac.read_namespaced_role_binding,
}
RETRYABLE = frozenset({409, 429})


class HeldByAnother(Exception):
    """The name is taken by an object another owner holds (a deleted job's child awaiting the collector)."""


class Rejected(Exception):
    """The API refused a create in a way that retrying will not fix."""

    def __init__(self, kind: str, name: str, status: int, message: str) -> None:
        super().__init__(f"creating {kind} {name} was refused ({status}): {message}")
        self.kind, self.name, self.status, self.message = kind, name, status, message


def create(session: Session, body: Mapping[str, Any]) -> bool:
    """Create a child object; False when the job's own copy already exists."""
    kind, metadata = body["kind"], body["metadata"]
    try:
        reply = session.send(CREATORS[kind](session), metadata["namespace"], body, tolerate={409})
    except kubernetes.client.ApiException as error:
        if 400 <= int(error.status or 0) < 500 and error.status not in RETRYABLE:
            raise Rejected(kind, metadata["name"], int(error.status), _message(error)) from error
        raise
    if reply.status == 200:
        return True
    if kind in READERS:
        existing = session.send(READERS[kind](session), metadata["name"], metadata["namespace"], tolerate={404})
        owner = labels.owner_uid(body)
        if existing.body is None or labels.owner_uid(existing.body) != owner:
            raise HeldByAnother(f"{kind} {metadata['name']} exists and is not owned by job uid {owner}")
    return False


def _message(error: kubernetes.client.ApiException) -> str:
    try:
        return str(json.loads(error.body or "{}").get("message") or error.reason)
    except (ValueError, AttributeError):
        return str(error.reason)


def delete_pod(session: Session, namespace: str, name: str, *, force: bool = False) -> bool:
    """Delete a pod with its grace period (the kubelet stops its containers, then the pod object goes);
    `force` removes the object at once, for pods whose kubelet is gone. False when it is gone already."""
    grace = {"grace_period_seconds": 0} if force else {}
    return session.send(session.core.delete_namespaced_pod, name, namespace, tolerate={404}, **grace).status == 200


def delete_config_map(session: Session, namespace: str, name: str) -> bool:
    return session.send(session.core.delete_namespaced_config_map, name, namespace, tolerate={404}).status == 200


def patch_job_status(session: Session, namespace: str, name: str, status: Mapping[str, Any]) -> None:
    """One JSON merge patch of the status subresource (None values delete keys)."""
    call = session.custom.patch_namespaced_custom_object_status
    session.send(call, api_types.GROUP, api_types.VERSION, namespace, api_types.PLURAL, name, {"status": dict(status)})
