"""One reconcile pass over one ParallelJob: read the cluster, decide, act, write status once.

Level-triggered and idempotent, so the operator can die at any moment and converge after a restart.
The pass reads the job's attempt record (`manifests.records`, in its `-config` ConfigMap), the job and its pods
from the API (only pods whose ownerReference carries this job's uid count: a deleted job of the same name may
leave children the garbage collector has not removed yet), and decides from the record, the spec and the
cluster, never from the job's status, which it only writes; then it takes the first step that applies:

1. finished (Succeeded/Failed, as the attempt record says): delete the pods still running. Finished is final:
   an edit afterwards changes only the Valid condition, whatever the spec says now;
2. invalid spec (the API's rules, no `spec.template.env` name the operator sets, and the administrator's
   admission policy, `api.policy`): Valid=False, an Event, no children;
3. pods of an older attempt exist: delete them gracefully, force-deleting only those stuck Terminating on a
   lost node, and wait until every one is gone (two generations never run at once);
4. a deleted job's children still hold our names: wait for the garbage collector; a name held by anyone else
   (a foreign object, or a foreign pod with a rank's name) is a NameConflict: Scheduled=False naming the
   kind and name, the reservation released, a Warning Event, and no new attempt until that object is gone;
5. no placement: a supervision pass hands the job to the admission queue (`handlers.admission_queue`) and
   stops; the admission pass (`admit=True`, only ever run by the queue's one worker) plans with gang
   admission from the watches' node records and usage index (no cluster-wide pod or node LIST), choosing the
   layout first for a job that gives a GPU budget (once: the record keeps the choice), around the
   reservations in every job's record; unschedulable -> Pending + Scheduled=False; else write the ConfigMap
   (the plan and network of this attempt, and its record, whose placement reserves the GPUs) -> Admitted;
6. admitted: create the Service, the progress RBAC and every missing pod from the ConfigMap -> Placed;
7. placed: judge the gang (`handlers.gang`): Running, Succeeded, or a gang restart / Failed. A restarting
   gang holds its old nodes, less the one blamed, for `restart_hold_seconds` (the record's heldNodes and
   heldUntil), so the GPUs it frees are not handed to another job mid-restart. With hot spares
   (`steps.replacement`), a lost node rank moves to a spare first, and only its pod is made again there.

A create the API refuses for good (4xx) fails the attempt like a broken gang (reason CreateFailed). A job
deleted during the pass ends it where a write finds the object gone (404, `writes.Gone`): the garbage
collector removes the rest, so that is an ordinary end, logged at debug level, not a failure to retry. Each
step ends with at most one status patch, skipped when nothing changed, so a quiet cluster sees no writes.
The `Outcome` tells the scheduler whether GPUs may have been freed (wake the waiting jobs) and when to look
at this job again without a watch event (a start timeout or a stuck deletion falling due).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from paralleljob.api import ResolvedJob
from paralleljob.handlers import conditions, failures, gang, placement, queueing, specs
from paralleljob.handlers import metrics as m
from paralleljob.handlers.passes import (
    NAME_CONFLICT_RECHECK_SECONDS,
    PREVIOUS_JOB_RECHECK_SECONDS,
    AdmissionRequest,
    NodeView,
    Outcome,
    Pass,
    Settings,
    attempt_of,
)
from paralleljob.handlers.steps import (
    admission,
    conflicts,
    creation,
    draining,
    finished,
    invalid,
    replacement,
    supervision,
)
from paralleljob.k8s import reads, writes
from paralleljob.k8s.session import Session
from paralleljob.manifests import labels, records

__all__ = ["AdmissionRequest", "NodeView", "Outcome", "Pass", "Settings", "reconcile"]

log = logging.getLogger(__name__)

# Steps after which only an edit or a deletion changes anything: no resync.
RESTING_STEPS = frozenset({"gone", "finished", "succeeded", "failed", "invalid"})
# The steps that end a job (`passes.end`).
ENDED = frozenset({"succeeded", "failed"})


def reconcile(
    session: Session,
    settings: Settings,
    namespace: str,
    name: str,
    nodes: NodeView,
    *,
    admit: bool = False,
    fence: Callable[[], None] | None = None,
) -> Outcome:
    """One pass; returns what it did and what it asks of the scheduler. Only the admission worker passes
    `admit=True` (and the admission lock's `fence`): other passes stop at a job without a placement and ask
    for its admission."""
    # The record first: only passes write it (one at a time per job), and the job read right before its pods
    # keeps their two views as close in time as they were.
    found = reads.get_config_map(session, namespace, labels.config_map_name(name))
    job = reads.get_job(session, namespace, name)
    if job is None or job["metadata"].get("deletionTimestamp"):
        m.observe_phase(namespace, name, None)
        return Outcome("gone")
    job.setdefault("metadata", {}).setdefault("namespace", namespace)
    claim = labels.claim_of(found, name, str(job["metadata"].get("uid"))) if found is not None else None
    record = records.record_of(found) if claim == "own" else None
    foreign = found if claim == "foreign" else None
    try:
        outcome = _step(Pass(session, settings, job, nodes, admit, record, foreign_config=foreign, fence=fence))
    except writes.Gone as gone:
        if not _deleted(session, namespace, name):
            raise  # only its ConfigMap was deleted: an ordinary failure, retried
        log.debug("%s/%s was deleted during the pass (%s is gone); nothing is left to do", namespace, name, gone)
        m.observe_phase(namespace, name, None)
        return Outcome("gone")
    m.RECONCILES.labels(outcome=outcome.step).inc()
    if outcome.requeue_after is None and outcome.admission is None and outcome.step not in RESTING_STEPS:
        # The resync: a watch event missed while a watch restarted cannot strand an unfinished job.
        outcome = dataclasses.replace(outcome, requeue_after=settings.resync_seconds)
    if outcome.admission is None:  # a job handed to the admission queue is judged by its admission pass
        _reconciled_again(session, job)
    return outcome


def _deleted(session: Session, namespace: str, name: str) -> bool:
    """Whether the job is gone or being deleted (its children go with it)."""
    job = reads.get_job(session, namespace, name)
    return job is None or bool(job["metadata"].get("deletionTimestamp"))


def _reconciled_again(session: Session, before: Mapping[str, Any]) -> None:
    """A pass succeeded: Reconciled=True again, when an earlier failing pass left it False (one read and one
    write, only then)."""
    found = conditions.find((before.get("status") or {}).get("conditions"), failures.CONDITION)
    if not found or found.get("status") != "False":
        return
    namespace, name = before["metadata"]["namespace"], before["metadata"]["name"]
    fresh = reads.get_job(session, namespace, name)
    cond = failures.recovered(fresh) if fresh is not None else None
    if cond is not None:
        writes.patch_job_status(session, namespace, name, {"conditions": cond})


def _step(p: Pass) -> Outcome:
    outcome = _first_step_that_applies(p)
    if outcome.step in ENDED:  # Kueue hook: Finished on the Workload returns its quota at once
        queueing.finish(p, outcome.step.capitalize())
    return outcome


def _first_step_that_applies(p: Pass) -> Outcome:
    if p.finished:
        queueing.finish(p, p.record.outcome if p.record is not None else "")  # Kueue hook, level-triggered
        return finished.rest(p)
    current, problems = specs.current_spec(p)
    live = p.live
    if current is None and live is None:
        # Between attempts the old generation may still be going.
        if p.record is not None and (stale := [pod for pod in _own_pods(p) if attempt_of(pod) != p.attempt]):
            draining.drain(p, stale)
        return invalid.invalid_spec(p, problems)
    m.observe_phase(p.namespace, p.name, p.status.get("phase"))
    labelled = reads.list_job_pods(p.session, p.namespace, p.name)
    pods = [pod for pod in labelled if labels.owned_by(pod, p.uid)]
    stale = [pod for pod in pods if attempt_of(pod) != p.attempt]
    if stale:
        return draining.drain(p, stale)
    previous = [pod for pod in labelled if labels.claim_of(pod, p.name, p.uid) == "namesake"]
    if previous:
        return conflicts.wait_for_previous_job(p, previous, draining.drain(p, previous))
    if current is None:
        # An edit made the spec invalid: it gates only the next attempt; the running one is still supervised.
        p = dataclasses.replace(p, spec_problem=problems)
        invalid.invalid_while_running(p)
    try:
        if not p.placed_nodes:
            assert current is not None  # no live attempt: an invalid spec returned above
            if p.foreign_config is not None:  # nothing can be admitted while someone else holds the ConfigMap
                name = labels.config_map_name(p.name)
                raise writes.NameConflict("ConfigMap", name, labels.holder_of(p.foreign_config))
            if conflicts.waits_on_conflict(p, pods):
                return Outcome("name-conflict", requeue_after=NAME_CONFLICT_RECHECK_SECONDS)
            # Kueue hook (handlers.queueing.gate): a job queued through Kueue waits, Queued, until its Workload is
            # admitted, then is planned inside the admitted flavours; any other job passes unchanged.
            gated = queueing.gate(p, current)
            if isinstance(gated, Outcome):
                return gated
            current = gated
            if not p.admit:
                return admission.awaiting_admission(p)
            view = admission.cluster_view(p, labelled)
            choice = p.record.layout_choice if p.record is not None else None
            if current.needs_layout:
                chosen = admission.choose_layout(p, current, view)
                if isinstance(chosen, Outcome):
                    return queueing.placed_or_released(p, chosen)  # Kueue hook: unplaceable gives the quota back
                current, choice = chosen
            return queueing.placed_or_released(p, admission.admit(p, current, view, choice))  # Kueue hook, as above
        pinned = specs.pinned_spec(p, current)
        if p.admit:
            if replacement.shrunk(p, pinned, current):  # the DP shrink: does the full size fit again?
                assert current is not None
                view = admission.cluster_view(p, labelled)
                usage = p.nodes.usage.without([(p.namespace, pod["metadata"]["name"]) for pod in pods])
                found = placement.plan(current, view.nodes, usage.usage, view.held, p.excluded, view.builder)
                return replacement.grow_when_fits(p, pinned, current, found.plan is not None, view.held)
            if replacement.spares_short(p, pinned):  # hot spares used or lost: hold more where the cluster allows
                view = admission.cluster_view(p, labelled)
                cluster = view.builder.build(view.nodes.infos, view.usage, view.held)
                return replacement.top_up(p, pinned, cluster, view.held)
            # Placed meanwhile: the rest is supervision's, so the admission worker moves on at once.
            return Outcome("placed", requeue_after=0.0)
        # Kueue hook (handlers.queueing.supervise): Kueue evicted the Workload: checkpoint, stop, back to Queued.
        if (evicting := queueing.supervise(p, pinned, pods)) is not None:
            return evicting
        if creation.creating(p):
            return creation.create(p, pinned, pods)
    except writes.NameConflict as conflict:
        return conflicts.name_conflict(p, conflict)
    except writes.HeldByAnother as held:
        log.info("%s/%s waits for the garbage collector: %s", p.namespace, p.name, held)
        return Outcome("waiting-for-previous-job", requeue_after=PREVIOUS_JOB_RECHECK_SECONDS)
    except writes.Rejected as refused:
        state = gang.GangState("broken", 0, str(refused), cause=gang.CREATE_FAILED)
        judged = specs.pinned_spec(p, current) if p.live is not None else current
        assert judged is not None
        return supervision.broken(p, judged, pods, state)
    if (moved := _spare_replacement(p, pinned, pods)) is not None:
        return moved
    outcome = supervision.watch(p, pinned, pods)
    wanted = replacement.spares_short(p, pinned) or replacement.shrunk(p, pinned, current)
    if outcome.step == "running" and outcome.admission is None and wanted:
        # Short of spares, or shrunk: an admission pass holds more spares, or sees the full size fit again.
        return dataclasses.replace(outcome, admission=admission.admission_request(p))
    return outcome


def _spare_replacement(p: Pass, pinned: ResolvedJob, pods: Sequence[Mapping[str, Any]]) -> Outcome | None:
    """Hot spares: a lost node rank of the placed gang moves to a spare, and only its pod is made again."""
    live = p.live
    if live is None or not (live.spare_nodes or live.replacing):
        return None
    if live.replacing:
        return replacement.replace_pods(p, pinned, pods)
    lost, _ = supervision.lost_past_grace(p, [*live.nodes, *live.spare_nodes])
    p, slow = replacement.exclude_slow_nodes(p, pinned)  # spec.failurePolicy.stragglers.action Replace
    return replacement.take_spares(p, {**lost, **replacement.vanished_on_lost_nodes(p, pods, lost), **slow})


def _own_pods(p: Pass) -> list[Mapping[str, Any]]:
    """The job's pods, read from the API: only those whose ownerReference carries this job's uid."""
    return [pod for pod in reads.list_job_pods(p.session, p.namespace, p.name) if labels.owned_by(pod, p.uid)]
