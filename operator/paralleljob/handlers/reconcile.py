"""One reconcile pass over one ParallelJob: observe, decide, apply.

The pass reads what it decides from into one frozen value (`handlers.observe` -> `handlers.observed.Observed`),
a step turns it into one `Decision` with a pure `decide(observed, settings, now)` (`finished`, `invalid`,
`draining`, `conflicts`, `admission`, `creation`, `replacement`, `supervision`), and `k8s.apply` writes it
(`_written`; for an admission, right after the admission lock's fence). A write the API refuses is observed by the
next decision, not handled inside one; so is the status report of the live attempt (`handlers.reported`). A job
queued through Kueue meets the Kueue step (`steps.kueue`, observed by `handlers.queueing`) at four points: before
admission (`gate`), after an admission that could not place it (`released`), before supervision (`evicting`) and
at its end (`finished`).

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

from paralleljob import planning
from paralleljob.handlers import (
    conditions,
    failures,
    gang,
    lost_peers,
    observe,
    placement,
    queue_topology,
    queueing,
    reported,
    specs,
)
from paralleljob.handlers import metrics as m
from paralleljob.handlers.observed import PREVIOUS_JOB_RECHECK_SECONDS, Observed
from paralleljob.handlers.passes import NodeView, Outcome, Pass
from paralleljob.handlers.settings import Settings
from paralleljob.handlers.steps import (
    admission,
    conflicts,
    creation,
    draining,
    finished,
    invalid,
    kueue,
    replacement,
    supervision,
)
from paralleljob.k8s import apply, reads, writes
from paralleljob.k8s.session import Session
from paralleljob.manifests import labels, records
from paralleljob.manifests.decisions import Decision

AdmissionRequest = admission.AdmissionRequest

__all__ = ["AdmissionRequest", "NodeView", "Outcome", "Pass", "Settings", "reconcile"]

log = logging.getLogger(__name__)

# Steps after which only an edit or a deletion changes anything: no resync.
RESTING_STEPS = frozenset({"gone", "finished", "succeeded", "failed", "invalid"})
# The steps that end a job (supervision's, and the admission step's for a network it refuses).
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
        own = found if claim == "own" else None
        outcome = _step(
            Pass(session, settings, job, nodes, admit, record, foreign_config=foreign, config_map=own, fence=fence)
        )
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
    if outcome.step in ENDED:
        _workload_finished(p, outcome.step.capitalize())
    return outcome


def _workload_finished(p: Pass, phase: str) -> None:
    """A queued job that ended: Finished on its Workload returns its quota at once (`steps.kueue.finished`);
    asked by every pass of a finished job too, level-triggered."""
    if not queueing.queued(p.job):
        return
    seen = queueing.for_workload(p, Observed(job=p.job, record=p.record))
    if (decision := kueue.finished(seen, phase, "", p.session.server_now())) is not None:
        apply.apply(p.session, p.job, decision)


def _first_step_that_applies(p: Pass) -> Outcome:
    current, problems = specs.current_spec(p)
    seen = observe.observe(p, current, problems)
    now = p.session.server_now()
    if seen.finished:
        _workload_finished(p, (p.record.outcome if p.record is not None else None) or "")
        m.observe_phase(p.namespace, p.name, p.status.get("phase"))
        return _written(p, finished.decide(seen, p.settings, now))
    if current is None and seen.live is None:
        decision = invalid.decide(seen, p.settings, now)
        if p.record is not None and seen.stale:  # between attempts the old generation may still be going
            drained = draining.decide(seen, p.settings, now)
            decision = drained.then(invalid.decide(seen.with_status(drained.status), p.settings, now))
        return _written(p, decision)
    m.observe_phase(p.namespace, p.name, p.status.get("phase"))
    labelled, pods = list(seen.labelled), list(seen.pods)
    if seen.stale:
        return _written(p, draining.decide(seen, p.settings, now))
    if seen.namesake:
        drained = draining.drain(seen, seen.namesake, p.settings, now)
        return _written(p, conflicts.wait_for_previous_job(seen, drained))
    if current is None:
        # An edit made the spec invalid: it gates only the next attempt; the running one is still supervised.
        p = dataclasses.replace(p, spec_problem=problems)
        seen = dataclasses.replace(seen, spec_problem=problems)
        _written(p, invalid.decide(seen, p.settings, now))
    try:
        if not p.placed_nodes:
            assert current is not None  # no live attempt: an invalid spec returned above
            if p.foreign_config is not None:  # nothing can be admitted while someone else holds the ConfigMap
                name = labels.config_map_name(p.name)
                raise writes.NameConflict("ConfigMap", name, labels.holder_of(p.foreign_config))
            if (waiting := conflicts.decide(seen, p.settings, now)) is not None:
                return _written(p, waiting)
            if queueing.queued(p.job):  # Queued until Kueue admits its Workload, then planned inside the admission
                seen = queueing.for_gate(p, seen, current)
                gate = kueue.gate(seen, current, now)
                written = _written(p, gate.decision)
                if gate.job is None:
                    return written
                current = gate.job
            if not p.admit:
                queued = _written(p, admission.awaiting(seen, now))
                return dataclasses.replace(queued, admission=admission.request(seen))
            # Under Kueue's TAS, only the nodes of its TopologyAssignment.
            assigned = seen.queue.assigned if seen.queue is not None else None
            view = queue_topology.inside(observe.cluster_view(p, labelled), assigned)
            decision = admission.decide(observe.for_admission(p, seen, current, view), p.settings, now)
            admitted = _written(p, decision, fence=p.fence)
            if decision.step == "unschedulable":  # the job keeps its place: the reservations it was planned around
                admitted = dataclasses.replace(admitted, held=tuple(view.held))
            unplaced = seen.queue is not None and decision.step in kueue.UNPLACED  # it gives the quota back
            released = kueue.released(queueing.for_workload(p, seen), now) if unplaced else None
            return _written(p, released) if released is not None else admitted
        pinned = specs.pinned_spec(p, current)
        if p.admit:
            if replacement.shrunk(seen, pinned, current):  # the DP shrink: does the full size fit again?
                assert current is not None
                view = observe.cluster_view(p, labelled)
                usage = p.nodes.usage.without([(p.namespace, pod["metadata"]["name"]) for pod in pods])
                found = placement.plan(
                    current, view.nodes, usage.usage, view.held, placement.Avoid.of(p.record), view.builder
                )
                fits = found.plan is not None
                if fits:  # rank 0's last checkpoint is read only when the gang is to grow back after the next one
                    seen = dataclasses.replace(seen, checkpoint_step=observe.last_checkpoint(p, current))
                return _queued_or_written(p, replacement.grow_when_fits(seen, pinned, current, fits), view.held)
            if replacement.spares_short(seen, pinned):  # hot spares used or lost: hold more where the cluster allows
                # Under Kueue's TAS, only inside the nodes Kueue assigned (handlers.queue_topology).
                view = queue_topology.inside_assignment(p, pinned, observe.cluster_view(p, labelled))
                cluster = view.builder.build(view.nodes.infos, view.usage, view.held)
                decision = replacement.top_up(seen, pinned, cluster)
                return _queued_or_written(p, decision, view.held, fenced=True)
            # Placed meanwhile: the rest is supervision's, so the admission worker moves on at once.
            return Outcome("placed", requeue_after=0.0)
        # What a pass killed between the record and the status left unreported (issue 39): the status follows it.
        if (unreported := reported.decide(seen, pinned)) is not None:
            _written(p, unreported)
        # Kueue evicted the Workload: checkpoint, stop, back to Queued.
        if queueing.queued(p.job) and seen.live is not None:
            evicting = kueue.evicting(queueing.for_eviction(p, seen, pinned, pods), pinned, pods, p.settings, now)
            if evicting is not None:
                return _written(p, evicting)
        if seen.live is not None and not seen.live.placed:
            return _written(p, creation.decide(dataclasses.replace(seen, pinned=pinned), p.settings, now))
    except writes.NameConflict as conflict:
        # The refusal is observed like anything else, with the pods read again (this pass may have made some).
        return _written(
            p, conflicts.decide(observe.observe(p, current, problems, refused=str(conflict)), p.settings, now)
        )
    except writes.HeldByAnother as held:
        log.info("%s/%s waits for the garbage collector: %s", p.namespace, p.name, held)
        return Outcome("waiting-for-previous-job", requeue_after=PREVIOUS_JOB_RECHECK_SECONDS)
    except writes.Rejected as refused:
        state = gang.GangState("broken", 0, str(refused), cause=gang.CREATE_FAILED)
        judged = specs.pinned_spec(p, current) if p.live is not None else current
        assert judged is not None
        return _supervised(p, dataclasses.replace(seen, pinned=judged), state)
    gang_seen = dataclasses.replace(seen, pinned=pinned)
    if p.live is not None:  # the spare step and supervision judge the gang on the same evidence, read once
        judged_nodes = [*p.live.nodes, *p.live.spare_nodes, *(gang.node_of(pod) for pod in pods)]
        p = lost_peers.weighed(p, judged_nodes)
        gang_seen = observe.for_gang(p, gang_seen, judged_nodes)
    if (moved := _spare_replacement(p, gang_seen)) is not None:
        return moved
    outcome = _supervised(p, gang_seen)
    wanted = replacement.spares_short(seen, pinned) or replacement.shrunk(seen, pinned, current)
    if outcome.step == "running" and outcome.admission is None and wanted:
        # Short of spares, or shrunk: an admission pass holds more spares, or sees the full size fit again.
        return dataclasses.replace(outcome, admission=admission.request(seen))
    return outcome


def _spare_replacement(p: Pass, seen: Observed) -> Outcome | None:
    """Hot spares: a lost node rank of the placed gang moves to a spare, and only its pod is made again. The
    Outcome of a move (`replacement.MOVING`) ends the pass; a decision that only drops a lost spare or excludes
    slow nodes is written, and supervision judges the gang in the same pass (None), from the record as read."""
    live = seen.live
    if not replacement.applies(live):
        return None
    assert live is not None
    now = p.session.server_now()
    lost = None  # while a move is under way, nothing is looked up
    if not live.replacing:
        lost = supervision.lost_past_grace(seen, [*live.nodes, *live.spare_nodes], p.settings, now)[0]
    decision = replacement.decide(observe.for_spares(p, seen, lost), p.settings, now)
    if decision is None:
        return None
    written = _written(p, decision)
    return written if decision.step in replacement.MOVING else None


def _supervised(p: Pass, seen: Observed, broken: gang.GangState | None = None) -> Outcome:
    """Supervision over the placed gang of `seen` (`steps.supervision`), or over a gang `broken` by a create the
    API refused for good: rank 0's progress ConfigMap is read first only when the decision uses it
    (`supervision.reads_report`); the gang restarts the written decision made are counted in the metric."""
    now = p.session.server_now()
    state = broken if broken is not None else supervision.judge(seen, p.settings, now)
    if supervision.reads_report(seen, state):
        seen = observe.with_report(p, seen)
    if broken is not None:
        decision = supervision.broken(seen, broken, p.settings, now)
    else:
        decision = supervision.decide(seen, p.settings, now)
    outcome = _written(p, decision)
    m.GANG_RESTARTS.inc(supervision.restarts_in(decision))
    return outcome


def _queued_or_written(
    p: Pass, decision: Decision, held: Sequence[planning.Reservation], *, fenced: bool = False
) -> Outcome:
    """An admission pass's decision over a placed job (the spare step's `top_up`, `grow_when_fits`): one that
    writes nothing keeps the job's place in the admission queue (`held`: the reservations it was planned
    against); one that writes is written, after the admission lock's fence when it holds more GPUs (`fenced`:
    the reservations read for this pass are still the cluster's)."""
    if decision.writes_nothing:
        return Outcome(decision.step, requeue_after=decision.requeue_after, held=tuple(held))
    if fenced and p.fence is not None:
        p.fence()
    return _written(p, decision)


def _written(p: Pass, decision: Decision | None, fence: Callable[[], None] | None = None) -> Outcome:
    """Write a step's decision (`k8s.apply`, the one writer; `fence`, the admission lock's, before an admitted
    attempt) and say what the pass asks of the scheduler."""
    assert decision is not None  # a refusal always decides a name conflict
    apply.apply(p.session, p.job, decision, fence)
    if decision.status and "phase" in decision.status:
        m.observe_phase(p.namespace, p.name, decision.status["phase"])
    return Outcome(decision.step, wake_others=decision.wake_others, requeue_after=decision.requeue_after)
