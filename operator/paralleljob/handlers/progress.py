"""Copies rank 0's reported progress into the job's status, after validation; nothing else ever reads it.

Called for a `ProgressKey` whenever a progress ConfigMap changes (the registry watches them). The ConfigMap
counts only when the job owns it by uid; its numbers go through `manifests.progress.status_of`, and only the
fields that changed are patched, in one merge patch of `status.progress` and `status.lastCheckpointStep`.
Reconcile passes never read these fields: phase, placement, restarts and reservations are the operator's own.
A report of in-place restarts asks for a pass over the job, which counts them from the ConfigMap itself
(`steps.supervision`), and so does a report of peers node rank 0 no longer hears from, which the pass weighs
with their Nodes' Leases (`handlers.lost_peers`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from paralleljob.k8s import reads, writes
from paralleljob.k8s.session import Session
from paralleljob.manifests import labels, progress
from paralleljob_contract import progress as channel


@dataclasses.dataclass(frozen=True)
class ProgressKey:
    """The coalescer's key for copying one job's progress (apart from its reconcile key)."""

    namespace: str
    name: str


@dataclasses.dataclass(frozen=True)
class Copied:
    """What a copy did: whether it wrote the status, and whether rank 0 reports in-place restarts, which the
    job's own pass counts (from the attempt record, as every decision)."""

    written: bool
    in_place_reported: bool = False
    # The named stragglers changed: the job's pass turns them into its Straggler condition and SlowNode Event.
    stragglers_changed: bool = False
    # Node rank 0 reports peers it no longer hears from: the job's pass weighs them with their Leases.
    lost_peers_reported: bool = False


def copy_progress(session: Session, key: ProgressKey) -> Copied:
    """Patch the job's status with the validated progress."""
    job = reads.get_job(session, key.namespace, key.name)
    if job is None or job["metadata"].get("deletionTimestamp"):
        return Copied(False)
    uid = str(job["metadata"].get("uid"))
    found = reads.get_config_map(session, key.namespace, labels.progress_config_map_name(key.name))
    total = _total_steps(job)
    if found is None or not labels.owned_by(found, uid) or total is None:
        return Copied(False)
    current = job.get("status") or {}
    nodes = {int(p["nodeRank"]): str(p["node"]) for p in current.get("placement") or [] if "nodeRank" in p}
    changed = {k: v for k, v in progress.status_of(found, total, nodes).items() if current.get(k) != v}
    named = (changed.get("progress") or {}).get("stragglers")
    stragglers_changed = named is not None and named != (current.get("progress") or {}).get("stragglers")
    if "progress" in changed:
        # A merge patch merges objects: null the fields this report lacks, so no stale loss stays beside a new step.
        old = current.get("progress") or {}
        changed["progress"] = {**{field: None for field in old}, **changed["progress"]}
    if changed:
        writes.patch_job_status(session, key.namespace, key.name, changed)
    in_place = (found.get("data") or {}).get(channel.IN_PLACE_RESTARTS)
    lost = bool(progress.lost_peers_of(found))
    return Copied(bool(changed), in_place not in (None, "0"), stragglers_changed, lost)


def _total_steps(job: Mapping[str, Any]) -> int | None:
    steps = ((job.get("spec") or {}).get("training") or {}).get("steps")
    return steps if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0 else None
