"""Step 3, draining: pods of an older attempt exist. Delete them gracefully, force-deleting only those stuck
Terminating on a lost node once overdue (never the only pod of a gang on a merely NotReady node), and wait until
every one is gone: two generations never run at once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from paralleljob.handlers import gang, start_failures
from paralleljob.handlers.nodes import OUT_OF_SERVICE_TAINT
from paralleljob.handlers.passes import (
    Outcome,
    Pass,
    delete_pods,
    deleting_for,
    is_terminating,
    lost_nodes,
    write_status,
)
from paralleljob.k8s import writes
from paralleljob.manifests import labels

log = logging.getLogger(__name__)

# What happens to a Terminating pod of an older attempt (`terminating_verdict`).
KUBELET, WAIT_FOR_NODE, FORCE, WAIT = "kubelet", "wait-for-node", "force", "wait"


def drain(p: Pass, stale: Sequence[Mapping[str, Any]]) -> Outcome:
    """Delete the pods of older attempts; force only those whose node is lost, once overdue."""
    delete_pods(p, stale)
    terminating = [pod for pod in stale if is_terminating(pod)]
    if not terminating:
        return Outcome("deleting-old-generation")
    lost = lost_nodes(p, [gang.node_of(pod) for pod in terminating])
    force_after = p.settings.force_delete_after_seconds
    recheck = force_after
    for pod in terminating:
        node = gang.node_of(pod)
        action, wait = terminating_verdict(
            on_lost_node=node in lost,
            alone_on_partitioned_node=_only_pod_of_gang(pod)
            and node in p.nodes.not_ready
            and node not in p.nodes.snapshot.out_of_service,
            deleting_for=deleting_for(p, pod),
            force_after=force_after,
        )
        if action == WAIT_FOR_NODE:
            _stuck_terminating(p, pod, node)
            recheck = min(recheck, p.settings.resync_seconds)
        elif action == FORCE:
            log.warning("force-deleting %s: node %s is lost", pod["metadata"]["name"], node)
            writes.delete_pod(p.session, p.namespace, pod["metadata"]["name"], force=True)
        elif wait is not None:
            recheck = min(recheck, wait)
    note = start_failures.lingering_note(terminating, lost, p.session.server_now(), force_after)
    if note and write_status(p, {"message": note}):
        p.event("Warning", "StuckTerminating", note)
    return Outcome("deleting-old-generation", requeue_after=recheck)


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


def _stuck_terminating(p: Pass, pod: Mapping[str, Any], node: str | None) -> None:
    message = (
        f"pod {pod['metadata']['name']} is stuck Terminating on NotReady node {node}; it is the gang's only pod, "
        f"so it is not force-deleted: delete the node, or taint it {OUT_OF_SERVICE_TAINT}=nodeshutdown:NoExecute "
        "once it is known to be down"
    )
    if write_status(p, {"message": message}):
        p.event("Warning", "StuckTerminating", message)
