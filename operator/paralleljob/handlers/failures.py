"""The failure policy of reconcile passes: a pass that keeps failing says so on the job.

Called by the coalescer (through `registry`) after each pass that raised, with the number of failures in a
row. The first failure is only logged (an API hiccup heals on the retry); from the second on, the job gets
condition `Reconciled=False` with reason `PlanningFailed` (the planner raised) or `ReconcileError` (anything
else), the error as its message, and one Warning Event when the condition turns False. The coalescer retries
with exponential backoff (1 s doubling to 60 s). The next pass that succeeds sets `Reconciled=True` again
(`recovered`), so the condition is written only on a change.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kubernetes

from paralleljob.handlers import conditions
from paralleljob.handlers.placement import PlanningFailed
from paralleljob.k8s import events, reads, writes
from paralleljob.k8s.session import Session

log = logging.getLogger(__name__)

CONDITION = "Reconciled"
PLANNING_FAILED, RECONCILE_ERROR, RECONCILED = "PlanningFailed", "ReconcileError", "Reconciled"
# Failures in a row before the job is told: one failed pass is retried at once and usually heals.
REPORT_AFTER = 2
MESSAGE_LIMIT = 1000


def describe(error: BaseException) -> str:
    """One line: the error's type and message (an API error's status and reason, not its headers)."""
    if isinstance(error, kubernetes.client.ApiException):
        text = f"API error {error.status} {error.reason}"
    else:
        cause = error.__cause__ if isinstance(error, PlanningFailed) and error.__cause__ else error
        text = f"{type(cause).__name__}: {cause}"
    return " ".join(text.split())[:MESSAGE_LIMIT]


def reason_of(error: BaseException) -> str:
    return PLANNING_FAILED if isinstance(error, PlanningFailed) else RECONCILE_ERROR


def report(session: Session, namespace: str, name: str, error: BaseException, failures: int) -> bool:
    """Set Reconciled=False on the job after REPORT_AFTER failures in a row; True when it was written."""
    if failures < REPORT_AFTER:
        return False
    job = reads.get_job(session, namespace, name)
    if job is None:
        return False
    status = job.get("status") or {}
    reason, message = reason_of(error), f"{describe(error)} ({failures} failed passes in a row; retrying)"
    current = conditions.find(status.get("conditions"), CONDITION)
    generation = job["metadata"].get("generation")
    turned = not current or current.get("status") != "False" or current.get("reason") != reason
    cond = conditions.set_condition(status.get("conditions"), CONDITION, "False", reason, message, generation)
    writes.patch_job_status(session, namespace, name, {"conditions": cond})
    if turned:
        events.post(session, job, "Warning", reason, message)
    log.warning("%s/%s: %s", namespace, name, message)
    return True


def recovered(job: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The conditions with Reconciled=True, when an earlier pass left it False; None when nothing changes."""
    status = job.get("status") or {}
    current = conditions.find(status.get("conditions"), CONDITION)
    if not current or current.get("status") != "False":
        return None
    generation = job["metadata"].get("generation")
    return conditions.set_condition(
        status.get("conditions"), CONDITION, "True", RECONCILED, "the last pass succeeded", generation
    )
