"""The gang policy: what the pods of the current attempt say about the job. Pure, with a table test.

Rank 0 Succeeded means the trainer finished; the other ranks are exiting, and get `FINISH_GRACE_SECONDS`
from rank 0's finish to end on their own (verdict finishing) before the job is Succeeded and the pods still
running are deleted: so a rank that is a moment behind keeps its logs, and a hung one frees its GPUs. Any pod Failed (evicted
pods are Failed with reason Evicted), being deleted, missing after the gang was complete, or on a lost node
(NotReady, or deleted from the cluster) breaks the gang: every rank waits on NCCL for the lost one, so the
whole gang restarts. So does a gang that cannot start (`handlers.start_failures`: a pod the scheduler refuses,
an image that fails to pull again and again, a container that cannot be created or stays ContainerCreating),
blaming the planned node of every stalled pod so that the next attempt avoids them.
A failed pod whose container's termination message reports a network failure (the trainer's preflight, or
NCCL's choice under spec.network.verify: fail) breaks it with cause NetworkNotReady: the reconciler fails
the job instead of restarting it, since a restart on the same spec and nodes would fail the same way.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from paralleljob.handlers.start_failures import Limits, describe, overdue, stall_of, waiting_note
from paralleljob.manifests import labels, timestamps
from paralleljob_contract.network import NetworkFailure, parse_failure, slow_nodes

Verdict = Literal["succeeded", "finishing", "broken", "running", "starting"]
# How long the other ranks have, from rank 0's finish, to end on their own before the job ends without them.
FINISH_GRACE_SECONDS = 30.0
NO_LIMITS = Limits()  # no timeouts: a stalled gang waits (the table tests pass their own)
# Causes, used as condition reasons: GangRestart for a lost or failed pod; the others name what happened.
BROKEN, START_TIMEOUT, CREATE_FAILED = "GangRestart", "StartTimeout", "CreateFailed"
NETWORK = "NetworkNotReady"


@dataclasses.dataclass(frozen=True)
class GangState:
    """The verdict, with the pod and node to blame when broken (and, for a gang that cannot start, the planned
    nodes of every stalled pod), and for a starting gang what it waits on and when to look again (the moment a
    stalled pod reaches its timeout)."""

    verdict: Verdict
    ready: int
    reason: str = ""
    pod: str | None = None
    node: str | None = None
    cause: str = BROKEN
    recheck_in: float | None = None
    network: NetworkFailure | None = None
    blamed: tuple[str, ...] = ()


def node_of(pod: Mapping[str, Any]) -> str | None:
    """The node a pod is bound to, or the one it was created for (its node label) before it is bound."""
    spec = pod.get("spec") or {}
    node = spec.get("nodeName") or (pod.get("metadata") or {}).get("labels", {}).get(labels.NODE_LABEL)
    return str(node) if node else None


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
    if node is not None and node in lost_nodes:
        return f"node {node} of pod {name} {lost_nodes[node]}"
    return None


def _start_timeout(
    pods: Sequence[Mapping[str, Any]], ready: int, limits: Limits, at: datetime.datetime, pulls: Mapping[str, int]
) -> GangState | None:
    """A broken state when a stalled pod is overdue (`handlers.start_failures`), blaming the planned node of
    every stalled pod; else a starting one that says what it waits on, due for a recheck."""
    stalls = [(pod, found) for pod in sorted(pods, key=_rank) if (found := stall_of(pod, pulls))]
    recheck: float | None = None
    for pod, stall in stalls:
        due, left = overdue(stall, limits, at)
        if due:
            name = pod["metadata"]["name"]
            reason = f"pod {name} {describe(stall, limits)}"
            blamed = tuple(dict.fromkeys(node for other, _ in stalls if (node := node_of(other))))
            return GangState("broken", ready, reason, name, node_of(pod), START_TIMEOUT, blamed=blamed)
        if left is not None:
            recheck = left if recheck is None else min(recheck, left)
    if not stalls:
        return None
    notes = [f"pod {pod['metadata']['name']}: {note}" for pod, stall in stalls if (note := waiting_note(stall, limits))]
    return GangState("starting", ready, notes[0] if notes else "", recheck_in=recheck)


def judge(
    pods: Sequence[Mapping[str, Any]],
    expected: int,
    lost_nodes: Mapping[str, str] | None = None,
    *,
    limits: Limits = NO_LIMITS,
    at: datetime.datetime | None = None,
    planned_nodes: Mapping[int, str] | None = None,
    pull_failures: Mapping[str, int] | None = None,
) -> GangState:
    """The state of a gang of `expected` pods (missing pods count as deleted, on the node `planned_nodes` gives
    their rank, as a pod seen being deleted is). `lost_nodes` maps a node name to why it is lost ("is NotReady",
    "no longer exists"); `at` is the API server's present moment (the pods' times are the server's), and
    `pull_failures` the failed image pulls counted per pod uid."""
    lost = lost_nodes or {}
    by_rank = {_rank(p): p for p in pods}
    ready = sum(1 for p in pods if _phase(p) == "Running")
    rank0 = by_rank.get(0)
    moment = at or datetime.datetime.now(datetime.UTC)
    if rank0 is not None and _phase(rank0) == "Succeeded":
        return _finished(pods, rank0, ready, moment)
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
    return _start_timeout(pods, ready, limits, moment, pull_failures or {}) or GangState("starting", ready)


def _finished(
    pods: Sequence[Mapping[str, Any]], rank0: Mapping[str, Any], ready: int, at: datetime.datetime
) -> GangState:
    """Rank 0 Succeeded: succeeded once every other pod has ended (or is gone) or `FINISH_GRACE_SECONDS` have
    passed since rank 0's container finished (at once when its status does not say when); until then
    finishing, to be looked at again when the grace runs out."""
    running = [p for p in pods if _phase(p) not in ("Succeeded", "Failed")]
    finished = _finished_at(rank0)
    if not running or finished is None:
        return GangState("succeeded", ready)
    left = FINISH_GRACE_SECONDS - (at - finished).total_seconds()
    if left <= 0:
        return GangState("succeeded", ready)
    names = ", ".join(p["metadata"]["name"] for p in running)
    return GangState(
        "finishing", ready, f"rank 0 finished; waiting up to {left:.0f}s for {names} to exit", recheck_in=left
    )


def _finished_at(pod: Mapping[str, Any]) -> datetime.datetime | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        stamp = ((status.get("state") or {}).get("terminated") or {}).get("finishedAt")
        if stamp:
            return timestamps.parse(str(stamp))
    return None


def slow_link_restart(state: GangState) -> GangState | None:
    """A gang the link check stopped (spec.network.preflight: fail, reason SlowLink) restarts planned without
    the nodes it named: the state to restart with, those nodes blamed (not the pod that happened to report,
    since every rank stops with the same reason), or None for any other state (other network failures stay
    fatal). A SlowLink message that names no node cannot move the job anywhere else: None as well."""
    named = slow_nodes(state.network)
    if not named:
        return None
    return dataclasses.replace(state, node=None, network=None, blamed=(*state.blamed, *named))
