"""Step 2, invalid spec (the API's rules, no `spec.template.env` name the operator sets, and the administrator's
admission policy, `api.policy`): Valid=False, an Event, no children. Without a live attempt the job waits in
Pending holding no reservation; with one (an edit broke the spec) the attempt goes on under its pinned spec and
only the next attempt waits for a valid spec.
"""

from __future__ import annotations

import datetime

from paralleljob.handlers.observed import INVALID_NOTE, RUNNING_CONTINUES, Observed, condition, status_patch
from paralleljob.handlers.settings import Settings
from paralleljob.manifests.decisions import Decision, Event


def decide(seen: Observed, settings: Settings, now: datetime.datetime) -> Decision:
    """Valid=False: with no admitted attempt, the job waits (`without_attempt`); with a live one, the attempt
    goes on (`while_running`, whose decision the pass writes before it supervises the attempt)."""
    return without_attempt(seen, now) if seen.live is None else while_running(seen, now)


def without_attempt(seen: Observed, now: datetime.datetime) -> Decision:
    """Valid=False with no admitted attempt (never admitted, or a gang restart into an invalid spec): Pending,
    holding no reservation (a restart's hold is released from its record; the pass drained the old generation's
    pods first); an Event."""
    message = seen.spec_problems
    released = seen.record is not None and seen.record.reserving
    cond = condition(seen, "Valid", "False", "InvalidSpec", message, now)
    patch = {"phase": "Pending", "message": f"invalid spec: {message}", "conditions": cond, "placement": None}
    written = status_patch(seen, {**patch, "heldNodes": None, "heldUntil": None})
    return Decision(
        "invalid",
        status=written,
        events=(Event("Warning", "InvalidSpec", message),) if written else (),
        record=seen.record.without_hold() if seen.record is not None and released else None,
        wake_others=released,
    )


def while_running(seen: Observed, now: datetime.datetime) -> Decision:
    """Valid=False on a job whose attempt is live: an edit broke the spec (the fields the CRD lets change). The
    attempt goes on under its pinned spec, supervised as before (completion, failures, restarts); only the
    next attempt waits for a valid spec. One Event when the condition turns False."""
    cond = condition(seen, "Valid", "False", "InvalidSpec", seen.spec_problem, now)
    # status_patch adds the note to the gang's own message, as every write of this pass does.
    gang_message = running_message(str(seen.status.get("message") or ""))
    written = status_patch(seen, {"message": gang_message, "conditions": cond})
    event = Event("Warning", "InvalidSpec", f"{seen.spec_problem}{RUNNING_CONTINUES}")
    return Decision("invalid-while-running", status=written, events=(event,) if written else ())


def running_message(status_message: str) -> str:
    """The gang's own message, without the note an invalid spec added to it (`status_patch` adds it again)."""
    return status_message.split(INVALID_NOTE)[0] or "supervising the running attempt"
