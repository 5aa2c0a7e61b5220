"""Copies rank 0's reported progress into the job's status, after validation; nothing else ever reads it.

Called for a `ProgressKey` whenever a progress ConfigMap changes (the registry watches them). The ConfigMap
counts only when the job owns it by uid; its numbers go through `manifests.progress.status_of`, and only the
fields that changed are patched, in one merge patch of `status.progress` and `status.lastCheckpointStep`.
Reconcile passes never read these fields: phase, placement, restarts and reservations are the operator's own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from paralleljob.k8s import reads, writes
from paralleljob.k8s.session import Session
from paralleljob.manifests import labels, progress


@dataclasses.dataclass(frozen=True)
class ProgressKey:
    """The coalescer's key for copying one job's progress (apart from its reconcile key)."""

    namespace: str
    name: str


def copy_progress(session: Session, key: ProgressKey) -> bool:
    """Patch the job's status with the validated progress; True when something was written."""
    job = reads.get_job(session, key.namespace, key.name)
    if job is None or job["metadata"].get("deletionTimestamp"):
        return False
    uid = str(job["metadata"].get("uid"))
    found = reads.get_config_map(session, key.namespace, labels.progress_config_map_name(key.name))
    total = _total_steps(job)
    if found is None or not labels.owned_by(found, uid) or total is None:
        return False
    current = job.get("status") or {}
    changed = {k: v for k, v in progress.status_of(found, total).items() if current.get(k) != v}
    if "progress" in changed:
        # A merge patch merges objects: null the fields this report lacks, so no stale loss stays beside a new step.
        old = current.get("progress") or {}
        changed["progress"] = {**{field: None for field in old}, **changed["progress"]}
    if changed:
        writes.patch_job_status(session, key.namespace, key.name, changed)
    return bool(changed)


def _total_steps(job: Mapping[str, Any]) -> int | None:
    steps = ((job.get("spec") or {}).get("training") or {}).get("steps")
    return steps if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0 else None
