"""Step 4, name conflicts: a deleted job's children still hold our names, so wait for the garbage collector; a
name held by anyone else (a foreign object, or a foreign pod with a rank's name) is a NameConflict:
Scheduled=False naming the kind and name, the reservation released, a Warning Event, and no new attempt until
that object is gone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from paralleljob.handlers import gang
from paralleljob.handlers.passes import (
    NAME_CONFLICT_RECHECK_SECONDS,
    PREVIOUS_JOB_RECHECK_SECONDS,
    Outcome,
    Pass,
    delete_pods,
    is_terminating,
    write_record,
    write_status,
)
from paralleljob.k8s import reads, writes
from paralleljob.manifests import labels

NAME_CONFLICT = "NameConflict"


def wait_for_previous_job(p: Pass, previous: Sequence[Mapping[str, Any]], waiting: Outcome) -> Outcome:
    """Pods of a deleted job of the same name still hold our names: the garbage collector deletes them, and one
    stuck Terminating on a lost node is force-deleted as our own would be (the pass drained them first, with the
    single-node rule: `waiting` is that drain's outcome); the status and one Event say which pods the job waits
    for."""
    message = waiting_message(previous)
    said = str(p.status.get("message") or "").startswith("waiting for")
    patch = {"message": message} if p.live is not None else {"phase": p.idle_phase, "message": message}
    if write_status(p, patch) and not said:
        p.event("Normal", "WaitingForPreviousJob", message)
    recheck = min(waiting.requeue_after or PREVIOUS_JOB_RECHECK_SECONDS, PREVIOUS_JOB_RECHECK_SECONDS)
    return Outcome("waiting-for-previous-job", requeue_after=recheck)


def waits_on_conflict(p: Pass, pods: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a job whose record says a name conflict released its attempt still waits: until the pods it had
    created are gone, and while the object named in the conflict is still someone else's."""
    if p.record is None or not p.record.conflict:
        return False
    if pods:
        delete_pods(p, pods)
        return True
    named = writes.NameConflict.named_in(p.record.conflict)
    if named is None:
        return False
    held = writes.read(p.session, named[0], named[1], p.namespace)
    return held is not None and labels.claim_of(held, p.name, p.uid) == "foreign"


def name_conflict(p: Pass, conflict: writes.NameConflict) -> Outcome:
    """A child name is taken by someone else's object: release the reservation (the record says so first, then
    this attempt's pods go), say which object in Scheduled=False and a Warning Event, and look again later."""
    message = str(conflict)
    if p.live is not None:
        write_record(p, p.live.with_conflict(message))
    cond = p.condition("Scheduled", "False", NAME_CONFLICT, message)
    patch = {"phase": p.idle_phase, "message": message, "conditions": cond, "placement": None, "podsReady": 0}
    if write_status(p, patch):
        p.event("Warning", NAME_CONFLICT, message)
    # This pass may have created some of the pods already: list them again.
    delete_pods(p, [pod for pod in reads.list_job_pods(p.session, p.namespace, p.name) if labels.owned_by(pod, p.uid)])
    return Outcome("name-conflict", wake_others=True, requeue_after=NAME_CONFLICT_RECHECK_SECONDS)


def waiting_message(previous: Sequence[Mapping[str, Any]]) -> str:
    """What a job waiting for a deleted namesake's pods says: how many, and which (the stuck ones first)."""
    stuck = [pod for pod in previous if is_terminating(pod)]
    named = stuck or list(previous)
    names = ", ".join(f"{pod['metadata']['name']} (node {gang.node_of(pod)})" for pod in named[:5])
    more = f" and {len(named) - 5} more" if len(named) > 5 else ""
    how = "stuck Terminating" if stuck else "still there"
    return f"waiting for {len(previous)} pods of a deleted job of the same name to go ({how}): {names}{more}"
