"""Quotas from Kueue: a ParallelJob labelled `kueue.x-k8s.io/queue-name` waits in that LocalQueue, runs once its
Workload is admitted, inside the admitted flavours, and stops when Kueue evicts it. Kueue lists the kind under
`integrations.externalFrameworks`; the operator is the external controller that owns the job's Workload
(`manifests.workload`), as Kueue's own job integrations own theirs. A job without the label never reaches
anything here.

The reconcile pass (`handlers.reconcile`) calls three hooks, each a no-op for a job that is not queued:

- `gate`, where a job without a placement would be handed to the admission queue: the Workload is created
  (one pod set of `nodes` pods with the template's requests, the queue, the priority, owned by the job); until
  Kueue admits it the job is `Queued` (phase and a Queued condition naming the queue and Kueue's message) and
  never reaches the planner, so it reserves no GPU. Once admitted, the job goes on to admission with its pods'
  nodeSelector and tolerations narrowed to the admitted ResourceFlavors' node labels and taints, so the
  planner places the gang inside what Kueue admitted. A gang the planner cannot place there
  (`placed_or_released`) says why and gives the quota back, to be tried again after UNPLACEABLE_BACKOFF_SECONDS
  (Kueue's requeueState), instead of holding quota it cannot use. Under Kueue's Topology-Aware Scheduling
  (`handlers.queue_topology`) the Workload asks for the layout's topology, the gang is planned on exactly the
  nodes Kueue assigned, and an assignment that breaks a rule of the layout gives the quota back unrequeued
  (TopologyRuleBroken), since the same request would be answered alike; a lost assigned node is waited for
  (Kueue replaces it in place). Under MultiKueue (`handlers.multikueue`) a worker's job adopts the Workload
  Kueue made for it, and a manager's job dispatched to a worker goes no further than its Workload.
- `supervise`, before a placed gang is supervised: Kueue evicted the Workload (preemption, a lost admission
  check, a stopped queue). If the job keeps checkpoints, its pods run and rank 0's last checkpoint is older than
  `Settings.kueue_checkpoint_grace_seconds`, rank 0 is asked for one (`checkpointRequest` in its progress
  ConfigMap) and the gang stops once it is saved, or after CHECKPOINT_WAIT_SECONDS at most; then the pods are
  deleted and the job is Queued again. The attempt record says all of it (`eviction`, `evicted`), never the
  status. `gate` gives the quota back once the last pod is gone, as Kueue expects of an evicted job; a
  readmission places the same attempt number again, so evictions never count against backoffLimit, and the
  trainer resumes from the newest checkpoint.
- `finish`, when the job ends: the Workload gets Kueue's Finished condition, so its quota returns at once.

An operator started without `--kueue` (the chart's `kueue.enabled`) has neither the Workload rights nor the
watch: a labelled job then waits, Queued with the reason KueueNotEnabled, rather than run around Kueue. With it,
`watch_workloads` asks for a pass whenever one of the operator's Workloads changes. The hooks work on the
pass's own `Pass`, `Outcome`, `write_status` and `_write_record`, so they move with the step modules.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import secrets
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import kopf

from paralleljob.api import ResolvedJob
from paralleljob.handlers import multikueue, passes, queue_topology
from paralleljob.k8s import reads, workloads, writes
from paralleljob.manifests import kueue_topology, labels, timestamps
from paralleljob.manifests import workload as wl
from paralleljob_contract import environment
from paralleljob_contract import progress as channel

log = logging.getLogger(__name__)

QUEUED = "Queued"
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


def queued(p: passes.Pass) -> bool:
    return wl.queue_of(p.job) is not None


_WATCHING: list[str] = []


def watch_workloads(request: Callable[[Hashable], None]) -> None:
    """Register (once) the kopf handler that asks for a pass over a job whenever its Workload changes (Kueue
    admitted or evicted it); kopf filters them by the job label the operator puts on its Workloads."""
    if _WATCHING:
        return
    _WATCHING.append(wl.PLURAL)

    @kopf.on.event(wl.GROUP, wl.VERSION, wl.PLURAL, labels={labels.JOB_LABEL: kopf.PRESENT})
    async def workload_changed(namespace: str | None, meta: Mapping[str, Any], **_: Any) -> None:
        job = (meta.get("labels") or {}).get(labels.JOB_LABEL)
        if namespace and job:
            request((namespace, job))


# -- before admission ---------------------------------------------------------------------------------------


def gate(p: passes.Pass, current: ResolvedJob) -> passes.Outcome | ResolvedJob:
    """A job without a placement: the job itself when it is not queued; the job narrowed to its admitted
    flavours once Kueue admitted its Workload; else what the pass did (the job is Queued)."""
    queue = wl.queue_of(p.job)
    if queue is None:
        return current
    if not p.settings.kueue:
        message = "this operator runs without Kueue (the chart's kueue.enabled, --kueue): the job waits until it does"
        return _queued(p, queue, "KueueNotEnabled", message, recheck=None)
    if p.record is not None and p.record.evicted and (stopping := _stop_evicted_pods(p)) is not None:
        return stopping
    found = workloads.get(p.session, p.namespace, p.name)
    if found is not None and not wl.owned_by(found, p.uid) and multikueue.adopt(p, found):
        found = workloads.get(p.session, p.namespace, p.name)  # MultiKueue's prebuilt Workload, now the job's
    if found is not None and not wl.owned_by(found, p.uid):
        message = f"Workload {wl.workload_name(p.name)} belongs to another object; waiting until it is gone"
        return _queued(p, queue, "WorkloadNameTaken", message, recheck=QUEUED_RECHECK_SECONDS)
    if found is None and (named := multikueue.prebuilt(p.job)) is not None:
        message = f"waiting for Workload {named}, which MultiKueue creates (this operator names it {wl.workload_name(p.name)})"
        return _queued(p, queue, "Pending", message)
    if found is None:
        return _create_workload(p, current, queue)
    if multikueue.managed_elsewhere(current) and multikueue.dispatched(found):
        return passes.Outcome("dispatched")  # Kueue runs it on a worker and copies its status here
    if (evicted := wl.eviction(found)) is not None:
        if wl.holds_quota(found):
            reason, message = evicted
            _release(p, found, reason, message, requeued=reason in (wl.PREEMPTED, wl.NODE_FAILURES))
        return _queued(p, queue, evicted[0], f"evicted by Kueue: {evicted[1]}")
    if not wl.admitted(found):
        return _queued(p, queue, "Pending", wl.waiting_message(found))
    if not wl.is_true(found, wl.QUOTA_RESERVED):  # Admitted was not reset yet after a release: not admitted
        return _queued(p, queue, "Pending", wl.waiting_message(found))
    nodes = queue_topology.assigned(p, current, found)
    if nodes is not None and nodes.broken is not None:
        return _rule_broken(p, queue, found, nodes.broken)
    if nodes is not None and (lost := queue_topology.lost(p, nodes, found)):
        message = f"admitted; waiting for Kueue to replace assigned node(s) {', '.join(lost)} (TAS node replacement)"
        passes.write_status(p, {"phase": "Pending", "message": message, "placement": None})
        return passes.Outcome("awaiting-node-replacement", requeue_after=QUEUED_RECHECK_SECONDS)
    return queue_topology.as_tas_pods(_within_admission(p, current, found), found)


def _rule_broken(p: passes.Pass, queue: str, found: Mapping[str, Any], rule: str) -> passes.Outcome:
    """Kueue's TopologyAssignment breaks a hard rule of the layout: the quota goes back, not requeued (the same
    request would get a like assignment again), with the rule as the reason Kueue shows; the job waits Queued
    with it until the job is recreated or the Workload requeued by hand."""
    message = f"Kueue's topology assignment breaks the rule '{rule}'; quota given back, not requeued"
    if wl.holds_quota(found):
        _release(p, found, queue_topology.RULE_BROKEN, message, requeued=False)
        p.event("Warning", "QuotaReleased", message)
    return _queued(p, queue, queue_topology.RULE_BROKEN, message, recheck=None)


def _create_workload(p: passes.Pass, current: ResolvedJob, queue: str) -> passes.Outcome:
    pods = wl.pod_count(current)
    if pods is None:
        message = "a job queued through Kueue needs spec.gpusPerNode: Kueue admits a number of pods; set it"
        return _queued(p, queue, "NeedsGpusPerNode", message, recheck=None)
    request = queue_topology.topology_request(p, current, queue, pods)
    body = wl.build_workload(p.job, current, queue, pods, _priority(p, current), request)
    workloads.create(p.session, body)
    asked = f" with topology request {_said(request)}" if request else ""
    return _queued(p, queue, "Pending", f"Workload {body['metadata']['name']} created for {pods} pods{asked}")


def _said(request: Mapping[str, Any]) -> str:
    return ", ".join(f"{key}={value}" for key, value in request.items())


def _priority(p: passes.Pass, current: ResolvedJob) -> wl.Priority | None:
    source = wl.priority_source(p.job, current)
    if source is None:
        return None
    group, kind, name = source
    if kind == "PriorityClass":
        value = reads.priority_value(p.session, name)
    else:
        value = workloads.workload_priority_value(p.session, name)
    return wl.Priority(group, kind, name, value or 0)


def _queued(
    p: passes.Pass, queue: str, reason: str, said: str, recheck: float | None = QUEUED_RECHECK_SECONDS
) -> passes.Outcome:
    message = f"queued in LocalQueue {queue}: {said}"
    cond = p.condition("Valid", "True", "Validated", "the spec is valid")
    cond = p.condition(QUEUED, "True", reason, message, base=cond)
    patch = {"phase": QUEUED, "message": message, "conditions": cond, "placement": None, "podsReady": 0}
    before = p.status.get("phase")
    if passes.write_status(p, patch) and before != QUEUED:
        p.event("Normal", QUEUED, message)
    return passes.Outcome("queued", requeue_after=recheck)


def _within_admission(p: passes.Pass, current: ResolvedJob, found: Mapping[str, Any]) -> ResolvedJob:
    """The job with its pods' nodeSelector and tolerations narrowed to the admitted flavours (the planner and the
    scheduler honour both), and its trainer taking checkpoint requests; the Queued condition turns False."""
    flavors = [flavor for name in wl.flavors(found) if (flavor := workloads.flavor(p.session, name)) is not None]
    allowed = wl.placement_of(flavors)
    message = f"admitted by ClusterQueue {wl.cluster_queue(found)} (flavours {', '.join(wl.flavors(found)) or '-'})"
    passes.write_status(p, {"conditions": p.condition(QUEUED, "False", "Admitted", message)})
    template = current.spec.template
    selector = {**(template.node_selector or {}), **allowed.node_labels}
    tolerations = [*(template.tolerations or ()), *(dict(t) for t in allowed.tolerations)]
    env = [*(template.env or ()), {"name": environment.CHECKPOINT_REQUESTS, "value": "1"}]
    narrowed = dataclasses.replace(template, node_selector=selector or None, tolerations=tolerations or None, env=env)
    spec = dataclasses.replace(current.spec, template=narrowed)
    return dataclasses.replace(current, job=dataclasses.replace(current.job, spec=spec))


def placed_or_released(p: passes.Pass, outcome: passes.Outcome) -> passes.Outcome:
    """After an admission pass of a queued job: one that could not be placed inside its admitted flavours gives
    the quota back (the job says why), to be considered again after UNPLACEABLE_BACKOFF_SECONDS."""
    if not queued(p) or outcome.step not in ("unschedulable", "no-layout"):
        return outcome
    found = workloads.get(p.session, p.namespace, p.name)
    if found is None or not wl.holds_quota(found):
        return outcome
    why = str(p.status.get("message") or "the planner found no placement")
    if wl.holds_quota(found) and kueue_topology.assigned_domains(found) is not None:
        # Under TAS Kueue counted these nodes' capacity itself: what the planner refuses on them is a rule of the
        # layout (memory, GPU products, NVLink), which the same request would meet again; no retry loop.
        return _rule_broken(p, wl.queue_of(p.job) or "", found, f"the planner's placement: {why}")
    message = f"the admitted flavours cannot hold the gang ({why}); quota given back, tried again in "
    message += f"{UNPLACEABLE_BACKOFF_SECONDS:.0f}s"
    until = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=UNPLACEABLE_BACKOFF_SECONDS)
    _release(p, found, wl.PLACEMENT_FAILED, message, requeued=True, requeue_at=timestamps.format_time(until))
    p.event("Warning", "QuotaReleased", message)
    queue = wl.queue_of(p.job) or ""
    return _queued(p, queue, wl.PLACEMENT_FAILED, message)


def _release(
    p: passes.Pass,
    found: Mapping[str, Any],
    reason: str,
    message: str,
    *,
    requeued: bool,
    requeue_at: str | None = None,
) -> None:
    status = wl.released_status(found, reason, message, requeued=requeued, requeue_at=requeue_at)
    workloads.patch_status(p.session, found, status)
    log.info("%s/%s gave its Kueue quota back: %s", p.namespace, p.name, message)


# -- a placed gang ------------------------------------------------------------------------------------------


def supervise(p: passes.Pass, resolved: ResolvedJob, pods: Sequence[Mapping[str, Any]]) -> passes.Outcome | None:
    """A placed gang of a queued job: None while its Workload stays admitted; else the eviction's next step."""
    live = p.live
    if not queued(p) or live is None:
        return None
    found = workloads.get(p.session, p.namespace, p.name)
    evicted = _evicted(found, p.uid)
    if evicted is None:
        return None
    eviction = live.eviction
    if eviction is None:
        reason, message = evicted
        eviction = {"reason": reason, "message": message, "since": timestamps.now()}
        request = _checkpoint_needed(p, resolved, pods)
        if request is not None:
            eviction = {**eviction, **request}
            _ask_for_checkpoint(p, request["checkpointRequest"])
        passes.write_record(p, live.with_eviction(eviction))
        if request is not None:
            said = f"evicted by Kueue ({reason}: {message}); asked rank 0 for a checkpoint before the gang stops"
            passes.write_status(p, {"message": said})
            p.event("Normal", "CheckpointRequested", said)
            return passes.Outcome("evicting", requeue_after=CHECKPOINT_POLL_SECONDS)
    elif eviction.get("checkpointRequest") and not _answered(p, eviction) and not _overdue(p, eviction):
        return passes.Outcome("evicting", requeue_after=CHECKPOINT_POLL_SECONDS)
    return _stop(p, pods, eviction)


def _evicted(found: Mapping[str, Any] | None, uid: str) -> tuple[str, str] | None:
    """Why the gang may not run any more: Kueue's eviction, or a Workload deleted (the next pass makes one)."""
    if found is None or not wl.owned_by(found, uid):
        return "WorkloadDeleted", "the job's Workload was deleted"
    if (evicted := wl.eviction(found)) is not None:
        return evicted
    if not wl.is_true(found, wl.ADMITTED):
        return "AdmissionLost", wl.waiting_message(found)
    return None


def _checkpoint_needed(
    p: passes.Pass, resolved: ResolvedJob, pods: Sequence[Mapping[str, Any]]
) -> dict[str, str] | None:
    """The checkpoint request to make: when the job keeps checkpoints, all its pods run, and rank 0's last
    checkpoint is older than the grace period (or it has reported none); None otherwise."""
    # A job may keep no checkpoints at all (no spec.checkpoint): then there is nothing to ask rank 0 for.
    if resolved.spec.checkpoint is None or resolved.spec.checkpoint.volume is None or not pods:
        return None
    if any((pod.get("status") or {}).get("phase") != "Running" for pod in pods):
        return None
    data = _progress_data(p)
    grace = p.settings.kueue_checkpoint_grace_seconds
    age = timestamps.seconds_since(data.get(channel.LAST_CHECKPOINT_TIME), p.session.server_now())
    if age is not None and age < grace:
        return None
    request = f"{p.attempt}-{secrets.token_hex(4)}"
    return {"checkpointRequest": request, "checkpointStep": str(data.get(channel.LAST_CHECKPOINT_STEP) or "")}


def _progress_data(p: passes.Pass) -> Mapping[str, str]:
    found = reads.get_config_map(p.session, p.namespace, labels.progress_config_map_name(p.name))
    if found is None or not labels.owned_by(found, p.uid):
        return {}
    return dict(found.get("data") or {})


def _ask_for_checkpoint(p: passes.Pass, request: str) -> None:
    name = labels.progress_config_map_name(p.name)
    writes.patch_config_map(p.session, p.namespace, name, {channel.CHECKPOINT_REQUEST: request}, {})


def _answered(p: passes.Pass, eviction: Mapping[str, str]) -> bool:
    return _progress_data(p).get(channel.CHECKPOINT_SERVED) == eviction.get("checkpointRequest")


def _overdue(p: passes.Pass, eviction: Mapping[str, str]) -> bool:
    waited = timestamps.seconds_since(eviction.get("since"), p.session.server_now())
    return waited is None or waited >= CHECKPOINT_WAIT_SECONDS


def _stop(p: passes.Pass, pods: Sequence[Mapping[str, Any]], eviction: Mapping[str, str]) -> passes.Outcome:
    """Stop the evicted gang: the record says so first (the attempt holds no node any more), then the job is
    Queued again and its pods are deleted; `gate` gives the quota back once they are gone."""
    live = p.live
    assert live is not None
    passes.write_record(p, live.with_eviction(eviction).with_evicted())
    saved = ""
    if eviction.get("checkpointRequest"):
        answered = _answered(p, eviction)
        saved = "; the checkpoint asked for is saved" if answered else "; no checkpoint came in time"
    message = f"evicted by Kueue ({eviction.get('reason')}: {eviction.get('message')}){saved}; "
    message += "the gang stops and resumes from its newest checkpoint when admitted again"
    queue = wl.queue_of(p.job) or ""
    cond = p.condition("Ready", "False", "Evicted", message)
    cond = p.condition("Scheduled", "False", "Evicted", message, base=cond)
    cond = p.condition(QUEUED, "True", str(eviction.get("reason") or "Evicted"), message, base=cond)
    patch = {"phase": QUEUED, "message": message, "conditions": cond, "placement": None, "podsReady": 0}
    passes.write_status(p, {**patch, "network": None})
    p.event("Warning", "Evicted", f"{message} (LocalQueue {queue})")
    _delete(p, pods)
    if eviction.get("checkpointRequest"):  # answered or not, the next gang must not take it for a new one
        _ask_for_checkpoint(p, "")
    return passes.Outcome("evicted", wake_others=True, requeue_after=STOPPING_RECHECK_SECONDS)


def _stop_evicted_pods(p: passes.Pass) -> passes.Outcome | None:
    """An evicted gang's pods still going: delete them and wait (the quota is given back once they are gone)."""
    own = [pod for pod in reads.list_job_pods(p.session, p.namespace, p.name) if labels.owned_by(pod, p.uid)]
    if not own:
        return None
    _delete(p, own)
    return passes.Outcome("stopping-evicted-gang", requeue_after=STOPPING_RECHECK_SECONDS)


def _delete(p: passes.Pass, pods: Sequence[Mapping[str, Any]]) -> None:
    for pod in pods:
        if not (pod.get("metadata") or {}).get("deletionTimestamp"):
            writes.delete_pod(p.session, p.namespace, pod["metadata"]["name"])


# -- the end ------------------------------------------------------------------------------------------------


def finish(p: passes.Pass, phase: str, message: str = "") -> None:
    """The job ended (`phase` Succeeded or Failed): Finished on its Workload (once), so that Kueue returns the
    quota at once. Called when the job ends and again by every pass of a finished job, so a kill between the
    job's end and this write cannot keep the quota."""
    message = message or (p.status.get("message") or f"the ParallelJob {phase.lower()}")
    if not queued(p):
        return
    found = workloads.get(p.session, p.namespace, p.name)
    if found is None or not wl.owned_by(found, p.uid) or wl.is_true(found, wl.FINISHED):
        return
    workloads.patch_status(p.session, found, wl.finished_status(found, phase == "Succeeded", message))
