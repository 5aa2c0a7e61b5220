"""Step 7, supervision: a placed gang. Judge it (`handlers.gang`): Running, Succeeded, or a gang restart /
Failed. A restarting gang holds its old nodes, less the one blamed, for `restart_hold_seconds` (the record's
heldNodes and heldUntil), so the GPUs it frees are not handed to another job mid-restart. A network that is not
what the job planned fails it at once, and rank 0's progress is watched when the job sets a timeout.

A pure decision, `decide(seen, settings, now) -> Decision`, written by `k8s.apply`. What one pass wrote in
sequence stays in sequence (`Decision.before`: the running status and its Events, in-place restarts counted, a
broken gang's cause, then the restart or the end), so a kill between them leaves the earlier written, with its
Events. A gang restart writes the record before the status (a pass killed between them leaves a record the next
pass carries on from), a job's end its status and Event before the record (`Decision.record_last`: a kill
between them leaves a live record, and the next pass ends the job again). What it reads beyond the pass's first look is observed by
`handlers.observe` right before it decides, because only a placed gang needs it: the lost nodes of the gang,
its spares and its pods, with the watch's NotReady times, failed pulls and the weighed lost-peer evidence
(`observe.for_gang`, one look shared with the spare step, which judges the gang on the same evidence), and rank
0's progress ConfigMap (`observe.with_report`), read only when `reads_report` says this decision uses it, so
that a quiet running gang without a watchdog, in-place restarts or a grow-back costs no read. The gang
restarts a decision counts (its Restarting and RestartedInPlace Events) are the pass's metric
(`restarts_in`).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from paralleljob.api import ResolvedJob
from paralleljob.handlers import conditions, gang, rank0, start_failures, stragglers, watchdog
from paralleljob.handlers.observed import Observed, condition, is_terminating, pod_name, pods_holding_gpus, status_patch
from paralleljob.handlers.settings import Settings
from paralleljob.manifests import pods as pod_manifests
from paralleljob.manifests import progress as progress_channel
from paralleljob.manifests import records, timestamps
from paralleljob.manifests.decisions import Decision, Event, NodeLabel
from paralleljob_contract.network import NetworkFailure

GROW_BACK = "GrowBack"
# The Events that each count one gang restart (`restarts_in`, the pass's GANG_RESTARTS metric).
RESTART_EVENTS = frozenset({"Restarting", "RestartedInPlace"})


def decide(seen: Observed, settings: Settings, now: datetime.datetime) -> Decision:
    """The decision over the placed gang of `seen` (its `pinned` spec set): what its verdict writes."""
    state = judge(seen, settings, now)
    verdicts: dict[str, Callable[[Observed, gang.GangState, Settings, datetime.datetime], Decision]] = {
        "succeeded": _succeeded,
        "finishing": _finishing,
        "broken": broken,
        "running": _running,
        "starting": _starting,
    }
    return verdicts[state.verdict](seen, state, settings, now)


def judge(seen: Observed, settings: Settings, now: datetime.datetime) -> gang.GangState:
    """The gang's state (`gang.judge`) on its pods and lost nodes, with when a NotReady node falls due."""
    placed = _placed(seen)
    lost, due = lost_past_grace(seen, [*placed, *(gang.node_of(pod) for pod in seen.pods)], settings, now)
    limits = start_failures.Limits(
        settings.start_timeout_seconds, settings.container_creating_timeout_seconds, settings.image_pull_retries
    )
    state = gang.judge(
        seen.pods,
        len(placed),
        lost,
        limits=limits,
        at=now,
        planned_nodes=dict(enumerate(placed)),
        pull_failures=seen.pull_failures,
    )
    if due is not None and state.verdict in ("running", "starting"):
        state = dataclasses.replace(state, recheck_in=min(due, state.recheck_in if state.recheck_in else due))
    return state


def reads_report(seen: Observed, state: gang.GangState) -> bool:
    """Whether the decision on `state` uses rank 0's progress ConfigMap, so the pass reads it first: a finished
    gang (its last checkpoint), a running one it watches (`_watched`), and a broken one whose in-place restarts
    may still be counted before it restarts or fails (`rank0.with_reported_in_place_restarts`)."""
    live, resolved = seen.live, seen.pinned
    if state.verdict == "succeeded":
        return True
    if live is None or resolved is None:
        return False
    if state.verdict == "running":
        return _watched(live, resolved)
    if state.verdict == "broken":
        failed_network = state.network is not None and gang.slow_link_restart(state) is None
        return not failed_network and pod_manifests.in_place_budget(resolved, live.attempt) > 0
    return False


def restarts_in(decision: Decision) -> int:
    """The gang restarts a written decision made (the pass counts them in its metric)."""
    parts = (*decision.first, decision)
    return sum(1 for part in parts for event in part.events if event.reason in RESTART_EVENTS)


def lost_past_grace(
    seen: Observed, nodes: Sequence[str | None], settings: Settings, now: datetime.datetime
) -> tuple[dict[str, str], float | None]:
    """Of these nodes, the lost ones that break the gang now: deleted ones, ones tainted out-of-service (shut
    down, as Kubernetes' non-graceful node shutdown declares: the pod garbage collector deletes their pods at
    once), NotReady ones past the grace period (counted from the Ready condition's transition as the API
    server reports it), and ones their gang reports lost whose Lease is no longer renewed (`seen.peers_lost`,
    `handlers.lost_peers`: two signals, without the grace); with when the next one falls due."""
    lost, due = _lost_to_the_node_watch(seen, nodes, settings, now)
    peers = {node: why for node, why in seen.peers_lost.items() if node in nodes and node not in lost}
    due = min((t for t in (due, seen.peers_recheck_in) if t is not None), default=None)
    return {**lost, **peers}, due


def _lost_to_the_node_watch(
    seen: Observed, nodes: Sequence[str | None], settings: Settings, now: datetime.datetime
) -> tuple[dict[str, str], float | None]:
    """Deleted, shut down, and NotReady past the grace period: what the Node watch says."""
    lost = {node: why for node, why in seen.gang_nodes_lost.items() if node in nodes}
    shut_down = seen.out_of_service
    for node in lost.keys() & shut_down:
        lost[node] = "is NotReady and tainted out-of-service"
    ages = {
        node: timestamps.seconds_since(seen.not_ready_since.get(node), now) or 0.0
        for node in lost
        if node in seen.not_ready and node not in shut_down
    }
    return breaking_nodes(lost, ages, settings.not_ready_grace_seconds)


def breaking_nodes(
    lost: Mapping[str, str], not_ready_for: Mapping[str, float], grace: float
) -> tuple[dict[str, str], float | None]:
    """Of the lost nodes (with why), those that break the gang now, with why, and in how many seconds the next
    NotReady one does: a deleted node at once, a NotReady one (`not_ready_for`: seconds since it turned
    NotReady) once past `grace`."""
    broken: dict[str, str] = {}
    due: float | None = None
    for node, why in lost.items():
        if node not in not_ready_for:
            broken[node] = why
            continue
        age = not_ready_for[node]
        if age >= grace:
            broken[node] = f"has been NotReady for {age:.0f}s (grace {grace:.0f}s)"
        else:
            due = min(due if due is not None else grace, grace - age + 0.5)
    return broken, due


def restarts_so_far(seen: Observed) -> int:
    """The job's restarts against backoffLimit: every one before the live attempt, and its in-place ones."""
    return seen.live.restarts if seen.live is not None else seen.attempt


def _placed(seen: Observed) -> list[str]:
    """The node of each node rank of the live attempt, from its record."""
    return list(seen.live.nodes) if seen.live is not None else []


def _pinned(seen: Observed) -> ResolvedJob:
    assert seen.pinned is not None  # the pass sets the live attempt's spec before supervision decides
    return seen.pinned


def _succeeded(seen: Observed, state: gang.GangState, settings: Settings, now: datetime.datetime) -> Decision:
    resolved = _pinned(seen)
    message = f"training finished after {restarts_so_far(seen)} restarts"
    step, folder = rank0.report(seen, resolved).get("lastCheckpointStep"), pod_manifests.job_folder(resolved)
    if step is not None and folder is not None:
        # The trainer always saves the last step; the Event tells where the job's result lies.
        message += f"; last checkpoint step {step} in {folder}/global_step{step}"
    cond = condition(seen, "Ready", "False", "Finished", message, now)
    cond = condition(seen, "Succeeded", "True", "TrainingFinished", message, now, base=cond)
    return _end(seen, "Succeeded", message, cond, Event("Normal", "Completed", message), now)


def _finishing(seen: Observed, state: gang.GangState, settings: Settings, now: datetime.datetime) -> Decision:
    # Rank 0 finished and the others are exiting: the pods' own updates, or the grace running out, end the job.
    return Decision("finishing", requeue_after=state.recheck_in)


def _end(seen: Observed, phase: str, message: str, cond: Any, event: Event, now: datetime.datetime) -> Decision:
    """A terminal phase: one status write and its Event, then the record (`record_last`: a kill between the two
    leaves a live record, and the next pass judges the same pods and ends the job again), the pods still
    holding GPUs deleted, waiting jobs woken."""
    patch = {"phase": phase, "message": message, "conditions": cond, "podsReady": 0}
    # An invalid edit no longer gates anything once the job has ended: the Valid condition alone says so.
    ended = dataclasses.replace(seen, spec_problem="")
    status = status_patch(ended, {**patch, "completionTime": timestamps.format_time(now)})
    return Decision(
        phase.lower(),
        status=status,
        events=(event,) if status else (),
        record=seen.live.with_outcome(phase) if seen.live is not None else None,
        record_last=True,
        deletes=pods_holding_gpus(seen.pods, phase),
        wake_others=True,
    )


def broken(seen: Observed, state: gang.GangState, settings: Settings, now: datetime.datetime) -> Decision:
    """A broken gang restarts while backoffLimit allows, else the job Fails; a network that is not what the job
    planned fails it at once (but for a slow link the check names a node of: restarted without it)."""
    resolved = _pinned(seen)
    first = Decision(
        "broken", events=(Event("Warning", state.cause, state.reason),) if state.cause != gang.BROKEN else ()
    )
    base = None
    if state.network is not None:
        slow = gang.slow_link_restart(state)
        if slow is None:
            return first.before(_network_failed(seen, state, state.network, now))
        # The link check named a slow node: restart without it, NetworkVerified saying which link and why.
        base = condition(seen, "NetworkVerified", "False", state.network.reason, state.network.message, now)
        state = slow
    counted, seen = rank0.with_reported_in_place_restarts(seen, resolved)
    first = first.before(counted) if counted is not None else first
    limit = resolved.spec.failure_policy.backoff_limit
    restarts = seen.live.counted_restarts if seen.live is not None else seen.attempt
    if restarts_left(restarts, limit):
        return first.before(_restart(seen, state, limit, base, settings, now))
    return first.before(_fail(seen, state, limit, base, now))


def restarts_left(attempt: int, backoff_limit: int) -> bool:
    """Whether a broken gang on `attempt` (its restarts so far) may restart once more."""
    return attempt < backoff_limit


def _scheduled_reason(state: gang.GangState) -> str:
    return gang.CREATE_FAILED if state.cause == gang.CREATE_FAILED else "GangRestart"


def _fail(seen: Observed, state: gang.GangState, limit: int, base: Any, now: datetime.datetime) -> Decision:
    message = f"{state.reason}; backoffLimit {limit} reached after {restarts_so_far(seen)} restarts"
    reason = "GangFailed" if state.cause == gang.BROKEN else state.cause
    cond = condition(seen, "Ready", "False", reason, state.reason, now, base=base)
    if state.cause == gang.CREATE_FAILED:
        cond = condition(seen, "Scheduled", "False", gang.CREATE_FAILED, state.reason, now, base=cond)
    cond = condition(seen, "Failed", "True", "BackoffLimitExceeded", message, now, base=cond)
    return _end(seen, "Failed", message, cond, Event("Warning", "Failed", message), now)


def _network_failed(seen: Observed, state: gang.GangState, network: NetworkFailure, now: datetime.datetime) -> Decision:
    """The network is not what the job planned: Failed at once, with the reason in its condition. Not a gang
    restart: the same spec on the same nodes fails the same way, so the restarts are kept for real faults."""
    message = f"{state.reason}; not restarted: fix spec.network or the nodes, then create the job again"
    cond = condition(seen, network.condition, "False", network.reason, network.message, now)
    cond = condition(seen, "Ready", "False", gang.NETWORK, state.reason, now, base=cond)
    cond = condition(seen, "Failed", "True", gang.NETWORK, message, now, base=cond)
    return _end(seen, "Failed", message, cond, Event("Warning", "Failed", message), now)


def _restart(
    seen: Observed, state: gang.GangState, limit: int, base: Any, settings: Settings, now: datetime.datetime
) -> Decision:
    """The gang restarts: the record first (the restart, its excluded nodes and hold), then the status, the
    Restarting Event, every pod of the gang deleted gracefully, and the waiting jobs woken."""
    excluded = list(seen.record.excluded_nodes) if seen.record is not None else []
    suspect = list(seen.record.suspect_nodes) if seen.record is not None else []
    for node in (state.node, *state.blamed):
        if node and node not in excluded:
            excluded = [*excluded, node]
    # The nodes a verdict named (a slow link, a straggler, stalled pods' nodes), not only where a pod failed.
    suspect += [node for node in dict.fromkeys(state.blamed) if node and node not in suspect]
    restarts = restarts_so_far(seen) + 1
    message = f"gang restart {restarts}/{limit}: {state.reason}; resuming from the last checkpoint"
    held, until = _hold(seen, state, settings, now)
    live = seen.live
    record = (
        live.with_restart(state.reason, excluded, into=restarts, held=held, until=until, suspect=suspect)
        if live
        else None
    )
    cond = condition(seen, "Ready", "False", state.cause, state.reason, now, base=base)
    cond = condition(seen, "Scheduled", "False", _scheduled_reason(state), message, now, base=cond)
    # The next attempt verifies its own network (it may run on other nodes).
    patch = {"phase": "Restarting", "message": message, "conditions": cond, "restarts": restarts, "network": None}
    hold = {"heldNodes": held or None, "heldUntil": until if held else None}
    gone = {"placement": None, "spareNodes": None, "podsReady": 0, "excludedNodes": excluded or None}
    return Decision(
        "restarting",
        record=record,
        status=status_patch(seen, {**patch, **gone, **hold}),
        events=(Event("Warning", "Restarting", message),),
        deletes=tuple(pod_name(pod) for pod in seen.pods if not is_terminating(pod)),
        wake_others=True,
    )


def _hold(
    seen: Observed, state: gang.GangState, settings: Settings, now: datetime.datetime
) -> tuple[list[str], str | None]:
    """The restarting gang's hold: its placed nodes and spares less the one blamed, until restart_hold_seconds
    from now."""
    blamed = {state.node, *state.blamed}
    spare_nodes = seen.live.spare_nodes if seen.live is not None else ()
    kept = [node for node in (*_placed(seen), *spare_nodes) if node not in blamed]
    if not kept or settings.restart_hold_seconds <= 0:
        return [], None
    return kept, timestamps.format_time(now + datetime.timedelta(seconds=settings.restart_hold_seconds))


def _watched(live: records.AttemptRecord, resolved: ResolvedJob) -> bool:
    """Whether a running gang's pass reads rank 0's report: for its network verdict until it has come, and
    always under a progress timeout, in-place restarts or a grow-back due."""
    policy = resolved.spec.failure_policy
    return (
        live.network_report is None
        or policy.progress_timeout_seconds is not None
        or bool(policy.in_place_restarts)
        or live.grow_after is not None
    )


def _running(seen: Observed, state: gang.GangState, settings: Settings, now: datetime.datetime) -> Decision:
    """Every pod runs. The record says since when (the first pass to see it records the time, and rank 0's
    network verdict once it has come), so Started is posted once per attempt and startTime never moves."""
    live = seen.live
    assert live is not None  # a placed gang
    resolved = _pinned(seen)
    policy = resolved.spec.failure_policy
    found = seen.progress if _watched(live, resolved) else None
    reported = progress_channel.status_of(found, resolved.spec.training.steps) if found is not None else {}
    network = live.network_report or reported.get("network")
    started = live.started_at or timestamps.format_time(now)
    first_seen = live.started_at is None
    record = None
    if first_seen or network != live.network_report:
        live = record = live.with_started(started, network)
    message = f"all {state.ready} pods running"
    cond = rank0.network_conditions(
        seen, condition(seen, "Ready", "True", "AllPodsRunning", message, now), network, now
    )
    cond = rank0.step_promise_conditions(
        seen, cond, reported.get("progress") or {}, policy.slower_than_modeled_factor, now
    )
    slow = stragglers.verdict((seen.status.get("progress") or {}).get("stragglers"), _threshold(resolved))
    if slow is not None:
        cond = condition(seen, stragglers.CONDITION, slow.status, slow.reason, slow.message, now, base=cond)
    patch = {"phase": "Running", "message": message, "conditions": cond, "podsReady": state.ready}
    before = conditions.find(seen.status.get("conditions"), "NetworkVerified")
    slow_before = conditions.find(seen.status.get("conditions"), stragglers.CONDITION)
    status = status_patch(seen, {**patch, "startTime": started})
    events = [*rank0.network_event(cond, before)] if status else []
    if stragglers.event_due(slow_before, slow):
        events.append(Event("Warning", stragglers.NAMED, slow.message if slow else ""))
    if first_seen:
        events.append(Event("Normal", "Started", f"{resolved.layout} on {state.ready} pods, attempt {seen.attempt}"))
    written = Decision(
        "running", record=record, status=status, events=tuple(events), node_labels=_slow_node_labels(seen, settings)
    )
    seen = seen.with_status(status)
    if not first_seen and found is not None:
        counted = rank0.count_in_place_restarts(seen, resolved, found, live)
        if counted is not None:
            written = written.before(counted)
            seen = seen.with_status(counted.status)
        seen = dataclasses.replace(seen, record=counted.record if counted is not None else live)
    if (slow_gang := _slow_without_spare(seen, resolved, live)) is not None:
        return written.before(broken(seen, dataclasses.replace(slow_gang, ready=state.ready), settings, now))
    verdict = _progress_verdict(seen, resolved, started, reported.get("progress"), now)
    if verdict.hung:
        hung = gang.GangState("broken", state.ready, verdict.message, cause=watchdog.NO_PROGRESS)
        return written.before(broken(seen, hung, settings, now))
    saved = reported.get("lastCheckpointStep")
    if live.grow_after is not None and isinstance(saved, int) and saved > live.grow_after:
        # The DP shrink: full size fits again and a newer checkpoint is saved: restart into the full size.
        why = f"growing back to full size after checkpoint step {saved}"
        grow = gang.GangState("broken", state.ready, why, cause=GROW_BACK)
        return written.before(broken(dataclasses.replace(seen, record=live.with_grow_restart()), grow, settings, now))
    return written.then(Decision("running", requeue_after=_resync(settings, verdict.recheck_in, state.recheck_in)))


def _slow_node_labels(seen: Observed, settings: Settings) -> tuple[NodeLabel, ...]:
    """The nodes named slow, labelled for the cluster's administrators where the operator is told to
    (--slow-node-label); each once, as the Node watch shows."""
    named = (seen.status.get("progress") or {}).get("stragglers")
    node_labels = {
        node: (found.get("metadata") or {}).get("labels") or {} for node, found in seen.watched_nodes.items()
    }
    key = settings.slow_node_label
    return tuple(NodeLabel(node, key, "true") for node in stragglers.to_label(named, node_labels, key))


def _slow_without_spare(seen: Observed, resolved: ResolvedJob, live: records.AttemptRecord) -> gang.GangState | None:
    """stragglers.action Replace with no spare left: the gang restarts re-planned without its named nodes."""
    named = (seen.status.get("progress") or {}).get("stragglers")
    excluded = list(seen.record.excluded_nodes) if seen.record is not None else []
    slow = stragglers.to_replace(named, live.nodes, excluded, resolved.spec.failure_policy.stragglers.action)
    if not slow or live.spare_nodes:
        return None
    why = "; ".join(f"node {node} {reason}" for node, reason in slow.items())
    return gang.GangState("broken", 0, why, node=next(iter(slow)), cause=stragglers.NAMED, blamed=tuple(slow))


def _threshold(resolved: ResolvedJob) -> float:
    return resolved.spec.failure_policy.stragglers.threshold


def _progress_verdict(
    seen: Observed,
    resolved: ResolvedJob,
    running_since: str,
    reported: Mapping[str, Any] | None,
    now: datetime.datetime,
) -> watchdog.Verdict:
    """The watchdog's verdict on rank 0's reported progress (only when the job sets a timeout), for the gang
    running since `running_since` (this attempt's, from its record)."""
    timeout = resolved.spec.failure_policy.progress_timeout_seconds
    if timeout is None:
        return watchdog.Verdict(False)
    live = seen.live
    # The pods' supervisors restart a hung gang in place while the attempt has in-place restarts left.
    in_place_first = live is not None and live.in_place_restarts < pod_manifests.in_place_budget(resolved, live.attempt)
    return watchdog.judge_progress(reported, running_since, timeout, now, in_place_first)


def _resync(settings: Settings, *due: float | None) -> float:
    """When to look at a gang again without an event: when something falls due, at most every resync period."""
    return min([settings.resync_seconds, *(after for after in due if after is not None)])


def _starting(seen: Observed, state: gang.GangState, settings: Settings, now: datetime.datetime) -> Decision:
    # What a stalled pod waits on (an unschedulable reason, a failed pull), for `kubectl get pj`.
    status = status_patch(seen, {"podsReady": state.ready, **({"message": state.reason} if state.reason else {})})
    return Decision("starting", status=status, requeue_after=_resync(settings, state.recheck_in))
