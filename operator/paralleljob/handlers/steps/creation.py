"""Step 6, creation: an admitted attempt. Create the Service, the progress RBAC and every missing pod from the
ConfigMap and record (the pinned spec, image and nodes) -> Placed; from then on a missing pod is a lost one.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from paralleljob.handlers.observed import Observed, condition, status_patch
from paralleljob.handlers.settings import Settings
from paralleljob.manifests import children as child_objects
from paralleljob.manifests import configmap, labels
from paralleljob.manifests.decisions import Decision, Event

PLACED = "Placed"


def decide(seen: Observed, settings: Settings, now: datetime.datetime) -> Decision:
    """Create the live attempt's children from its ConfigMap and record (the pinned spec, image and nodes),
    then mark the record placed: from then on a missing pod is a lost one, never created again. The children
    are written first (`k8s.apply`): a refusal leaves the record unplaced, and the next pass decides on it."""
    live, found = seen.live, seen.config_map
    assert live is not None and seen.pinned is not None  # an admitted attempt, supervised by its pinned spec
    nodes = list(live.nodes)
    if found is None or plan_lost(found, seen.uid, seen.attempt, nodes):
        # The plan of this attempt is lost (someone deleted or replaced the ConfigMap): plan again.
        return Decision("replanning", status=status_patch(seen, {"placement": None}))
    built = child_objects.build_children(
        seen.job, seen.pinned, found, nodes, image=live.image, pod_security=settings.pod_security
    )
    existing = {pod["metadata"]["name"] for pod in seen.pods}
    missing = [pod for pod in built.pods if pod["metadata"]["name"] not in existing]
    message = f"{len(built.pods)} pods created on {len(nodes)} nodes; fabric {built.fabric}"
    cond = condition(seen, "Scheduled", "True", PLACED, message, now)
    written = status_patch(seen, {"conditions": cond, "message": message})
    placed = f"layout {seen.pinned.layout}, fabric {built.fabric}: {_hosts(nodes)}"
    return Decision(
        "created",
        creates=(built.service, built.progress, *built.rbac, *missing),
        status=written,
        events=(Event("Normal", "Placed", placed),) if written else (),
        record=seen.record.with_placed() if seen.record is not None else None,
    )


def _hosts(nodes: Sequence[str]) -> str:
    """The first node ranks' nodes, for the Placed Event."""
    hosts = ", ".join(f"{rank}->{node}" for rank, node in enumerate(nodes[:8]))
    return hosts + (f" (+{len(nodes) - 8} more)" if len(nodes) > 8 else "")


def plan_lost(found: Mapping[str, Any], uid: str, attempt: int, nodes: Sequence[str]) -> bool:
    """Whether the job's `-config` ConfigMap no longer holds this attempt's plan for these nodes: another
    owner's, another attempt's, or a plan of another node count."""
    if not labels.owned_by(found, uid) or configmap.attempt_of(found) != attempt:
        return True
    return len(nodes) != configmap.plan_of(found).nodes
