"""Plain data the decision tables share (`test_step_decisions.py`, `test_supervision_decisions.py`): a fixed
clock, a job object, its conditions and its pods, as the API server would give them to a pass."""

from __future__ import annotations

import datetime
from typing import Any

from paralleljob.manifests import labels

NOW = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)
STAMP = "2026-01-01T12:00:00Z"
EARLIER = "2026-01-01T11:00:00Z"
UID = "uid-1"


def condition(kind: str, status: str, reason: str, message: str, at: str = EARLIER) -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": at,
        "observedGeneration": 2,
    }


READY = condition("Ready", "True", "AllPodsRunning", "all 2 pods running")


def job(**status: Any) -> dict[str, Any]:
    metadata = {"name": "gpt", "namespace": "research", "uid": UID, "generation": 2}
    return {"apiVersion": "paralleljob.io/v1alpha1", "kind": "ParallelJob", "metadata": metadata, "status": status}


def pod(
    name: str,
    *,
    attempt: int = 0,
    node: str = "n0",
    phase: str = "Running",
    deleting_since: str | None = None,
    gang_size: int = 2,
    owner: str = UID,
    rank: int | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": name,
        "labels": {labels.ATTEMPT_LABEL: str(attempt), labels.GANG_SIZE_LABEL: str(gang_size)},
        "ownerReferences": [{"kind": "ParallelJob", "name": "gpt", "uid": owner, "controller": True}],
    }
    if rank is not None:
        metadata["labels"][labels.NODE_RANK_LABEL] = str(rank)
    if deleting_since is not None:
        metadata["deletionTimestamp"] = deleting_since
    return {"metadata": metadata, "spec": {"nodeName": node}, "status": {"phase": phase}}


def seconds_before_now(seconds: float) -> str:
    return (NOW - datetime.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")
