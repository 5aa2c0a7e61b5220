"""Step 4, name conflicts: a deleted job's children still hold our names, so wait for the garbage collector; a
name held by anyone else (a foreign object, or a foreign pod with a rank's name) is a NameConflict:
Scheduled=False naming the kind and name, the reservation released, a Warning Event, and no new attempt until
that object is gone.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from paralleljob.handlers import gang
from paralleljob.handlers.observed import (
    NAME_CONFLICT_RECHECK_SECONDS,
    PREVIOUS_JOB_RECHECK_SECONDS,
    Observed,
    condition,
    is_terminating,
    pod_name,
    status_patch,
)
from paralleljob.handlers.settings import Settings
from paralleljob.manifests.decisions import Decision, Event

NAME_CONFLICT = "NameConflict"


def decide(seen: Observed, settings: Settings, now: datetime.datetime) -> Decision | None:
    """A write of this pass refused for a name someone else holds (`name_conflict`), or a job whose record says
    such a conflict released its attempt and that still waits (`still_waiting`); None when neither holds."""
    if seen.refused:
        return name_conflict(seen, seen.refused, now)
    return still_waiting(seen)


def wait_for_previous_job(seen: Observed, drained: Decision) -> Decision:
    """Pods of a deleted job of the same name still hold our names: the garbage collector deletes them, and one
    stuck Terminating on a lost node is force-deleted as our own would be (`drained`: the draining step's
    decision on them, with the single-node rule); the status and one Event say which pods the job waits for."""
    seen = seen.with_status(drained.status)
    message = waiting_message(seen.namesake)
    said = str(seen.status.get("message") or "").startswith("waiting for")
    written = status_patch(
        seen, {"message": message} if seen.live is not None else {"phase": seen.idle_phase, "message": message}
    )
    event = Event("Normal", "WaitingForPreviousJob", message)
    recheck = min(drained.requeue_after or PREVIOUS_JOB_RECHECK_SECONDS, PREVIOUS_JOB_RECHECK_SECONDS)
    waiting = Decision(
        "waiting-for-previous-job",
        status=written,
        events=(event,) if written and not said else (),
        requeue_after=recheck,
    )
    return drained.then(waiting)


def still_waiting(seen: Observed) -> Decision | None:
    """A job whose record says a name conflict released its attempt still waits: until the pods it had created
    are gone (they are deleted), and while the object named in the conflict is still someone else's."""
    if seen.record is None or not seen.record.conflict:
        return None
    if seen.pods:
        deletes = tuple(pod_name(pod) for pod in seen.pods if not is_terminating(pod))
        return Decision("name-conflict", deletes=deletes, requeue_after=NAME_CONFLICT_RECHECK_SECONDS)
    if seen.conflict_held:
        return Decision("name-conflict", requeue_after=NAME_CONFLICT_RECHECK_SECONDS)
    return None


def name_conflict(seen: Observed, message: str, now: datetime.datetime) -> Decision:
    """A child name is taken by someone else's object: release the reservation (the record says so, then this
    attempt's pods go, as read after the refusal), say which object in Scheduled=False and a Warning Event, and
    look again later."""
    cond = condition(seen, "Scheduled", "False", NAME_CONFLICT, message, now)
    patch = {"phase": seen.idle_phase, "message": message, "conditions": cond, "placement": None, "podsReady": 0}
    written = status_patch(seen, patch)
    return Decision(
        "name-conflict",
        status=written,
        events=(Event("Warning", NAME_CONFLICT, message),) if written else (),
        record=seen.live.with_conflict(message) if seen.live is not None else None,
        deletes=tuple(pod_name(pod) for pod in seen.pods if not is_terminating(pod)),
        requeue_after=NAME_CONFLICT_RECHECK_SECONDS,
        wake_others=True,
    )


def waiting_message(previous: Sequence[Mapping[str, Any]]) -> str:
    """What a job waiting for a deleted namesake's pods says: how many, and which (the stuck ones first)."""
    stuck = [pod for pod in previous if is_terminating(pod)]
    named = stuck or list(previous)
    names = ", ".join(f"{pod['metadata']['name']} (node {gang.node_of(pod)})" for pod in named[:5])
    more = f" and {len(named) - 5} more" if len(named) > 5 else ""
    how = "stuck Terminating" if stuck else "still there"
    return f"waiting for {len(previous)} pods of a deleted job of the same name to go ({how}): {names}{more}"
