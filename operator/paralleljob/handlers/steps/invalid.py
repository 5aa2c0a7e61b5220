"""Step 2, invalid spec (the API's rules, no `spec.template.env` name the operator sets, and the administrator's
admission policy, `api.policy`): Valid=False, an Event, no children. Without a live attempt the job waits in
Pending holding no reservation; with one (an edit broke the spec) the attempt goes on under its pinned spec and
only the next attempt waits for a valid spec.
"""

from __future__ import annotations

from paralleljob.handlers.passes import (
    INVALID_NOTE,
    RUNNING_CONTINUES,
    Outcome,
    Pass,
    write_record,
    write_status,
)


def invalid_spec(p: Pass, message: str) -> Outcome:
    """Valid=False with no admitted attempt (never admitted, or a gang restart into an invalid spec): Pending,
    holding no reservation (a restart's hold is released from its record; the pass drained the old generation's
    pods first); an Event."""
    released = p.record is not None and p.record.reserving
    if p.record is not None and released:
        write_record(p, p.record.without_hold())
    cond = p.condition("Valid", "False", "InvalidSpec", message)
    patch = {"phase": "Pending", "message": f"invalid spec: {message}", "conditions": cond, "placement": None}
    if write_status(p, {**patch, "heldNodes": None, "heldUntil": None}):
        p.event("Warning", "InvalidSpec", message)
    return Outcome("invalid", wake_others=released)


def invalid_while_running(p: Pass) -> None:
    """Valid=False on a job whose attempt is live: an edit broke the spec (the fields the CRD lets change). The
    attempt goes on under its pinned spec, supervised as before (completion, failures, restarts); only the
    next attempt waits for a valid spec. One Event when the condition turns False."""
    cond = p.condition("Valid", "False", "InvalidSpec", p.spec_problem)
    # write_status adds the note to the gang's own message, as it does on every write of this pass.
    gang_message = running_message(str(p.status.get("message") or ""))
    if write_status(p, {"message": gang_message, "conditions": cond}):
        p.event("Warning", "InvalidSpec", f"{p.spec_problem}{RUNNING_CONTINUES}")


def running_message(status_message: str) -> str:
    """The gang's own message, without the note an invalid spec added to it (`write_status` adds it again)."""
    return status_message.split(INVALID_NOTE)[0] or "supervising the running attempt"
