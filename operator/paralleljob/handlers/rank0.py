"""What node rank 0 reported in its progress ConfigMap, turned into what a supervision pass writes: the report
validated (`manifests.progress.status_of`), the in-place restarts it counts (into the record and the status, with
one Event each), the NetworkReady and NetworkVerified conditions from its network verdict (and a Warning when NCCL
chose less than the job planned), and SlowerThanModeled from its measured and modeled step times. Pure: plain
values in, conditions and Decisions out; `steps.supervision` decides with them.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any

from paralleljob.api import ResolvedJob
from paralleljob.handlers import conditions, step_promise
from paralleljob.handlers.observed import Observed, condition, status_patch
from paralleljob.manifests import pods as pod_manifests
from paralleljob.manifests import progress as progress_channel
from paralleljob.manifests import records
from paralleljob.manifests.decisions import Decision, Event

VERIFIED_STATUSES = ("True", "False", "Unknown")


def report(seen: Observed, resolved: ResolvedJob) -> dict[str, Any]:
    """What rank 0 reported in its progress ConfigMap, validated (`manifests.progress.status_of`): progress,
    lastCheckpointStep and the network verdict; empty without a ConfigMap of this job's."""
    found = seen.progress
    return progress_channel.status_of(found, resolved.spec.training.steps) if found is not None else {}


def with_reported_in_place_restarts(seen: Observed, resolved: ResolvedJob) -> tuple[Decision | None, Observed]:
    """Rank 0's in-place restarts counted, before a broken gang is restarted or failed (a report that came after
    the last pass over the running gang would otherwise be lost with its pods): what that writes, and the
    observation as the rest of the decision builds on it."""
    live = seen.live
    if live is None or not pod_manifests.in_place_budget(resolved, live.attempt) or seen.progress is None:
        return None, seen
    counted = count_in_place_restarts(seen, resolved, seen.progress, live)
    if counted is None:
        return None, seen
    return counted, dataclasses.replace(seen.with_status(counted.status), record=counted.record)


def count_in_place_restarts(
    seen: Observed, resolved: ResolvedJob, found: Mapping[str, Any], live: records.AttemptRecord
) -> Decision | None:
    """The in-place restarts rank 0 reports for the live attempt, validated and within the attempt's budget,
    into its record and the job's status, with one Event per restart counted; None when none is new."""
    budget = pod_manifests.in_place_budget(resolved, live.attempt)
    count = progress_channel.in_place_restarts_of(found, live.started_at, budget)
    if count is None or count <= live.in_place_restarts:
        return None
    limit = resolved.spec.failure_policy.backoff_limit
    before = int(seen.status.get("inPlaceRestarts") or 0) - live.in_place_restarts
    events = tuple(
        Event(
            "Warning",
            "RestartedInPlace",
            f"in-place restart {live.attempt + number}/{limit}: a rank failed and every pod restarted its ranks "
            f"from the last checkpoint; no pod was recreated ({number}/{budget} in place for these pods)",
        )
        for number in range(live.in_place_restarts + 1, count + 1)
    )
    status = status_patch(seen, {"restarts": live.attempt + count, "inPlaceRestarts": max(0, before) + count})
    return Decision("running", record=live.with_in_place_restarts(count), status=status, events=events)


def network_conditions(
    seen: Observed, cond: list[dict[str, Any]], report: Mapping[str, Any] | None, now: datetime.datetime
) -> list[dict[str, Any]]:
    """NetworkReady and NetworkVerified from rank 0's network verdict, once it has arrived: it is sent after a
    warm-up collective over every rank, so every rank passed the preflight."""
    if not report:
        return cond
    ready = "every rank passed the network preflight and joined the process groups"
    cond = condition(seen, "NetworkReady", "True", "PreflightPassed", ready, now, base=cond)
    verified = str(report.get("verified")) if report.get("verified") in VERIFIED_STATUSES else "Unknown"
    reason, message = str(report.get("reason") or "NotReported"), str(report.get("message") or "")
    return condition(seen, "NetworkVerified", verified, reason, message, now, base=cond)


def step_promise_conditions(
    seen: Observed, cond: list[dict[str, Any]], progress: Mapping[str, Any], factor: float, now: datetime.datetime
) -> list[dict[str, Any]]:
    """SlowerThanModeled from rank 0's measured and modeled step times (`step_promise`, a pure decision)."""
    measured, modeled = progress.get("stepSeconds"), progress.get("modeledStepSeconds")
    current = conditions.find(cond, step_promise.TYPE)
    verdict = step_promise.decide(measured, modeled, factor, current, now)
    if verdict is None:
        return cond
    return condition(seen, step_promise.TYPE, verdict.status, verdict.reason, verdict.message, now, base=cond)


def network_event(cond: list[dict[str, Any]], before: Mapping[str, Any] | None) -> tuple[Event, ...]:
    """A Warning a person sees in `kubectl describe` when NCCL chose less than the job planned (`before`: the
    NetworkVerified condition this pass found)."""
    verified = conditions.find(cond, "NetworkVerified")
    if verified and verified.get("status") == "False" and (before or {}).get("reason") != verified.get("reason"):
        return (Event("Warning", "NetworkDegraded", f"{verified['reason']}: {verified['message']}"),)
    return ()
