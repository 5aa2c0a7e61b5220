"""The Kueue step: quotas from Kueue, as pure decisions. A ParallelJob labelled `kueue.x-k8s.io/queue-name` waits
in that LocalQueue, runs once its Workload is admitted, inside the admitted flavours, and stops when Kueue evicts
it. Kueue lists the kind under `integrations.externalFrameworks`; the operator is the external controller that
owns the job's Workload (`manifests.workload`), as Kueue's own job integrations own theirs. A job without the
label never reaches anything here.

`handlers.queueing` observes (the Workload, and only what the decision at hand uses besides: `stage` says which),
these decide from `Observed.queue` (`QueueSeen`), and `k8s.apply` writes (`Decision.workloads`, the Workload's
create and status and metadata patches; `Decision.checkpoint_request`, rank 0's checkpoint request). The reconcile
pass (`handlers.reconcile`) asks four of them, each only for a queued job:

- `gate`, where a job without a placement would be handed to the admission queue: the Workload is created (one pod
  set of `nodes` pods with the template's requests, the queue, the priority, owned by the job); until Kueue admits
  it the job is `Queued` (phase and a Queued condition naming the queue and Kueue's message) and never reaches the
  planner, so it reserves no GPU. Once admitted, the job goes on to admission with its pods' nodeSelector and
  tolerations narrowed to the admitted ResourceFlavors' node labels and taints, so the planner places the gang
  inside what Kueue admitted. Under Kueue's Topology-Aware Scheduling (`handlers.queue_topology`) the Workload asks
  for the layout's topology, the gang is planned on exactly the nodes Kueue assigned, and an assignment that breaks
  a rule of the layout gives the quota back unrequeued (TopologyRuleBroken), since the same request would be
  answered alike; a lost assigned node is waited for (Kueue replaces it in place). Under MultiKueue
  (`manifests.multikueue`) a worker's job adopts the Workload Kueue made for it, and a manager's job dispatched to a
  worker goes no further than its Workload.
- `released`, after an admission pass that could not place the gang inside its admitted flavours: the job says
  why and gives the quota back, to be tried again after UNPLACEABLE_BACKOFF_SECONDS (Kueue's requeueState),
  instead of holding quota it cannot use.
- `evicting`, before a placed gang is supervised: Kueue evicted the Workload (preemption, a lost admission check, a
  stopped queue). If the job keeps checkpoints, its pods run and rank 0's last checkpoint is older than
  `Settings.kueue_checkpoint_grace_seconds`, rank 0 is asked for one (`checkpointRequest` in its progress
  ConfigMap) and the gang stops once it is saved, or after CHECKPOINT_WAIT_SECONDS at most; then the pods are
  deleted and the job is Queued again. The attempt record says all of it (`eviction`, `evicted`), never the status.
  `gate` gives the quota back once the last pod is gone, as Kueue expects of an evicted job; a readmission places
  the same attempt number again, so evictions never count against backoffLimit, and the trainer resumes from the
  newest checkpoint.
- `finished`, when the job ends: the Workload gets Kueue's Finished condition, so its quota returns at once.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from paralleljob.api import ResolvedJob
from paralleljob.handlers.observed import Observed, QueueSeen, condition, is_terminating, pod_name, status_patch
from paralleljob.handlers.settings import Settings
from paralleljob.manifests import kueue_topology as kt
from paralleljob.manifests import multikueue as mk
from paralleljob.manifests import timestamps
from paralleljob.manifests import workload as wl
from paralleljob.manifests.decisions import Decision, Event, WorkloadWrite
from paralleljob_contract import environment
from paralleljob_contract import progress as channel

QUEUED = "Queued"
# The reason of an assignment that breaks a rule of the layout.
RULE_BROKEN = "TopologyRuleBroken"
# A queued job looks at its Workload this often without an event (Kueue's admission is watched as well).
QUEUED_RECHECK_SECONDS = 30.0
# How long a Workload whose admission the planner could not place waits before Kueue considers it again.
UNPLACEABLE_BACKOFF_SECONDS = 60.0
# The most an evicted gang waits for the checkpoint it was asked for before it stops anyway, and how often a
# pass looks whether rank 0 has answered.
CHECKPOINT_WAIT_SECONDS = 120.0
CHECKPOINT_POLL_SECONDS = 2.0
# How often a pass looks whether an evicted gang's pods are gone.
STOPPING_RECHECK_SECONDS = 2.0
# The steps after which an unplaceable admission gives the quota back (`released`).
UNPLACED = frozenset({"unschedulable", "no-layout"})


@dataclasses.dataclass(frozen=True)
class Gate:
    """What `gate` decided: the decision to write, and the job narrowed to its admission when the pass goes on
    to admit it (None: the pass ends with the decision)."""

    decision: Decision
    job: ResolvedJob | None = None


def stage(seen: Observed, current: ResolvedJob) -> str:
    """Where a queued job without a placement stands, from what is observed so far (`handlers.queueing` reads
    what the stage needs next): disabled, stopping (an evicted gang's pods still going), foreign (a Workload of
    its name it does not own), prebuilt (waiting for MultiKueue's), create, dispatched, evicted, waiting or
    admitted."""
    queue = seen.queue
    assert queue is not None
    if not queue.enabled:
        return "disabled"
    if seen.record is not None and seen.record.evicted and seen.pods:
        return "stopping"
    found = queue.workload
    if found is not None and not wl.owned_by(found, seen.uid):
        return "foreign"
    if found is None:
        return "prebuilt" if mk.prebuilt(seen.job) is not None else "create"
    if mk.managed_elsewhere(current) and mk.dispatched(found):
        return "dispatched"
    if wl.eviction(found) is not None:
        return "evicted"
    # Admitted, and holding its quota: Admitted may not be reset yet after a release.
    if not wl.admitted(found) or not wl.is_true(found, wl.QUOTA_RESERVED):
        return "waiting"
    return "admitted"


def gate(seen: Observed, current: ResolvedJob, now: datetime.datetime) -> Gate:
    """A queued job without a placement: Queued while Kueue has not admitted it (its Workload created or adopted
    first), its quota given back where it must be; once admitted, the job narrowed to its admitted flavours."""
    queue = seen.queue
    assert queue is not None
    found = queue.workload
    match stage(seen, current):
        case "disabled":
            message = (
                "this operator runs without Kueue (the chart's kueue.enabled, --kueue): the job waits until it does"
            )
            return Gate(_queued(seen, "KueueNotEnabled", message, now, recheck=None))
        case "stopping":
            return Gate(_stopping(seen))
        case "foreign":
            assert found is not None
            if mk.adoptable(seen.job, found):  # MultiKueue's prebuilt Workload: the job takes it, then reads it
                owners = [*(found["metadata"].get("ownerReferences") or ()), wl.owner_reference(seen.job)]
                adopt = WorkloadWrite("adopt", {"ownerReferences": owners}, found)
                return Gate(Decision("adopting-workload", workloads=(adopt,), requeue_after=0.0))
            message = f"Workload {wl.workload_name(seen.name)} belongs to another object; waiting until it is gone"
            return Gate(_queued(seen, "WorkloadNameTaken", message, now))
        case "prebuilt":
            named = mk.prebuilt(seen.job)
            message = f"waiting for Workload {named}, which MultiKueue creates (this operator names it "
            return Gate(_queued(seen, "Pending", f"{message}{wl.workload_name(seen.name)})", now))
        case "create":
            return Gate(_create(seen, current, queue, now))
        case "dispatched":
            return Gate(Decision("dispatched"))  # Kueue runs it on a worker and copies its status here
        case "evicted":
            assert found is not None
            reason, message = wl.eviction(found) or ("Evicted", "")
            requeued = reason in (wl.PREEMPTED, wl.NODE_FAILURES)
            release = _release(found, reason, message, now, requeued=requeued) if wl.holds_quota(found) else None
            queued = _queued(seen, reason, f"evicted by Kueue: {message}", now)
            return Gate(release.then(queued) if release is not None else queued)
        case "waiting":
            assert found is not None
            return Gate(_queued(seen, "Pending", wl.waiting_message(found), now))
    assert found is not None
    return _admitted(seen, current, queue, found, now)


def _admitted(
    seen: Observed, current: ResolvedJob, queue: QueueSeen, found: Mapping[str, Any], now: datetime.datetime
) -> Gate:
    nodes = queue.assigned
    if nodes is not None and nodes.broken is not None:
        return Gate(_rule_broken(seen, found, nodes.broken, now))
    if nodes is not None and queue.awaiting:
        message = f"admitted; waiting for Kueue to replace assigned node(s) {', '.join(queue.awaiting)} "
        message += "(TAS node replacement)"
        patch = status_patch(seen, {"phase": "Pending", "message": message, "placement": None})
        return Gate(Decision("awaiting-node-replacement", status=patch, requeue_after=QUEUED_RECHECK_SECONDS))
    message = f"admitted by ClusterQueue {wl.cluster_queue(found)} (flavours {', '.join(wl.flavors(found)) or '-'})"
    patch = status_patch(seen, {"conditions": condition(seen, QUEUED, "False", "Admitted", message, now)})
    return Gate(Decision("admitted-by-kueue", status=patch), as_tas_pods(within(current, queue.flavors), found))


def _stopping(seen: Observed) -> Decision:
    """An evicted gang's pods still going: delete them and wait (`gate` gives the quota back once they are gone)."""
    going = tuple(pod_name(pod) for pod in seen.pods if not is_terminating(pod))
    return Decision("stopping-evicted-gang", deletes=going, requeue_after=STOPPING_RECHECK_SECONDS)


def _create(seen: Observed, current: ResolvedJob, queue: QueueSeen, now: datetime.datetime) -> Decision:
    pods = wl.pod_count(current)
    if pods is None:
        message = "a job queued through Kueue needs spec.gpusPerNode: Kueue admits a number of pods; set it"
        return _queued(seen, "NeedsGpusPerNode", message, now, recheck=None)
    request = queue.topology_request
    body = wl.build_workload(seen.job, current, queue.name, pods, queue.priority, request)
    asked = f" with topology request {', '.join(f'{k}={v}' for k, v in request.items())}" if request else ""
    said = f"Workload {body['metadata']['name']} created for {pods} pods{asked}"
    created = Decision("creating-workload", workloads=(WorkloadWrite("create", body),))
    return created.then(_queued(seen, "Pending", said, now))


def _queued(
    seen: Observed, reason: str, said: str, now: datetime.datetime, recheck: float | None = QUEUED_RECHECK_SECONDS
) -> Decision:
    """Queued in the job's LocalQueue, with why; the Queued Event when the job was not Queued already."""
    assert seen.queue is not None
    message = f"queued in LocalQueue {seen.queue.name}: {said}"
    cond = condition(seen, "Valid", "True", "Validated", "the spec is valid", now)
    cond = condition(seen, QUEUED, "True", reason, message, now, base=cond)
    patch = status_patch(
        seen, {"phase": QUEUED, "message": message, "conditions": cond, "placement": None, "podsReady": 0}
    )
    told = patch is not None and seen.status.get("phase") != QUEUED
    events = (Event("Normal", QUEUED, message),) if told else ()
    return Decision("queued", status=patch, events=events, requeue_after=recheck)


def _release(
    found: Mapping[str, Any],
    reason: str,
    message: str,
    now: datetime.datetime,
    *,
    requeued: bool,
    requeue_at: str | None = None,
) -> Decision:
    """The quota given back: the Workload's admission cleared, Requeued as Kueue's own integrations set it."""
    at = timestamps.format_time(now)
    status = wl.released_status(found, reason, message, requeued=requeued, requeue_at=requeue_at, at=at)
    return Decision("releasing-quota", workloads=(WorkloadWrite("release", status, found),))


def _rule_broken(seen: Observed, found: Mapping[str, Any], rule: str, now: datetime.datetime) -> Decision:
    """Kueue's TopologyAssignment breaks a hard rule of the layout: the quota goes back, not requeued (the same
    request would get a like assignment again), with the rule as the reason Kueue shows; the job waits Queued
    with it until the job is recreated or the Workload requeued by hand."""
    message = f"Kueue's topology assignment breaks the rule '{rule}'; quota given back, not requeued"
    queued = _queued(seen, RULE_BROKEN, message, now, recheck=None)
    if not wl.holds_quota(found):
        return queued
    release = _release(found, RULE_BROKEN, message, now, requeued=False)
    return dataclasses.replace(release, events=(Event("Warning", "QuotaReleased", message),)).then(queued)


def within(current: ResolvedJob, flavors: Sequence[Mapping[str, Any]]) -> ResolvedJob:
    """The job with its pods' nodeSelector and tolerations narrowed to the admitted flavours (the planner and the
    scheduler honour both), and its trainer taking checkpoint requests."""
    allowed = wl.placement_of(flavors)
    template = current.spec.template
    selector = {**(template.node_selector or {}), **allowed.node_labels}
    tolerations = [*(template.tolerations or ()), *(dict(t) for t in allowed.tolerations)]
    env = [*(template.env or ()), {"name": environment.CHECKPOINT_REQUESTS, "value": "1"}]
    narrowed = dataclasses.replace(template, node_selector=selector or None, tolerations=tolerations or None, env=env)
    spec = dataclasses.replace(current.spec, template=narrowed)
    return dataclasses.replace(current, job=dataclasses.replace(current.job, spec=spec))


def as_tas_pods(current: ResolvedJob, found: Mapping[str, Any]) -> ResolvedJob:
    """The job whose pods carry Kueue's TAS pod annotations: the topology level of the request (Kueue leaves a
    pod with one out of its non-TAS usage, since the Workload's assignment counts it) and the Workload's name
    (Kueue's node controller finds a failed node's pods by it). `manifests.pods` adds the hostname nodeSelector."""
    pod_sets = (found.get("spec") or {}).get("podSets") or ()
    request = (pod_sets[0].get("topologyRequest") if pod_sets else None) or {}
    if not request:
        return current
    key, level = kt.pod_annotation(request)
    name = str((found.get("metadata") or {}).get("name") or "")
    template = current.spec.template
    annotations = {**(template.annotations or {}), key: level, kt.WORKLOAD_ANNOTATION: name}
    spec = dataclasses.replace(current.spec, template=dataclasses.replace(template, annotations=annotations))
    return dataclasses.replace(current, job=dataclasses.replace(current.job, spec=spec))


# -- after an admission pass that could not place the gang ---------------------------------------------------


def released(seen: Observed, now: datetime.datetime) -> Decision | None:
    """A queued job its planner could not place inside the admitted flavours (the job's status says why, as the
    admission pass just wrote it; `seen.queue.workload` read after it) gives the quota back, to be considered
    again after UNPLACEABLE_BACKOFF_SECONDS; None when it holds none."""
    found = seen.queue.workload if seen.queue is not None else None
    if found is None or not wl.holds_quota(found):
        return None
    why = str(seen.status.get("message") or "the planner found no placement")
    if kt.assigned_domains(found) is not None:
        # Under TAS Kueue counted these nodes' capacity itself: what the planner refuses on them is a rule of the
        # layout (memory, GPU products, NVLink), which the same request would meet again; no retry loop.
        return _rule_broken(seen, found, f"the planner's placement: {why}", now)
    message = f"the admitted flavours cannot hold the gang ({why}); quota given back, tried again in "
    message += f"{UNPLACEABLE_BACKOFF_SECONDS:.0f}s"
    until = timestamps.format_time(now + datetime.timedelta(seconds=UNPLACEABLE_BACKOFF_SECONDS))
    release = _release(found, wl.PLACEMENT_FAILED, message, now, requeued=True, requeue_at=until)
    release = dataclasses.replace(release, events=(Event("Warning", "QuotaReleased", message),))
    return release.then(_queued(seen, wl.PLACEMENT_FAILED, message, now))


# -- a placed gang ------------------------------------------------------------------------------------------


def evicted(seen: Observed) -> tuple[str, str] | None:
    """Why the placed gang may not run any more: Kueue's eviction, or its Workload deleted (the next pass makes
    one); None while the Workload stays admitted."""
    found = seen.queue.workload if seen.queue is not None else None
    if found is None or not wl.owned_by(found, seen.uid):
        return "WorkloadDeleted", "the job's Workload was deleted"
    if (eviction := wl.eviction(found)) is not None:
        return eviction
    if not wl.is_true(found, wl.ADMITTED):
        return "AdmissionLost", wl.waiting_message(found)
    return None


def reads_progress(seen: Observed, resolved: ResolvedJob, pods: Sequence[Mapping[str, Any]]) -> bool:
    """Whether `evicting` reads rank 0's progress ConfigMap (`observe.with_report`): to ask for a checkpoint, or
    to see whether the one asked for came."""
    live = seen.live
    if live is None or evicted(seen) is None:
        return False
    if live.eviction is not None:
        return bool(live.eviction.get("checkpointRequest"))
    return _may_ask(resolved, pods)


def _may_ask(resolved: ResolvedJob, pods: Sequence[Mapping[str, Any]]) -> bool:
    """A job that keeps checkpoints (on a volume) and whose pods all run may be asked for one."""
    if resolved.spec.checkpoint is None or resolved.spec.checkpoint.volume is None or not pods:
        return False
    return all((pod.get("status") or {}).get("phase") == "Running" for pod in pods)


def evicting(
    seen: Observed, resolved: ResolvedJob, pods: Sequence[Mapping[str, Any]], settings: Settings, now: datetime.datetime
) -> Decision | None:
    """A placed gang of a queued job: None while its Workload stays admitted; else the eviction's next step (rank 0
    asked for a checkpoint, waiting for it, or the gang stopped)."""
    live = seen.live
    why = evicted(seen)
    if live is None or why is None:
        return None
    eviction = live.eviction
    if eviction is None:
        reason, message = why
        eviction = {"reason": reason, "message": message, "since": timestamps.format_time(now)}
        request = checkpoint_needed(seen, resolved, pods, settings, now)
        if request is None:
            return _stop(seen, eviction, now)
        eviction = {**eviction, **request}
        said = f"evicted by Kueue ({reason}: {message}); asked rank 0 for a checkpoint before the gang stops"
        # Rank 0 is asked before the record says so: a pass killed between them asks again next time.
        asked = Decision("asking-for-checkpoint", checkpoint_request=request["checkpointRequest"])
        return asked.before(
            Decision(
                "evicting",
                record=live.with_eviction(eviction),
                status=status_patch(seen, {"message": said}),
                events=(Event("Normal", "CheckpointRequested", said),),
                requeue_after=CHECKPOINT_POLL_SECONDS,
            )
        )
    if eviction.get("checkpointRequest") and not _answered(seen, eviction) and not _overdue(eviction, now):
        return Decision("evicting", requeue_after=CHECKPOINT_POLL_SECONDS)
    return _stop(seen, eviction, now)


def checkpoint_needed(
    seen: Observed,
    resolved: ResolvedJob,
    pods: Sequence[Mapping[str, Any]],
    settings: Settings,
    now: datetime.datetime,
) -> dict[str, str] | None:
    """The checkpoint request to make: when the job keeps checkpoints, all its pods run, and rank 0's last
    checkpoint is older than the grace period (or it has reported none); None otherwise. The request's id is the
    attempt and the moment: a readmitted attempt evicted again asks anew."""
    # A job may keep no checkpoints at all (no spec.checkpoint): then there is nothing to ask rank 0 for.
    if not _may_ask(resolved, pods):
        return None
    data = _progress_data(seen)
    age = timestamps.seconds_since(data.get(channel.LAST_CHECKPOINT_TIME), now)
    if age is not None and age < settings.kueue_checkpoint_grace_seconds:
        return None
    request = f"{seen.attempt}-{int(now.timestamp())}"
    return {"checkpointRequest": request, "checkpointStep": str(data.get(channel.LAST_CHECKPOINT_STEP) or "")}


def _progress_data(seen: Observed) -> Mapping[str, str]:
    return dict((seen.progress or {}).get("data") or {})


def _answered(seen: Observed, eviction: Mapping[str, str]) -> bool:
    return _progress_data(seen).get(channel.CHECKPOINT_SERVED) == eviction.get("checkpointRequest")


def _overdue(eviction: Mapping[str, str], now: datetime.datetime) -> bool:
    waited = timestamps.seconds_since(eviction.get("since"), now)
    return waited is None or waited >= CHECKPOINT_WAIT_SECONDS


def _stop(seen: Observed, eviction: Mapping[str, str], now: datetime.datetime) -> Decision:
    """Stop the evicted gang: the record says so first (the attempt holds no node any more), then the job is
    Queued again and its pods are deleted; `gate` gives the quota back once they are gone. A checkpoint request,
    answered or not, is cleared last, so that the next gang does not take it for a new one."""
    live = seen.live
    assert live is not None and seen.queue is not None
    saved = ""
    if eviction.get("checkpointRequest"):
        answered = _answered(seen, eviction)
        saved = "; the checkpoint asked for is saved" if answered else "; no checkpoint came in time"
    message = f"evicted by Kueue ({eviction.get('reason')}: {eviction.get('message')}){saved}; "
    message += "the gang stops and resumes from its newest checkpoint when admitted again"
    cond = condition(seen, "Ready", "False", "Evicted", message, now)
    cond = condition(seen, "Scheduled", "False", "Evicted", message, now, base=cond)
    cond = condition(seen, QUEUED, "True", str(eviction.get("reason") or "Evicted"), message, now, base=cond)
    patch = {"phase": QUEUED, "message": message, "conditions": cond, "placement": None, "podsReady": 0}
    return Decision(
        "evicted",
        record=live.with_eviction(eviction).with_evicted(),
        status=status_patch(seen, {**patch, "network": None}),
        events=(Event("Warning", "Evicted", f"{message} (LocalQueue {seen.queue.name})"),),
        deletes=tuple(pod_name(pod) for pod in seen.pods if not is_terminating(pod)),
        checkpoint_request="" if eviction.get("checkpointRequest") else None,
        wake_others=True,
        requeue_after=STOPPING_RECHECK_SECONDS,
    )


# -- the end ------------------------------------------------------------------------------------------------


def finished(seen: Observed, phase: str, message: str, now: datetime.datetime) -> Decision | None:
    """The job ended (`phase` Succeeded or Failed): Finished on its Workload (once), so that Kueue returns the
    quota at once. Asked when the job ends and again by every pass of a finished job, so a kill between the job's
    end and this write cannot keep the quota."""
    found = seen.queue.workload if seen.queue is not None else None
    if found is None or not wl.owned_by(found, seen.uid) or wl.is_true(found, wl.FINISHED):
        return None
    message = message or str(seen.status.get("message") or f"the ParallelJob {phase.lower()}")
    status = wl.finished_status(found, phase == "Succeeded", message, at=timestamps.format_time(now))
    return Decision("workload-finished", workloads=(WorkloadWrite("finish", status, found),))
