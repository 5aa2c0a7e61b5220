"""The gang policy: what the pods of the current attempt say about the job. Pure, with a table test.

Rank 0 Succeeded means the trainer finished (the other ranks may still be exiting). Any pod Failed (evicted
pods are Failed with reason Evicted), being deleted, missing after the gang was complete, or on a NotReady
node breaks the gang: every rank waits on NCCL for the lost one, so the whole gang restarts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Literal

from paralleljob.manifests import labels

Verdict = Literal["succeeded", "broken", "running", "starting"]


@dataclasses.dataclass(frozen=True)
class GangState:
    """The verdict, with the pod and node to blame when broken."""

    verdict: Verdict
    ready: int
    reason: str = ""
    pod: str | None = None
    node: str | None = None


def node_of(pod: Mapping[str, Any]) -> str | None:
    spec = pod.get("spec") or {}
    return spec.get("nodeName") or (pod.get("metadata") or {}).get("labels", {}).get(labels.NODE_LABEL)


def _rank(pod: Mapping[str, Any]) -> int:
    return int(pod["metadata"]["labels"][labels.NODE_RANK_LABEL])


def _phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def _breakage(pod: Mapping[str, Any], not_ready: Collection[str]) -> str | None:
    name = pod["metadata"]["name"]
    status = pod.get("status") or {}
    if _phase(pod) == "Failed":
        why = status.get("reason") or "Failed"
        detail = f": {status['message']}" if status.get("message") else ""
        return f"pod {name} {'was evicted' if why == 'Evicted' else 'failed'} ({why}){detail}"
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return f"pod {name} is being deleted"
    node = node_of(pod)
    if node in not_ready:
        return f"node {node} of pod {name} is NotReady"
    return None


def judge(pods: Sequence[Mapping[str, Any]], expected: int, not_ready: Collection[str] = ()) -> GangState:
    """The state of a complete gang of `expected` pods (missing pods count as deleted)."""
    by_rank = {_rank(p): p for p in pods}
    ready = sum(1 for p in pods if _phase(p) == "Running")
    rank0 = by_rank.get(0)
    if rank0 is not None and _phase(rank0) == "Succeeded":
        return GangState("succeeded", ready)
    for pod in sorted(pods, key=_rank):
        why = _breakage(pod, not_ready)
        if why:
            return GangState("broken", ready, why, pod["metadata"]["name"], node_of(pod))
    missing = [rank for rank in range(expected) if rank not in by_rank]
    if missing:
        return GangState("broken", ready, f"pod of node rank {missing[0]} was deleted", None, None)
    if ready == expected:
        return GangState("running", ready)
    return GangState("starting", ready)
