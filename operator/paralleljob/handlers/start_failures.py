"""Why a Pending pod of a gang is not starting, and from which of the cluster's own facts its wait is measured.

A pod is stalled in one of four ways, each with its own clock, all read from times the API server wrote
(never the operator's clock at creation; `Session.server_now()` gives the server's present moment):

- refused by the scheduler (`PodScheduled=False`): since the pod's `creationTimestamp`, for the start timeout;
- its image cannot be pulled (`ErrImagePull`, then `ImagePullBackOff` while the kubelet waits to try again):
  not timed, but counted. Each new `ErrImagePull` is one failed pull (`PullFailures`, fed by the job-pods
  watch, so no state change between two passes is missed); after `pull_retries` of them the node is blamed.
  One transient failure after a long pull therefore never restarts a gang;
- its container cannot be created (`CreateContainerConfigError`, `CreateContainerError`, `InvalidImageName`):
  since `PodScheduled=True`'s `lastTransitionTime`, for the start timeout;
- still `ContainerCreating` (a volume that does not mount, an image pull that does not finish): since
  `PodScheduled=True`'s `lastTransitionTime`, for the longer container-creating timeout.

A gang also cannot start while pods of its previous attempt linger Terminating on a node whose kubelet is
alive (a finalizer, a process that does not stop): `lingering_note` says so, for the status and an Event; the
operator never force-deletes those (their containers may still run), unlike pods on a lost node.

Pure, apart from the thread-safe `PullFailures` the operator's watch thread writes while passes read.
"""

from __future__ import annotations

import dataclasses
import datetime
import threading
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Literal

from paralleljob.manifests import timestamps

PULL_FAILED, PULL_BACKOFF = "ErrImagePull", "ImagePullBackOff"
CREATING = "ContainerCreating"
# Waiting reasons that waiting on the kubelet does not clear (restartPolicy is Never), timed from scheduling.
CREATE_ERRORS = frozenset({"InvalidImageName", "CreateContainerConfigError", "CreateContainerError"})
Clock = Literal["unschedulable", "pull", "create", "creating"]


@dataclasses.dataclass(frozen=True)
class Stall:
    """One stalled pod: why, which clock applies, since when (a server timestamp), and failed pulls so far."""

    reason: str
    clock: Clock
    since: str | None
    pulls: int = 0


@dataclasses.dataclass(frozen=True)
class Limits:
    """How long each clock runs before the attempt fails, and how many failed pulls blame the node."""

    start_timeout: float = float("inf")
    creating_timeout: float = float("inf")
    pull_retries: int = 3

    def timeout(self, clock: Clock) -> float:
        return self.creating_timeout if clock == "creating" else self.start_timeout


def stall_of(pod: Mapping[str, Any], pull_failures: Mapping[str, int] | None = None) -> Stall | None:
    """Why a Pending pod is not starting, when the scheduler or the kubelet says so; None otherwise."""
    status = pod.get("status") or {}
    if (status.get("phase") or "Pending") != "Pending" or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    scheduled = _condition(status, "PodScheduled")
    if scheduled and scheduled.get("status") == "False":
        why = f"{scheduled.get('reason') or 'Unschedulable'}: {scheduled.get('message') or 'not scheduled'}"
        return Stall(why, "unschedulable", pod["metadata"].get("creationTimestamp"))
    since = (scheduled or {}).get("lastTransitionTime") or pod["metadata"].get("creationTimestamp")
    for container in status.get("containerStatuses") or ():
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        said = f"{reason}: {waiting.get('message') or 'container not created'}"
        if reason in (PULL_FAILED, PULL_BACKOFF):
            counted = (pull_failures or {}).get(str(pod["metadata"].get("uid")), 0)
            return Stall(said, "pull", since, max(1, counted))
        if reason in CREATE_ERRORS:
            return Stall(said, "create", since)
        if reason == CREATING and (spec_node := (pod.get("spec") or {}).get("nodeName")):
            return Stall(f"{CREATING} on node {spec_node}", "creating", since)
    return None


def overdue(stall: Stall, limits: Limits, now: datetime.datetime) -> tuple[bool, float | None]:
    """Whether the stall fails the attempt now, else in how many seconds to look again (None: on an event)."""
    if stall.clock == "pull":
        return stall.pulls >= limits.pull_retries, None
    timeout = limits.timeout(stall.clock)
    age = timestamps.seconds_since(stall.since, now)
    if age is None or timeout == float("inf"):
        return False, None
    return age >= timeout, max(0.0, timeout - age)


def describe(stall: Stall, limits: Limits) -> str:
    """How the stall failed the attempt, in words."""
    if stall.clock == "pull":
        return f"the image pull failed {stall.pulls} times ({stall.reason})"
    if stall.clock == "creating":
        return (
            f"stayed {stall.reason} for {limits.creating_timeout:.0f}s after being scheduled (a volume that "
            "does not mount, or an image pull that does not finish: see the pod's Events)"
        )
    return f"did not start within {limits.start_timeout:.0f}s ({stall.reason})"


def waiting_note(stall: Stall, limits: Limits) -> str | None:
    """What a starting gang's status message says about a stalled pod before it fails the attempt; None for
    ContainerCreating, which every pod goes through."""
    if stall.clock == "pull":
        return f"{stall.reason} (failed pull {stall.pulls} of {limits.pull_retries} before the node is blamed)"
    return None if stall.clock == "creating" else stall.reason


def lingering_note(
    terminating: Sequence[Mapping[str, Any]], lost: Collection[str], now: datetime.datetime, after: float
) -> str | None:
    """What holds the next attempt back: the pods Terminating longer than `after` seconds (from the server's
    deletionTimestamp) on a node that is not lost; None when there are none."""
    stuck = []
    for pod in terminating:
        node = (pod.get("spec") or {}).get("nodeName")
        since = pod["metadata"].get("deletionTimestamp")
        age = timestamps.seconds_since(since, now)
        if node not in lost and age is not None and age >= after:
            stuck.append((pod["metadata"]["name"], node, since))
    if not stuck:
        return None
    name, node, since = stuck[0]
    others = f" (and {len(stuck) - 1} more)" if len(stuck) > 1 else ""
    return (
        f"pod {name}{others} of the previous attempt is stuck Terminating on node {node} since {since}: its "
        "kubelet is alive but has not confirmed that the containers stopped (a finalizer, or a process that "
        "does not exit); the next attempt starts once it is gone"
    )


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in status.get("conditions") or ():
        if condition.get("type") == kind:
            return condition  # type: ignore[no-any-return]
    return None


class PullFailures:
    """Failed image pulls per pod uid, counted from the job-pods watch: each time a container's waiting reason
    becomes ErrImagePull (the kubelet alternates it with ImagePullBackOff between tries). Kept in memory: an
    operator restart starts the counts again, which can only lengthen the wait."""

    def __init__(self) -> None:
        self._last: dict[str, str] = {}
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def observe(self, event_type: str, pod: Mapping[str, Any]) -> None:
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if not uid:
            return
        with self._lock:
            if event_type == "DELETED" or (pod.get("status") or {}).get("phase") not in (None, "Pending"):
                self._last.pop(uid, None)
                self._counts.pop(uid, None)
                return
            reason = _waiting_reason(pod)
            before = self._last.get(uid)
            if reason == PULL_FAILED and before != PULL_FAILED:
                self._counts[uid] = self._counts.get(uid, 0) + 1
            elif reason == PULL_BACKOFF and uid not in self._counts:
                self._counts[uid] = 1  # a pull failed before this operator looked
            if reason:
                self._last[uid] = reason

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


def _waiting_reason(pod: Mapping[str, Any]) -> str:
    for container in (pod.get("status") or {}).get("containerStatuses") or ():
        reason = ((container.get("state") or {}).get("waiting") or {}).get("reason")
        if reason:
            return str(reason)
    return ""
