"""Writes: create children, delete pods, patch a job's status; all idempotent.

Creating an object that exists (AlreadyExists, 409) and deleting one that is gone (NotFound, 404) are
normal outcomes after an operator restart. An existing object (read back on the 409, pods included) counts as
created only when it is the job's own: a job deleted and re-created under the same name leaves children the
garbage collector has not removed yet, and adopting them would run the new job with the old one's plan
(`HeldByAnother`: wait for the collector); any other holder of the name is a `NameConflict` that no waiting
resolves, for the handlers to report. A refusal
that retrying cannot fix (a 4xx other than 409 Conflict and 429 Too Many Requests: an invalid volume, a
quota, a missing permission) is raised as `Rejected` with the API's message, for the handlers to report. A
patch of an object that is gone (404: its job was deleted during the pass, and the garbage collector took the
ConfigMap with it) is raised as `Gone`, for the pass to end on.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
from collections.abc import Callable, Mapping, Sequence
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
# How the existing copy of each kind is read on a 409, to check its owner. Pods too: the reconciler lists the
# pods labelled with the job, but a foreign pod with a rank's name need not carry that label.
READERS: dict[str, Creator] = {
    "Pod": lambda s: s.core.read_namespaced_pod,
    "Service": lambda s: s.core.read_namespaced_service,
    "ConfigMap": lambda s: s.core.read_namespaced_config_map,
    "ServiceAccount": lambda s: s.core.read_namespaced_service_account,
    "Role": lambda s: s.rbac.read_namespaced_role,
    "RoleBinding": lambda s: s.rbac.read_namespaced_role_binding,
}
RETRYABLE = frozenset({409, 429})
# Creates in flight at once in `create_all`: a 4,096-pod gang written one create at a time waits 4,096 round
# trips (100 s on the upstream server, bench/upstream_scale.py); the Job and ReplicaSet controllers write
# theirs in parallel too (slowStartBatch).
CREATES_IN_FLIGHT = 16


class HeldByAnother(Exception):
    """The name is taken by an object another owner holds (a deleted job's child awaiting the collector)."""


class NameConflict(Exception):
    """A child's name is held by an object that is neither this job's nor a deleted namesake's leftover."""

    PATTERN = re.compile(r"^(?P<kind>[A-Za-z]+) (?P<name>[-.a-z0-9]+) already exists and is not this ParallelJob's")

    def __init__(self, kind: str, name: str, holder: str) -> None:
        super().__init__(
            f"{kind} {name} already exists and is not this ParallelJob's (its controller: {holder}); delete or "
            "rename it, and the job is admitted again"
        )
        self.kind, self.name, self.holder = kind, name, holder

    @classmethod
    def named_in(cls, message: str) -> tuple[str, str] | None:
        """(kind, name) of the conflict a message of this class describes, or None."""
        found = cls.PATTERN.match(message or "")
        return (found["kind"], found["name"]) if found and found["kind"] in READERS else None


class Gone(Exception):
    """A patch found its object gone (404), as when the job was deleted during the pass."""


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
    existing = read(session, kind, metadata["name"], metadata["namespace"])
    owner = body["metadata"]["ownerReferences"][0]
    claim = "namesake" if existing is None else labels.claim_of(existing, owner["name"], owner["uid"])
    if claim == "foreign":
        raise NameConflict(kind, metadata["name"], labels.holder_of(existing or {}))
    if claim == "namesake":
        # (or gone between the 409 and the read: the next pass creates it)
        raise HeldByAnother(f"{kind} {metadata['name']} exists and is not owned by job uid {owner['uid']}")
    return False


def create_all(session: Session, bodies: Sequence[Mapping[str, Any]], in_flight: int = CREATES_IN_FLIGHT) -> int:
    """Create many children as the Kubernetes Job controller creates pods: in batches of 1, 2, 4, ... each
    written in parallel (at most `in_flight` at once), stopping after the first batch with a failure and
    raising its first error. A refusal that would refuse them all (a quota, an admission policy) then costs one
    request, not one per pod. Returns how many were created (not already the job's own)."""
    created, start, size = 0, 0, 1
    with concurrent.futures.ThreadPoolExecutor(max(1, in_flight), thread_name_prefix="create") as pool:
        while start < len(bodies):
            batch = bodies[start : start + size]
            futures = [pool.submit(create, session, body) for body in batch]
            errors = [f.exception() for f in futures if f.exception() is not None]
            if errors:
                raise errors[0]  # type: ignore[misc]
            created += sum(1 for f in futures if f.result())
            start, size = start + len(batch), size * 2
    return created


def read(session: Session, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
    """The object of a child kind with this name, or None."""
    body = session.send(READERS[kind](session), name, namespace, tolerate={404}).body
    return dict(body) if body is not None else None


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


def label_node(session: Session, name: str, key: str, value: str) -> bool:
    """Set one label on a Node (a merge patch of its labels, the others kept); False when the Node is gone."""
    body = {"metadata": {"labels": {key: value}}}
    return session.send(session.core.patch_node, name, body, tolerate={404}).status == 200


def replace_config_map(session: Session, current: Mapping[str, Any], body: Mapping[str, Any]) -> None:
    """Make the ConfigMap `current` (as read) into `body` with one merge patch at its resourceVersion: its data
    and labels become exactly the new ones, so no moment passes without one of the two (a delete and a create
    would leave none for a pass killed between them). A 409 (it changed since it was read) is raised."""
    metadata = current["metadata"]
    patch = {
        "metadata": {
            "resourceVersion": metadata.get("resourceVersion"),
            "labels": _replacing(metadata.get("labels"), body["metadata"].get("labels")),
        },
        "data": _replacing(current.get("data"), body.get("data")),
    }
    reply = session.send(
        session.core.patch_namespaced_config_map, metadata["name"], metadata["namespace"], patch, tolerate={404}
    )
    if reply.status == 404:
        raise Gone(f"ConfigMap {metadata['namespace']}/{metadata['name']}")


def _replacing(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> dict[str, Any]:
    """A merge patch's map that turns `old` into `new`: the keys `new` lacks set to None (removed)."""
    return {**{key: None for key in old or {}}, **(new or {})}


def patch_config_map(
    session: Session, namespace: str, name: str, data: Mapping[str, str], marks: Mapping[str, str | None]
) -> None:
    """One merge patch of a ConfigMap's data and labels (`marks`): the keys given replaced, None removed, the
    others kept; `Gone` when it is gone."""
    body = {"metadata": {"labels": dict(marks)}, "data": dict(data)}
    reply = session.send(session.core.patch_namespaced_config_map, name, namespace, body, tolerate={404})
    if reply.status == 404:
        raise Gone(f"ConfigMap {namespace}/{name}")


def patch_job_status(session: Session, namespace: str, name: str, status: Mapping[str, Any]) -> None:
    """One JSON merge patch of the status subresource (None values delete keys); `Gone` when the job is gone."""
    call = session.custom.patch_namespaced_custom_object_status
    body = {"status": dict(status)}
    reply = session.send(
        call, api_types.GROUP, api_types.VERSION, namespace, api_types.PLURAL, name, body, tolerate={404}
    )
    if reply.status == 404:
        raise Gone(f"ParallelJob {namespace}/{name}")
