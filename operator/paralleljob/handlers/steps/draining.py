"""Step 3, draining: pods of an older attempt exist. Delete them gracefully, force-deleting only those stuck
Terminating on a lost node once overdue (never the only pod of a gang on a merely NotReady node), and wait until
every one is gone: two generations never run at once.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from paralleljob.handlers import gang, start_failures
from paralleljob.handlers.nodes import OUT_OF_SERVICE_TAINT
from paralleljob.handlers.observed import Observed, deleting_for, is_terminating, pod_name, status_patch
from paralleljob.handlers.settings import Settings
from paralleljob.manifests import labels
from paralleljob.manifests.decisions import Decision, Event

# What happens to a Terminating pod of an older attempt (`terminating_verdict`).
KUBELET, WAIT_FOR_NODE, FORCE, WAIT = "kubelet", "wait-for-node", "force", "wait"


def decide(seen: Observed, settings: Settings, now: datetime.datetime) -> Decision:
    """Delete the job's pods of older attempts; force only those whose node is lost, once overdue."""
    return drain(seen, seen.stale, settings, now)


def drain(seen: Observed, stale: Sequence[Mapping[str, Any]], settings: Settings, now: datetime.datetime) -> Decision:
    """Delete these pods (of an older attempt, or of a deleted namesake); force only those whose node is lost,
    once overdue."""
    deletes = tuple(pod_name(pod) for pod in stale if not is_terminating(pod))
    terminating = [pod for pod in stale if is_terminating(pod)]
    if not terminating:
        return Decision("deleting-old-generation", deletes=deletes)
    force_after = settings.force_delete_after_seconds
    recheck, forced, said = force_after, list[str](), list[str]()
    for pod in terminating:
        node = gang.node_of(pod)
        action, wait = terminating_verdict(
            on_lost_node=node in seen.lost,
            alone_on_partitioned_node=_only_pod_of_gang(pod)
            and node in seen.not_ready
            and node not in seen.out_of_service,
            deleting_for=deleting_for(pod, now),
            force_after=force_after,
        )
        if action == WAIT_FOR_NODE:
            said.append(_stuck_terminating(pod, node))
            recheck = min(recheck, settings.resync_seconds)
        elif action == FORCE:
            forced.append(pod_name(pod))
        elif wait is not None:
            recheck = min(recheck, wait)
    note = start_failures.lingering_note(terminating, seen.lost, now, force_after)
    return _saying(seen, [*said, *([note] if note else [])]).then(
        Decision("deleting-old-generation", deletes=deletes, force_deletes=tuple(forced), requeue_after=recheck)
    )


def _saying(seen: Observed, messages: Sequence[str]) -> Decision:
    """Each message in turn as the job's status message, with a StuckTerminating Event when it changes it: the
    status ends with the last."""
    decision = Decision("deleting-old-generation")
    for message in messages:
        written = status_patch(seen, {"message": message})
        if written:
            seen = seen.with_status(written)
            said = Decision(
                "deleting-old-generation", status=written, events=(Event("Warning", "StuckTerminating", message),)
            )
            decision = decision.then(said)
    return decision


def terminating_verdict(
    *, on_lost_node: bool, alone_on_partitioned_node: bool, deleting_for: float, force_after: float
) -> tuple[str, float | None]:
    """What to do with a Terminating pod of an older attempt, and in how many seconds to look again: left to its
    kubelet when its node is alive; left alone when it is its gang's only pod on a NotReady node that is neither
    deleted nor tainted out-of-service (were its node only partitioned, the pod would still run, and the next
    generation would write to the same checkpoint folder beside it: as a StatefulSet does, wait for the node to
    be deleted or tainted); force-deleted once `force_after` seconds past its deletion; else waited for."""
    if not on_lost_node:
        return KUBELET, None
    if alone_on_partitioned_node:
        return WAIT_FOR_NODE, None
    overdue = deleting_for - force_after
    return (FORCE, None) if overdue >= 0 else (WAIT, -overdue + 0.5)


def _only_pod_of_gang(pod: Mapping[str, Any]) -> bool:
    """Whether the pod was its gang's only one (its gang-size label; a pod without it is treated as alone)."""
    found = str((pod["metadata"].get("labels") or {}).get(labels.GANG_SIZE_LABEL) or "")
    return not found.isdigit() or int(found) <= 1


def _stuck_terminating(pod: Mapping[str, Any], node: str | None) -> str:
    return (
        f"pod {pod_name(pod)} is stuck Terminating on NotReady node {node}; it is the gang's only pod, "
        f"so it is not force-deleted: delete the node, or taint it {OUT_OF_SERVICE_TAINT}=nodeshutdown:NoExecute "
        "once it is known to be down"
    )
