"""Step 6, creation: an admitted attempt. Create the Service, the progress RBAC and every missing pod from the
ConfigMap and record (the pinned spec, image and nodes) -> Placed; from then on a missing pod is a lost one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from paralleljob.api import ResolvedJob
from paralleljob.handlers.passes import (
    PLACED,
    Outcome,
    Pass,
    write_record,
    write_status,
)
from paralleljob.k8s import reads, writes
from paralleljob.manifests import children as child_objects
from paralleljob.manifests import configmap, labels


def creating(p: Pass) -> bool:
    """Whether the live attempt's pods are still to be created, as its record says."""
    return p.live is not None and not p.live.placed


def create(p: Pass, resolved: ResolvedJob, pods: Sequence[Mapping[str, Any]]) -> Outcome:
    """Create the live attempt's children from its ConfigMap and record (the pinned spec, image and nodes),
    then mark the record placed: from then on a missing pod is a lost one, never created again."""
    found = reads.get_config_map(p.session, p.namespace, labels.config_map_name(p.name))
    nodes = p.placed_nodes
    if found is None or plan_lost(found, p.uid, p.attempt, nodes):
        # The plan of this attempt is lost (someone deleted or replaced the ConfigMap): plan again.
        write_status(p, {"placement": None})
        return Outcome("replanning")
    image = p.live.image if p.live is not None else p.settings.image
    built = child_objects.build_children(
        p.job, resolved, found, nodes, image=image, pod_security=p.settings.pod_security
    )
    existing = {pod["metadata"]["name"] for pod in pods}
    for obj in [built.service, built.progress, *built.rbac]:
        writes.create(p.session, obj)
    writes.create_all(p.session, [pod for pod in built.pods if pod["metadata"]["name"] not in existing])
    if p.record is not None:
        write_record(p, p.record.with_placed())
    message = f"{len(built.pods)} pods created on {len(nodes)} nodes; fabric {built.fabric}"
    cond = p.condition("Scheduled", "True", PLACED, message)
    if write_status(p, {"conditions": cond, "message": message}):
        hosts = ", ".join(f"{rank}->{node}" for rank, node in enumerate(nodes[:8]))
        more = f" (+{len(nodes) - 8} more)" if len(nodes) > 8 else ""
        p.event("Normal", "Placed", f"layout {resolved.layout}, fabric {built.fabric}: {hosts}{more}")
    return Outcome("created")


def plan_lost(found: Mapping[str, Any], uid: str, attempt: int, nodes: Sequence[str]) -> bool:
    """Whether the job's `-config` ConfigMap no longer holds this attempt's plan for these nodes: another
    owner's, another attempt's, or a plan of another node count."""
    if not labels.owned_by(found, uid) or configmap.attempt_of(found) != attempt:
        return True
    return len(nodes) != configmap.plan_of(found).nodes
