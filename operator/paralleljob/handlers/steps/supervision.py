"""Step 7, supervision: a placed gang. Judge it (`handlers.gang`): Running, Succeeded, or a gang restart /
Failed. A restarting gang holds its old nodes, less the one blamed, for `restart_hold_seconds` (the record's
heldNodes and heldUntil), so the GPUs it frees are not handed to another job mid-restart. A network that is not
what the job planned fails it at once, and rank 0's progress is watched when the job sets a timeout.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from paralleljob.api import ResolvedJob
from paralleljob.handlers import conditions, gang, lost_peers, start_failures, step_promise, stragglers, watchdog
from paralleljob.handlers import metrics as m
from paralleljob.handlers.passes import (
    Outcome,
    Pass,
    delete_pods,
    end,
    lost_nodes,
    write_record,
    write_status,
)
from paralleljob.k8s import reads, timestamps, writes
from paralleljob.manifests import labels, records
from paralleljob.manifests import pods as pod_manifests
from paralleljob.manifests import progress as progress_channel
from paralleljob_contract.network import NetworkFailure

VERIFIED_STATUSES = ("True", "False", "Unknown")
GROW_BACK = "GrowBack"


def watch(p: Pass, resolved: ResolvedJob, pods: Sequence[Mapping[str, Any]]) -> Outcome:
    placed = p.placed_nodes
    nodes = [*placed, *(gang.node_of(pod) for pod in pods)]
    planned = dict(enumerate(placed))
    lost, due = lost_past_grace(p, nodes)
    limits = start_failures.Limits(
        p.settings.start_timeout_seconds, p.settings.container_creating_timeout_seconds, p.settings.image_pull_retries
    )
    at, pulls = p.session.server_now(), p.nodes.pull_failures
    state = gang.judge(pods, len(placed), lost, limits=limits, at=at, planned_nodes=planned, pull_failures=pulls)
    if due is not None and state.verdict in ("running", "starting"):
        state = dataclasses.replace(state, recheck_in=min(due, state.recheck_in if state.recheck_in else due))
    handlers: dict[str, Callable[[Pass, ResolvedJob, Sequence[Mapping[str, Any]], gang.GangState], Outcome]] = {
        "succeeded": _succeeded,
        "finishing": _finishing,
        "broken": broken,
        "running": _running,
        "starting": _starting,
    }
    return handlers[state.verdict](p, resolved, pods, state)


def lost_past_grace(p: Pass, nodes: Sequence[str | None]) -> tuple[dict[str, str], float | None]:
    """Of these nodes, the lost ones that break the gang now: deleted ones, ones tainted out-of-service (shut
    down, as Kubernetes' non-graceful node shutdown declares: the pod garbage collector deletes their pods at
    once), NotReady ones past the grace period (counted from the Ready condition's transition as the API
    server reports it), and ones their gang reports lost whose Lease is no longer renewed (`lost_peers`: two
    signals, without the grace); with when the next one falls due."""
    lost, due = _lost_to_the_node_watch(p, nodes)
    gang_says = lost_peers.observe(p, [node for node in nodes if node and node not in lost])
    due = min((t for t in (due, gang_says.recheck_in) if t is not None), default=None)
    return {**lost, **gang_says.lost}, due


def _lost_to_the_node_watch(p: Pass, nodes: Sequence[str | None]) -> tuple[dict[str, str], float | None]:
    """Deleted, shut down, and NotReady past the grace period: what the Node watch says."""
    lost = lost_nodes(p, nodes)
    shut_down = p.nodes.snapshot.out_of_service
    for node in lost.keys() & shut_down:
        lost[node] = "is NotReady and tainted out-of-service"
    now, since = p.session.server_now(), p.nodes.snapshot.not_ready_since
    ages = {
        node: timestamps.seconds_since(since.get(node), now) or 0.0
        for node in lost
        if node in p.nodes.not_ready and node not in shut_down
    }
    return breaking_nodes(lost, ages, p.settings.not_ready_grace_seconds)


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


def restarts_so_far(p: Pass) -> int:
    """The job's restarts against backoffLimit: every one before the live attempt, and its in-place ones."""
    return p.live.restarts if p.live is not None else p.attempt


def _succeeded(p: Pass, resolved: ResolvedJob, pods: Sequence[Mapping[str, Any]], state: gang.GangState) -> Outcome:
    message = f"training finished after {restarts_so_far(p)} restarts"
    step, folder = _rank0_report(p, resolved).get("lastCheckpointStep"), pod_manifests.job_folder(resolved)
    if step is not None and folder is not None:
        # The trainer always saves the last step; the Event tells where the job's result lies.
        message += f"; last checkpoint step {step} in {folder}/global_step{step}"
    cond = p.condition("Ready", "False", "Finished", message)
    cond = p.condition("Succeeded", "True", "TrainingFinished", message, base=cond)
    return end(p, pods, "Succeeded", message, cond, ("Normal", "Completed"))


def _finishing(p: Pass, resolved: ResolvedJob, pods: Sequence[Mapping[str, Any]], state: gang.GangState) -> Outcome:
    # Rank 0 finished and the others are exiting: the pods' own updates, or the grace running out, end the job.
    return Outcome("finishing", requeue_after=state.recheck_in)


def broken(p: Pass, resolved: ResolvedJob, pods: Sequence[Mapping[str, Any]], state: gang.GangState) -> Outcome:
    if state.cause != gang.BROKEN:
        p.event("Warning", state.cause, state.reason)
    base = None
    if state.network is not None:
        slow = gang.slow_link_restart(state)
        if slow is None:
            return _network_failed(p, pods, state, state.network)
        # The link check named a slow node: restart without it, NetworkVerified saying which link and why.
        base = p.condition("NetworkVerified", "False", state.network.reason, state.network.message)
        state = slow
    p = _with_reported_in_place_restarts(p, resolved)
    limit = resolved.spec.failure_policy.backoff_limit
    counted = p.live.counted_restarts if p.live is not None else p.attempt
    if restarts_left(counted, limit):
        return _restart(p, pods, state, limit, base)
    return _fail(p, pods, state, limit, base)


def restarts_left(attempt: int, backoff_limit: int) -> bool:
    """Whether a broken gang on `attempt` (its restarts so far) may restart once more."""
    return attempt < backoff_limit


def _scheduled_reason(state: gang.GangState) -> str:
    return gang.CREATE_FAILED if state.cause == gang.CREATE_FAILED else "GangRestart"


def _fail(p: Pass, pods: Sequence[Mapping[str, Any]], state: gang.GangState, limit: int, base: Any = None) -> Outcome:
    message = f"{state.reason}; backoffLimit {limit} reached after {restarts_so_far(p)} restarts"
    reason = "GangFailed" if state.cause == gang.BROKEN else state.cause
    cond = p.condition("Ready", "False", reason, state.reason, base=base)
    if state.cause == gang.CREATE_FAILED:
        cond = p.condition("Scheduled", "False", gang.CREATE_FAILED, state.reason, base=cond)
    cond = p.condition("Failed", "True", "BackoffLimitExceeded", message, base=cond)
    return end(p, pods, "Failed", message, cond, ("Warning", "Failed"))


def _network_failed(
    p: Pass, pods: Sequence[Mapping[str, Any]], state: gang.GangState, network: NetworkFailure
) -> Outcome:
    """The network is not what the job planned: Failed at once, with the reason in its condition. Not a gang
    restart: the same spec on the same nodes fails the same way, so the restarts are kept for real faults."""
    message = f"{state.reason}; not restarted: fix spec.network or the nodes, then create the job again"
    cond = p.condition(network.condition, "False", network.reason, network.message)
    cond = p.condition("Ready", "False", gang.NETWORK, state.reason, base=cond)
    cond = p.condition("Failed", "True", gang.NETWORK, message, base=cond)
    return end(p, pods, "Failed", message, cond, ("Warning", "Failed"))


def _restart(
    p: Pass, pods: Sequence[Mapping[str, Any]], state: gang.GangState, limit: int, base: Any = None
) -> Outcome:
    excluded = p.excluded
    for node in (state.node, *state.blamed):
        if node and node not in excluded:
            excluded = [*excluded, node]
    restarts = restarts_so_far(p) + 1
    message = f"gang restart {restarts}/{limit}: {state.reason}; resuming from the last checkpoint"
    held, until = _hold(p, state)
    if p.live is not None:
        write_record(p, p.live.with_restart(state.reason, excluded, into=restarts, held=held, until=until))
    cond = p.condition("Ready", "False", state.cause, state.reason, base=base)
    cond = p.condition("Scheduled", "False", _scheduled_reason(state), message, base=cond)
    # The next attempt verifies its own network (it may run on other nodes).
    patch = {"phase": "Restarting", "message": message, "conditions": cond, "restarts": restarts, "network": None}
    hold = {"heldNodes": held or None, "heldUntil": until if held else None}
    write_status(
        p, {**patch, "placement": None, "spareNodes": None, "podsReady": 0, "excludedNodes": excluded or None, **hold}
    )
    m.GANG_RESTARTS.inc()
    p.event("Warning", "Restarting", message)
    delete_pods(p, pods)
    return Outcome("restarting", wake_others=True)


def _hold(p: Pass, state: gang.GangState) -> tuple[list[str], str | None]:
    """The restarting gang's hold: its placed nodes and spares less the one blamed, until restart_hold_seconds
    from now."""
    blamed = {state.node, *state.blamed}
    spare_nodes = p.live.spare_nodes if p.live is not None else ()
    kept = [node for node in (*p.placed_nodes, *spare_nodes) if node not in blamed]
    if not kept or p.settings.restart_hold_seconds <= 0:
        return [], None
    until = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=p.settings.restart_hold_seconds)
    return kept, timestamps.format_time(until)


def _running(p: Pass, resolved: ResolvedJob, pods: Sequence[Mapping[str, Any]], state: gang.GangState) -> Outcome:
    """Every pod runs. The record says since when (the first pass to see it records the time, and rank 0's
    network verdict once it has come), so Started is posted once per attempt and startTime never moves."""
    live = p.live
    assert live is not None  # a placed gang
    policy = resolved.spec.failure_policy
    watched = (
        live.network_report is None
        or policy.progress_timeout_seconds is not None
        or bool(policy.in_place_restarts)
        or live.grow_after is not None
    )
    found = _rank0_config_map(p) if watched else None
    reported = progress_channel.status_of(found, resolved.spec.training.steps) if found is not None else {}
    network = live.network_report or reported.get("network")
    started = live.started_at or timestamps.now()
    first_seen = live.started_at is None
    if first_seen or network != live.network_report:
        live = live.with_started(started, network)
        write_record(p, live)
    message = f"all {state.ready} pods running"
    cond = _network_conditions(p, p.condition("Ready", "True", "AllPodsRunning", message), network)
    cond = _step_promise(p, cond, reported.get("progress") or {}, policy.slower_than_modeled_factor)
    slow = stragglers.verdict((p.status.get("progress") or {}).get("stragglers"), _threshold(resolved))
    if slow is not None:
        cond = p.condition(stragglers.CONDITION, slow.status, slow.reason, slow.message, base=cond)
    patch = {"phase": "Running", "message": message, "conditions": cond, "podsReady": state.ready}
    before = conditions.find(p.status.get("conditions"), "NetworkVerified")
    slow_before = conditions.find(p.status.get("conditions"), stragglers.CONDITION)
    if write_status(p, {**patch, "startTime": started}):
        _network_event(p, cond, before)
    if stragglers.event_due(slow_before, slow):
        p.event("Warning", stragglers.NAMED, slow.message if slow else "")
    _label_slow_nodes(p)
    if first_seen:
        p.event("Normal", "Started", f"{resolved.layout} on {state.ready} pods, attempt {p.attempt}")
    elif found is not None:
        p = dataclasses.replace(p, record=_count_in_place_restarts(p, resolved, found, live))
    if (slow_gang := _slow_without_spare(p, resolved, live)) is not None:
        return broken(p, resolved, pods, dataclasses.replace(slow_gang, ready=state.ready))
    verdict = _progress_verdict(p, resolved, started, reported.get("progress"))
    if verdict.hung:
        hung = gang.GangState("broken", state.ready, verdict.message, cause=watchdog.NO_PROGRESS)
        return broken(p, resolved, pods, hung)
    saved = reported.get("lastCheckpointStep")
    if live.grow_after is not None and isinstance(saved, int) and saved > live.grow_after:
        # The DP shrink: full size fits again and a newer checkpoint is saved: restart into the full size.
        why = f"growing back to full size after checkpoint step {saved}"
        grow = gang.GangState("broken", state.ready, why, cause=GROW_BACK)
        return broken(dataclasses.replace(p, record=live.with_grow_restart()), resolved, pods, grow)
    return Outcome("running", requeue_after=_resync(p, verdict.recheck_in, state.recheck_in))


def _label_slow_nodes(p: Pass) -> None:
    """The nodes named slow, labelled for the cluster's administrators where the operator is told to
    (--slow-node-label); each once, as the Node watch shows."""
    named = (p.status.get("progress") or {}).get("stragglers")
    node_labels = {
        node: (found.get("metadata") or {}).get("labels") or {} for node, found in p.nodes.snapshot.dicts.items()
    }
    for node in stragglers.to_label(named, node_labels, p.settings.slow_node_label):
        writes.label_node(p.session, node, p.settings.slow_node_label, "true")


def _slow_without_spare(p: Pass, resolved: ResolvedJob, live: records.AttemptRecord) -> gang.GangState | None:
    """stragglers.action Replace with no spare left: the gang restarts re-planned without its named nodes."""
    named = (p.status.get("progress") or {}).get("stragglers")
    slow = stragglers.to_replace(named, live.nodes, p.excluded, resolved.spec.failure_policy.stragglers.action)
    if not slow or live.spare_nodes:
        return None
    why = "; ".join(f"node {node} {reason}" for node, reason in slow.items())
    return gang.GangState("broken", 0, why, node=next(iter(slow)), cause=stragglers.NAMED, blamed=tuple(slow))


def _threshold(resolved: ResolvedJob) -> float:
    return resolved.spec.failure_policy.stragglers.threshold


def _rank0_report(p: Pass, resolved: ResolvedJob) -> dict[str, Any]:
    """What rank 0 reported in its progress ConfigMap, validated (`manifests.progress.status_of`): progress,
    lastCheckpointStep and the network verdict; empty without a ConfigMap of this job's."""
    found = _rank0_config_map(p)
    return progress_channel.status_of(found, resolved.spec.training.steps) if found is not None else {}


def _rank0_config_map(p: Pass) -> Mapping[str, Any] | None:
    """The job's progress ConfigMap, when the job owns it."""
    found = reads.get_config_map(p.session, p.namespace, labels.progress_config_map_name(p.name))
    return found if found is not None and labels.owned_by(found, p.uid) else None


def _with_reported_in_place_restarts(p: Pass, resolved: ResolvedJob) -> Pass:
    """The pass with rank 0's in-place restarts counted, before a broken gang is restarted or failed: a report
    that came after the last pass over the running gang would otherwise be lost with its pods."""
    live = p.live
    if live is None or not pod_manifests.in_place_budget(resolved, live.attempt):
        return p
    found = _rank0_config_map(p)
    return p if found is None else dataclasses.replace(p, record=_count_in_place_restarts(p, resolved, found, live))


def _count_in_place_restarts(
    p: Pass, resolved: ResolvedJob, found: Mapping[str, Any], live: records.AttemptRecord
) -> records.AttemptRecord:
    """The in-place restarts rank 0 reports for the live attempt, validated and within the attempt's budget,
    into its record and the job's status, with one Event per restart counted; the record as it is now."""
    budget = pod_manifests.in_place_budget(resolved, live.attempt)
    count = progress_channel.in_place_restarts_of(found, live.started_at, budget)
    if count is None or count <= live.in_place_restarts:
        return live
    counted = live.with_in_place_restarts(count)
    write_record(p, counted)
    limit = resolved.spec.failure_policy.backoff_limit
    before = int(p.status.get("inPlaceRestarts") or 0) - live.in_place_restarts
    write_status(p, {"restarts": live.attempt + count, "inPlaceRestarts": max(0, before) + count})
    for number in range(live.in_place_restarts + 1, count + 1):
        message = (
            f"in-place restart {live.attempt + number}/{limit}: a rank failed and every pod restarted its ranks "
            f"from the last checkpoint; no pod was recreated ({number}/{budget} in place for these pods)"
        )
        p.event("Warning", "RestartedInPlace", message)
        m.GANG_RESTARTS.inc()
    return counted


def _progress_verdict(
    p: Pass, resolved: ResolvedJob, running_since: str, reported: Mapping[str, Any] | None
) -> watchdog.Verdict:
    """The watchdog's verdict on rank 0's reported progress (only when the job sets a timeout), for the gang
    running since `running_since` (this attempt's, from its record)."""
    timeout = resolved.spec.failure_policy.progress_timeout_seconds
    if timeout is None:
        return watchdog.Verdict(False)
    live = p.live
    # The pods' supervisors restart a hung gang in place while the attempt has in-place restarts left.
    in_place_first = live is not None and live.in_place_restarts < pod_manifests.in_place_budget(resolved, live.attempt)
    return watchdog.judge_progress(reported, running_since, timeout, p.session.server_now(), in_place_first)


def _resync(p: Pass, *due: float | None) -> float:
    """When to look at a gang again without an event: when something falls due, at most every resync period."""
    return min([p.settings.resync_seconds, *(after for after in due if after is not None)])


def _network_conditions(p: Pass, cond: list[dict[str, Any]], report: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """NetworkReady and NetworkVerified from rank 0's network verdict, once it has arrived: it is sent after a
    warm-up collective over every rank, so every rank passed the preflight."""
    if not report:
        return cond
    ready = "every rank passed the network preflight and joined the process groups"
    cond = p.condition("NetworkReady", "True", "PreflightPassed", ready, base=cond)
    verified = str(report.get("verified")) if report.get("verified") in VERIFIED_STATUSES else "Unknown"
    reason, message = str(report.get("reason") or "NotReported"), str(report.get("message") or "")
    return p.condition("NetworkVerified", verified, reason, message, base=cond)


def _step_promise(
    p: Pass, cond: list[dict[str, Any]], progress: Mapping[str, Any], factor: float
) -> list[dict[str, Any]]:
    """SlowerThanModeled from rank 0's measured and modeled step times (`step_promise`, a pure decision)."""
    measured, modeled = progress.get("stepSeconds"), progress.get("modeledStepSeconds")
    current = conditions.find(cond, step_promise.TYPE)
    verdict = step_promise.decide(measured, modeled, factor, current, p.session.server_now())
    return cond if verdict is None else p.condition(step_promise.TYPE, *dataclasses.astuple(verdict), base=cond)


def _network_event(p: Pass, cond: list[dict[str, Any]], before: Mapping[str, Any] | None) -> None:
    """A Warning a person sees in `kubectl describe` when NCCL chose less than the job planned (`before`: the
    NetworkVerified condition this pass found)."""
    verified = conditions.find(cond, "NetworkVerified")
    if verified and verified.get("status") == "False" and (before or {}).get("reason") != verified.get("reason"):
        p.event("Warning", "NetworkDegraded", f"{verified['reason']}: {verified['message']}")


def _starting(p: Pass, resolved: ResolvedJob, pods: Sequence[Mapping[str, Any]], state: gang.GangState) -> Outcome:
    # What a stalled pod waits on (an unschedulable reason, a failed pull), for `kubectl get pj`.
    write_status(p, {"podsReady": state.ready, **({"message": state.reason} if state.reason else {})})
    return Outcome("starting", requeue_after=_resync(p, state.recheck_in))
