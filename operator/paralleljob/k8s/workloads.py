"""Kueue's objects through the API: a queued job's Workload (read, create, status patches), the ResourceFlavors
its admission names and the value of a WorkloadPriorityClass. Only used for jobs labelled with a queue
(`handlers.queueing`), so an operator on a cluster without Kueue never calls these.

Status patches are JSON merge patches at the resourceVersion read (a 409 is raised, and the pass retried): the
conditions list is replaced whole, so a write must start from what Kueue last wrote. Kueue applies its own
status with forced server-side apply, so these writes never block it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from paralleljob.k8s import writes
from paralleljob.k8s.session import Session
from paralleljob.manifests import workload as wl


def get(session: Session, namespace: str, job: str) -> dict[str, Any] | None:
    """The job's Workload, or None."""
    call = session.custom.get_namespaced_custom_object
    reply = session.send(call, wl.GROUP, wl.VERSION, namespace, wl.PLURAL, wl.workload_name(job), tolerate={404})
    return dict(reply.body) if reply.body is not None else None


def patch_metadata(session: Session, workload: Mapping[str, Any], metadata: Mapping[str, Any]) -> None:
    """One merge patch of the Workload's metadata at the resourceVersion read (a 409 retries the pass)."""
    found = workload["metadata"]
    body = {"metadata": {"resourceVersion": found.get("resourceVersion"), **metadata}}
    call = session.custom.patch_namespaced_custom_object
    reply = session.send(call, wl.GROUP, wl.VERSION, found["namespace"], wl.PLURAL, found["name"], body, tolerate={404})
    if reply.status == 404:
        raise writes.Gone(f"Workload {found['namespace']}/{found['name']}")


def create(session: Session, body: Mapping[str, Any]) -> dict[str, Any] | None:
    """Create the Workload; None when one of that name exists already (the next pass reads it)."""
    call = session.custom.create_namespaced_custom_object
    namespace = body["metadata"]["namespace"]
    reply = session.send(call, wl.GROUP, wl.VERSION, namespace, wl.PLURAL, body, tolerate={409})
    return dict(reply.body) if reply.status != 409 and reply.body is not None else None


def patch_status(session: Session, workload: Mapping[str, Any], status: Mapping[str, Any]) -> None:
    """One merge patch of the Workload's status at the resourceVersion read; `writes.Gone` when it is gone."""
    metadata = workload["metadata"]
    body = {"metadata": {"resourceVersion": metadata.get("resourceVersion")}, "status": dict(status)}
    call = session.custom.patch_namespaced_custom_object_status
    reply = session.send(
        call, wl.GROUP, wl.VERSION, metadata["namespace"], wl.PLURAL, metadata["name"], body, tolerate={404}
    )
    if reply.status == 404:
        raise writes.Gone(f"Workload {metadata['namespace']}/{metadata['name']}")


def flavor(session: Session, name: str) -> dict[str, Any] | None:
    """A ResourceFlavor (cluster-scoped), or None."""
    call = session.custom.get_cluster_custom_object
    reply = session.send(call, wl.GROUP, wl.VERSION, wl.FLAVOR_PLURAL, name, tolerate={404})
    return dict(reply.body) if reply.body is not None else None


def workload_priority_value(session: Session, name: str) -> int | None:
    """The value of a WorkloadPriorityClass (cluster-scoped), or None when there is none of that name."""
    call = session.custom.get_cluster_custom_object
    reply = session.send(call, wl.GROUP, wl.VERSION, wl.PRIORITY_PLURAL, name, tolerate={404})
    return int(reply.body["value"]) if reply.body is not None and "value" in reply.body else None


def queue_object(session: Session, plural: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
    """A Kueue object the topology request is read from (a LocalQueue in `namespace`, or a cluster-scoped
    ClusterQueue or Topology), or None when there is none of that name."""
    custom = session.custom
    if namespace is not None:
        reply = session.send(
            custom.get_namespaced_custom_object, wl.GROUP, wl.VERSION, namespace, plural, name, tolerate={404}
        )
    else:
        reply = session.send(custom.get_cluster_custom_object, wl.GROUP, wl.VERSION, plural, name, tolerate={404})
    return dict(reply.body) if reply.body is not None else None
