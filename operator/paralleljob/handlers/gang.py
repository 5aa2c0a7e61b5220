"""The gang policy: what the pods of the current attempt say about the job. Pure, with a table test.

Rank 0 Succeeded means the trainer finished (the other ranks may still be exiting). Any pod Failed (evicted
pods are Failed with reason Evicted), being deleted, missing after the gang was complete, or on a lost node
(NotReady, or deleted from the cluster) breaks the gang: every rank waits on NCCL for the lost one, so the
whole gang restarts. So does a gang that cannot start: a pod that the scheduler refuses (PodScheduled=False)
or whose container cannot be created (image pull errors, bad config) for longer than the start timeout.
A failed pod whose container's termination message reports a network failure (the trainer's preflight, or
NCCL's choice under spec.network.verify: fail) breaks it with cause NetworkNotReady: the reconciler fails
the job instead of restarting it, since a restart on the same spec and nodes would fail the same way.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from paralleljob.k8s import timestamps
from paralleljob.manifests import labels
from paralleljob_contract.network import NetworkFailure, parse_failure

Verdict = Literal["succeeded", "broken", "running", "starting"]
# Container waiting reasons that do not clear up by waiting for the kubelet (restartPolicy is Never).
STUCK_WAITING_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError", "CreateContainerError"}
)
# Causes, used as condition reasons: GangRestart for a lost or failed pod; the others name what happened.
BROKEN, START_TIMEOUT, CREATE_FAILED = "GangRestart", "StartTimeout", "CreateFailed"
NETWORK = "NetworkNotReady"


@dataclasses.dataclass(frozen=True)
class GangState:
    """The verdict, with the pod and node to blame when broken, and when a starting gang must be looked at
    again (the moment a stuck pod reaches the start timeout)."""

    verdict: Verdict
    ready: int
    reason: str = ""
    pod: str | None = None
    node: str | None = None
    cause: str = BROKEN
    recheck_in: float | None = None
    network: NetworkFailure | None = None


def node_of(pod: Mapping[str, Any]) -> str | None:
    spec = pod.get("spec") or {}
    return spec.get("nodeName") or (pod.get("metadata") or {}).get("labels", {}).get(labels.NODE_LABEL)


def _rank(pod: Mapping[str, Any]) -> int:
    return int(pod["metadata"]["labels"][labels.NODE_RANK_LABEL])


def _phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def network_failure_of(pod: Mapping[str, Any]) -> NetworkFailure | None:
    """The network failure a Failed pod's training container reported in its termination message."""
    if _phase(pod) != "Failed":
        return None
    for container in (pod.get("status") or {}).get("containerStatuses") or ():
        terminated = (container.get("state") or {}).get("terminated") or {}
        if found := parse_failure(terminated.get("message")):
            return found
    return None


def _breakage(pod: Mapping[str, Any], lost_nodes: Mapping[str, str]) -> str | None:
    name = pod["metadata"]["name"]
    status = pod.get("status") or {}
    if _phase(pod) == "Failed":
        why = status.get("reason") or "Failed"
        detail = f": {status['message']}" if status.get("message") else ""
        return f"pod {name} {'was evicted' if why == 'Evicted' else 'failed'} ({why}){detail}"
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return f"pod {name} is being deleted"
    node = node_of(pod)
    if node in lost_nodes:
        return f"node {node} of pod {name} {lost_nodes[node]}"
    return None


def stuck_reason(pod: Mapping[str, Any]) -> str | None:
    """Why a Pending pod is not starting, when the scheduler or the kubelet says so; None otherwise."""
    if _phase(pod) != "Pending":
        return None
    status = pod.get("status") or {}
    for condition in status.get("conditions") or ():
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return f"{condition.get('reason') or 'Unschedulable'}: {condition.get('message') or 'not scheduled'}"
    for container in status.get("containerStatuses") or ():
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK_WAITING_REASONS:
            return f"{waiting['reason']}: {waiting.get('message') or 'container not created'}"
    return None


def _start_timeout(
    pods: Sequence[Mapping[str, Any]], ready: int, timeout: float, at: datetime.datetime | None
) -> GangState | None:
    """A broken state when a stuck pod is older than `timeout`, else a starting one due for a recheck."""
    recheck: float | None = None
    for pod in sorted(pods, key=_rank):
        why = stuck_reason(pod)
        age = timestamps.seconds_since(pod["metadata"].get("creationTimestamp"), at)
        if why is None or age is None:
            continue
        if age >= timeout:
            name = pod["metadata"]["name"]
            reason = f"pod {name} did not start within {timeout:.0f}s ({why})"
            return GangState("broken", ready, reason, name, None, START_TIMEOUT)
        recheck = min(recheck if recheck is not None else timeout, timeout - age)
    return GangState("starting", ready, recheck_in=recheck) if recheck is not None else None


def judge(
    pods: Sequence[Mapping[str, Any]],
    expected: int,
    lost_nodes: Mapping[str, str] | None = None,
    *,
    start_timeout: float = float("inf"),
    at: datetime.datetime | None = None,
    planned_nodes: Mapping[int, str] | None = None,
) -> GangState:
    """The state of a gang of `expected` pods (missing pods count as deleted, on the node `planned_nodes` gives
    their rank, as a pod seen being deleted is). `lost_nodes` maps a node name to why it is lost ("is NotReady",
    "no longer exists")."""
    lost = lost_nodes or {}
    by_rank = {_rank(p): p for p in pods}
    ready = sum(1 for p in pods if _phase(p) == "Running")
    rank0 = by_rank.get(0)
    if rank0 is not None and _phase(rank0) == "Succeeded":
        return GangState("succeeded", ready)
    ordered = sorted(pods, key=_rank)
    for pod in ordered:
        if network := network_failure_of(pod):
            name = pod["metadata"]["name"]
            said = f"pod {name} on node {node_of(pod)}: {network.render()}"
            return GangState("broken", ready, said, name, node_of(pod), NETWORK, network=network)
    for pod in ordered:
        why = _breakage(pod, lost)
        if why:
            return GangState("broken", ready, why, pod["metadata"]["name"], node_of(pod))
    missing = [rank for rank in range(expected) if rank not in by_rank]
    if missing:
        node = (planned_nodes or {}).get(missing[0])
        return GangState("broken", ready, f"pod of node rank {missing[0]} was deleted", None, node)
    if ready == expected:
        return GangState("running", ready)
    return _start_timeout(pods, ready, start_timeout, at) or GangState("starting", ready)
