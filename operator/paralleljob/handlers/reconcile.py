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
   heldUntil), so the GPUs it frees are not handed to another job mid-restart.

A create the API refuses for good (4xx) fails the attempt like a broken gang (reason CreateFailed). A job
deleted during the pass ends it where a write finds the object gone (404, `writes.Gone`): the garbage
collector removes the rest, so that is an ordinary end, logged at debug level, not a failure to retry. Each
step ends with at most one status patch, skipped when nothing changed, so a quiet cluster sees no writes.
The `Outcome` tells the scheduler whether GPUs may have been freed (wake the waiting jobs) and when to look
at this job again without a watch event (a start timeout or a stuck deletion falling due).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from paralleljob import planning
from paralleljob.api import ResolvedJob, policy, validate_document
from paralleljob.api import types as api_types
from paralleljob.handlers import conditions, failures, gang, placement, queueing, start_failures, watchdog
from paralleljob.handlers import metrics as m
from paralleljob.handlers.nodes import OUT_OF_SERVICE_TAINT, NodeSnapshot
from paralleljob.k8s import events, reads, timestamps, writes
from paralleljob.k8s.session import Session
from paralleljob.manifests import children as child_objects
from paralleljob.manifests import configmap, labels, records, security
from paralleljob.manifests import pods as pod_manifests
from paralleljob.manifests import progress as progress_channel
from paralleljob.planning.inventory import TERMINAL_POD_PHASES, ClusterBuilder
from paralleljob.planning.usage import NodeUsage, UsageSnapshot
from paralleljob_contract.network import NetworkFailure

log = logging.getLogger(__name__)

# A job's terminal phases are named like a pod's.
TERMINAL = TERMINAL_POD_PHASES
ADMITTED, PLACED = "Admitted", "Placed"
# A waiting job also re-plans this often: GPUs held by pods of other workloads are freed without an event
# the operator watches (it watches only its own pods).
UNSCHEDULABLE_RECHECK_SECONDS = 60.0
# How often to look again while a deleted job's children wait for the garbage collector.
PREVIOUS_JOB_RECHECK_SECONDS = 2.0
# How often a job whose child name is held by a foreign object looks whether it is gone (no watch sees it).
NAME_CONFLICT_RECHECK_SECONDS = 30.0
NAME_CONFLICT = "NameConflict"
# Steps after which only an edit or a deletion changes anything: no resync.
RESTING_STEPS = frozenset({"gone", "finished", "succeeded", "failed", "invalid"})


@dataclasses.dataclass(frozen=True)
class Settings:
    """Operator-wide settings from the command line."""

    image: str = "ghcr.io/paralleljob/trainer:0.1.0"
    default_fabric: str = "auto"
    # NCCL variables every job gets unless its spec.network.ncclEnv sets the same name.
    default_nccl_env: tuple[tuple[str, str], ...] = ()
    namespaces: tuple[str, ...] | None = None  # None: all namespaces
    # A pod the scheduler refuses, or whose container cannot be created, fails its attempt after this long
    # (from the API server's times: `handlers.start_failures`).
    start_timeout_seconds: float = 600.0
    # A pod still ContainerCreating this long after being scheduled (a mount that fails) fails its attempt.
    container_creating_timeout_seconds: float = 1800.0
    # A pod whose image failed to pull this many times fails its attempt, blaming its node.
    image_pull_retries: int = 3
    # A pod stuck Terminating on a NotReady or deleted node is force-deleted this long after its deletion
    # deadline (deletionTimestamp): its kubelet cannot confirm that the containers stopped.
    force_delete_after_seconds: float = 120.0
    # What a job may ask of its pods, and what its pods run as: the administrator's, never the job's.
    admission_policy: policy.AdmissionPolicy = dataclasses.field(default_factory=policy.AdmissionPolicy)
    pod_security: security.PodSecurity = dataclasses.field(default_factory=security.PodSecurity)
    # A restarting gang keeps its old nodes (less the one blamed) from other jobs this long.
    restart_hold_seconds: float = 30.0
    # Every unfinished placed gang gets a pass this often without an event, so a watch event missed while a
    # watch restarted (a deleted pod, a lost node) cannot strand it; a pass over a quiet gang writes nothing.
    resync_seconds: float = 60.0
    # A NotReady node breaks its gang only after this long (Kubernetes' default not-ready toleration), unless
    # its pods fail first: a kubelet that misses a few heartbeats does not cost a gang restart.
    not_ready_grace_seconds: float = 300.0
    # Kueue (`handlers.queueing`): watch the Workloads of jobs labelled with a queue; before an evicted gang
    # stops, ask rank 0 for a checkpoint when its last one is older than this.
    kueue: bool = False
    kueue_checkpoint_grace_seconds: float = 300.0


@dataclasses.dataclass(frozen=True)
class NodeView:
    """What the watches know: the nodes that exist and those that are NotReady; for admission passes also the
    planner's node records, the usage index's totals and bound pods of the same moment, and the cluster
    builder that reuses unchanged records."""

    known: frozenset[str] = frozenset()
    not_ready: frozenset[str] = frozenset()
    snapshot: NodeSnapshot = dataclasses.field(default_factory=NodeSnapshot)
    usage: UsageSnapshot = dataclasses.field(default_factory=UsageSnapshot)
    builder: ClusterBuilder = dataclasses.field(default_factory=ClusterBuilder)
    # Every ParallelJob's reservations when the admission round began (None: not read). A pass plans against
    # these and the ones it reads itself, so GPUs released during a round go to the next round, in order.
    round_held: frozenset[planning.Reservation] | None = None
    # Failed image pulls per pod uid, counted from the job-pods watch (`start_failures.PullFailures`).
    pull_failures: Mapping[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class AdmissionRequest:
    """What orders a job in the admission queue: restarting or new, its PriorityClass, its creation time."""

    restarting: bool
    priority_class: str | None
    created: str


@dataclasses.dataclass(frozen=True)
class Outcome:
    """The step a pass took, whether GPUs may have been freed, and when to look at the job again."""

    step: str
    wake_others: bool = False
    requeue_after: float | None = None
    admission: AdmissionRequest | None = None  # set when the job waits for the admission queue
    # An admission that did not fit: the reservations it was planned against.
    held: tuple[planning.Reservation, ...] | None = None


@dataclasses.dataclass(frozen=True)
class Pass:
    """What one pass works with."""

    session: Session
    settings: Settings
    job: Mapping[str, Any]
    nodes: NodeView
    admit: bool = False
    # The latest attempt's record (`manifests.records`), from the job's ConfigMap: what every decision comes
    # from. None before the first admission (or when someone deleted the ConfigMap: the job has no attempt).
    record: records.AttemptRecord | None = None
    # The job's `-config` ConfigMap when another owner holds the name (a name conflict before any attempt).
    foreign_config: Mapping[str, Any] | None = None
    # Why the current spec is invalid while its running attempt is still supervised from its record.
    spec_problem: str = ""
    # Called right before an admission writes its attempt and placement: raises when the cluster-wide
    # admission lock (`k8s.admission_lock`) is no longer safely held; None without the lock.
    fence: Callable[[], None] | None = None

    @property
    def status(self) -> Mapping[str, Any]:
        return self.job.get("status") or {}

    @property
    def namespace(self) -> str:
        return str(self.job["metadata"]["namespace"])

    @property
    def name(self) -> str:
        return str(self.job["metadata"]["name"])

    @property
    def uid(self) -> str:
        return str(self.job["metadata"].get("uid"))

    @property
    def generation(self) -> int | None:
        found = self.job["metadata"].get("generation")
        return int(found) if found is not None else None

    @property
    def attempt(self) -> int:
        """The attempt the job is on (its restart count against backoffLimit), as its record says."""
        return self.record.next_attempt if self.record is not None else 0

    @property
    def excluded(self) -> list[str]:
        return list(self.record.excluded_nodes) if self.record is not None else []

    @property
    def live(self) -> records.AttemptRecord | None:
        """The record of the attempt whose pods are the job's current gang, when that attempt was admitted."""
        return self.record if self.record is not None and self.record.live else None

    @property
    def finished(self) -> bool:
        """Succeeded or Failed, as the record says."""
        return self.record is not None and self.record.outcome in TERMINAL

    @property
    def placed_nodes(self) -> list[str]:
        """The node of each node rank of the live attempt, from its record; empty when none is admitted."""
        return list(self.live.nodes) if self.live is not None else []

    @property
    def idle_phase(self) -> str:
        """The phase of a job between attempts: Restarting once it has restarted, else Pending."""
        return "Restarting" if self.attempt else "Pending"

    def condition(self, kind: str, status: str, reason: str, message: str, base: Any = None) -> list[dict[str, Any]]:
        current = self.status.get("conditions") if base is None else base
        return conditions.set_condition(current, kind, status, reason, message, self.generation)

    def event(self, kind: str, reason: str, message: str) -> None:
        events.post(self.session, self.job, kind, reason, message)


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
    if p.finished:
        return _rest(p)
    current, problems = _current_spec(p)
    live = p.live
    if current is None and live is None:
        return _invalid(p, problems)
    m.observe_phase(p.namespace, p.name, p.status.get("phase"))
    labelled = reads.list_job_pods(p.session, p.namespace, p.name)
    pods = [pod for pod in labelled if labels.owned_by(pod, p.uid)]
    stale = [pod for pod in pods if _attempt_of(pod) != p.attempt]
    if stale:
        return _drain(p, stale)
    previous = [pod for pod in labelled if labels.claim_of(pod, p.name, p.uid) == "namesake"]
    if previous:
        return _wait_for_previous_job(p, previous)
    if current is None:
        # An edit made the spec invalid: it gates only the next attempt; the running one is still supervised.
        p = dataclasses.replace(p, spec_problem=problems)
        _invalid_while_running(p)
    try:
        if not p.placed_nodes:
            assert current is not None  # no live attempt: an invalid spec returned above
            if p.foreign_config is not None:  # nothing can be admitted while someone else holds the ConfigMap
                name = labels.config_map_name(p.name)
                raise writes.NameConflict("ConfigMap", name, labels.holder_of(p.foreign_config))
            if _waits_on_conflict(p, pods):
                return Outcome("name-conflict", requeue_after=NAME_CONFLICT_RECHECK_SECONDS)
            # Kueue hook (handlers.queueing.gate): a job queued through Kueue waits, Queued, until its Workload is
            # admitted, then is planned inside the admitted flavours; any other job passes unchanged.
            gated = queueing.gate(p, current)
            if isinstance(gated, Outcome):
                return gated
            current = gated
            if not p.admit:
                return _awaiting_admission(p)
            view = _cluster_view(p, labelled)
            choice = p.record.layout_choice if p.record is not None else None
            if current.needs_layout:
                chosen = _choose_layout(p, current, view)
                if isinstance(chosen, Outcome):
                    return queueing.placed_or_released(p, chosen)  # Kueue hook: unplaceable gives the quota back
                current, choice = chosen
            return queueing.placed_or_released(p, _admit(p, current, view, choice))  # Kueue hook, as above
        if p.admit:
            # Placed meanwhile: the rest is supervision's, so the admission worker moves on at once.
            return Outcome("placed", requeue_after=0.0)
        pinned = _pinned_spec(p, current)
        # Kueue hook (handlers.queueing.supervise): Kueue evicted the Workload: checkpoint, stop, back to Queued.
        if (evicting := queueing.supervise(p, pinned, pods)) is not None:
            return evicting
        if _creating(p):
            return _create(p, pinned, pods)
    except writes.NameConflict as conflict:
        return _name_conflict(p, conflict)
    except writes.HeldByAnother as held:
        log.info("%s/%s waits for the garbage collector: %s", p.namespace, p.name, held)
        return Outcome("waiting-for-previous-job", requeue_after=PREVIOUS_JOB_RECHECK_SECONDS)
    except writes.Rejected as refused:
        state = gang.GangState("broken", 0, str(refused), cause=gang.CREATE_FAILED)
        judged = _pinned_spec(p, current) if p.live is not None else current
        assert judged is not None
        return _broken(p, judged, pods, state)
    return _watch(p, pinned, pods)


def _current_spec(p: Pass) -> tuple[ResolvedJob | None, str]:
    """The job's current spec resolved (its chosen layout applied), or None with why it is invalid: the API's
    rules, no `spec.template.env` name the operator sets, and the administrator's admission policy."""
    result = validate_document(p.job)
    problems = [problem.render() for problem in result.problems if problem.severity == "error"]
    if result.resolved is not None and result.ok:
        problems += pod_manifests.env_problems(result.resolved)
        problems += [found.render() for found in policy.check_policy(result.resolved.spec, p.settings.admission_policy)]
    if result.resolved is None or problems:
        return None, "; ".join(problems)
    resolved = result.resolved
    choice = p.record.layout_choice if p.record is not None else None
    if resolved.needs_layout and choice:
        # Chosen once, at first admission, and recorded: restarts re-place this layout, they never search again.
        resolved, layout_problems = placement.chosen_job(resolved, choice)
        if resolved is None:
            return None, "; ".join(problem.render() for problem in layout_problems)
    return resolved, ""


def _pinned_spec(p: Pass, current: ResolvedJob | None) -> ResolvedJob:
    """The spec the live attempt was admitted with, from its record: its pods are all built from it, and it is
    supervised by it, whatever was edited since. The current spec only for a job without a record."""
    if p.record is None:
        if current is None:
            raise ValueError("the job has no attempt record and its spec is invalid")
        return current
    if current is not None and records.same_spec(p.record, api_types.spec_to_dict(current.spec)):
        return current  # not edited since admission (every pass but the few after an edit): validated once
    result = validate_document(records.pinned_document(p.record, p.name, p.namespace))
    if result.resolved is None or not result.ok:
        problems = "; ".join(problem.render() for problem in result.problems if problem.severity == "error")
        raise ValueError(f"the pinned spec of attempt {p.record.attempt} no longer validates: {problems}")
    return result.resolved


@dataclasses.dataclass(frozen=True)
class ClusterView:
    """What an admission plans against, from the watches: node records, the usage totals of bound pods (less
    this job's own departed pods), other jobs' reservations, and the builder that reuses the node records."""

    nodes: NodeSnapshot
    usage: Mapping[str, NodeUsage]
    held: list[planning.Reservation]
    builder: ClusterBuilder


def _cluster_view(p: Pass, labelled: Sequence[Mapping[str, Any]]) -> ClusterView:
    # Every job's record of the cluster, whatever namespaces this operator manages: a job another operator
    # placed (one per team, each watching its own namespaces) holds its nodes all the same. Read from the API
    # under the admission lock, so the placement another operator wrote just before is in it.
    found = reads.list_reserving_config_maps(p.session)
    usage = p.nodes.usage.without(_own_pods_gone(p, labelled))
    held = records.reservations_of(found, exclude=(p.namespace, p.name), bound=usage.bound)
    if p.nodes.round_held is not None:
        holder = f"{p.namespace}/{p.name}"
        earlier = sorted((r for r in p.nodes.round_held if r.holder != holder), key=lambda r: (r.node, r.holder))
        held = list(dict.fromkeys([*held, *earlier]))  # a reservation in both counts once
    return ClusterView(p.nodes.snapshot, usage.usage, held, p.nodes.builder)


def _choose_layout(
    p: Pass, template: ResolvedJob, view: ClusterView
) -> tuple[ResolvedJob, Mapping[str, Any]] | Outcome:
    """First admission of a job that gives a GPU budget: choose the layout on the free nodes, and say so
    (status.layoutChoice, the LayoutChosen condition and an Event) before placing it; returns the job and the
    choice, which the attempt record keeps, so that restarts place the same layout."""
    try:
        found = placement.choose_layout(template, view.nodes, view.usage, view.held, view.builder)
    except Exception as error:
        raise failures.PlanningFailed(str(error)) from error
    if found.job is None:
        cond = p.condition("Valid", "True", "Validated", "the spec is valid")
        cond = p.condition("LayoutChosen", "False", "NoLayout", found.message, base=cond)
        if write_status(p, {"phase": "Pending", "message": found.message, "conditions": cond}):
            p.event("Warning", "NoLayout", found.message)
        return Outcome("no-layout", requeue_after=UNSCHEDULABLE_RECHECK_SECONDS)
    cond = p.condition("LayoutChosen", "True", "LayoutChosen", found.message)
    write_status(p, {"layoutChoice": found.record, "layout": found.job.layout, "conditions": cond})
    p.event("Normal", "LayoutChosen", found.message)
    return found.job, found.record


def _attempt_of(pod: Mapping[str, Any]) -> int:
    return int(pod["metadata"].get("labels", {}).get(labels.ATTEMPT_LABEL, -1))


def _terminating(pod: Mapping[str, Any]) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


def _delete(p: Pass, pods: Sequence[Mapping[str, Any]]) -> None:
    """Delete gracefully; a pod already terminating is left to its kubelet (a second delete changes nothing)."""
    for pod in pods:
        if not _terminating(pod):
            writes.delete_pod(p.session, p.namespace, pod["metadata"]["name"])


def _lost_nodes(p: Pass, names: Collection[str | None]) -> dict[str, str]:
    """Of these nodes, those NotReady or deleted, with why. The Node watch answers; a node it has not seen
    (it may not have listed yet) is looked up with one list before being called deleted."""
    wanted = {name for name in names if name}
    lost = {name: "is NotReady" for name in wanted if name in p.nodes.not_ready}
    unknown = wanted - p.nodes.known
    if unknown:
        existing = {name for name in unknown if reads.node_exists(p.session, name)}
        lost.update({name: "no longer exists" for name in unknown - existing})
    return lost


def _wait_for_previous_job(p: Pass, previous: Sequence[Mapping[str, Any]]) -> Outcome:
    """Pods of a deleted job of the same name still hold our names: the garbage collector deletes them, and one
    stuck Terminating on a lost node is force-deleted as our own would be (the single-node rule included);
    the status and one Event say which pods the job waits for."""
    waiting = _drain(p, previous)
    stuck = [pod for pod in previous if _terminating(pod)]
    named = stuck or list(previous)
    names = ", ".join(f"{pod['metadata']['name']} (node {gang.node_of(pod)})" for pod in named[:5])
    more = f" and {len(named) - 5} more" if len(named) > 5 else ""
    how = "stuck Terminating" if stuck else "still there"
    message = f"waiting for {len(previous)} pods of a deleted job of the same name to go ({how}): {names}{more}"
    said = str(p.status.get("message") or "").startswith("waiting for")
    patch = {"message": message} if p.live is not None else {"phase": p.idle_phase, "message": message}
    if write_status(p, patch) and not said:
        p.event("Normal", "WaitingForPreviousJob", message)
    recheck = min(waiting.requeue_after or PREVIOUS_JOB_RECHECK_SECONDS, PREVIOUS_JOB_RECHECK_SECONDS)
    return Outcome("waiting-for-previous-job", requeue_after=recheck)


def _past_grace(p: Pass, lost: Mapping[str, str]) -> tuple[dict[str, str], float | None]:
    """The lost nodes that break the gang now: deleted ones, and NotReady ones past the grace period (counted
    from the Ready condition's transition as the API server reports it); with when the next one falls due."""
    grace = p.settings.not_ready_grace_seconds
    broken: dict[str, str] = {}
    due: float | None = None
    for node, why in lost.items():
        if node not in p.nodes.not_ready:
            broken[node] = why
            continue
        age = timestamps.seconds_since(p.nodes.snapshot.not_ready_since.get(node), p.session.server_now()) or 0.0
        if age >= grace:
            broken[node] = f"has been NotReady for {age:.0f}s (grace {grace:.0f}s)"
        else:
            due = min(due if due is not None else grace, grace - age + 0.5)
    return broken, due


def _drain(p: Pass, stale: Sequence[Mapping[str, Any]]) -> Outcome:
    """Delete the pods of older attempts; force only those whose node is lost, once overdue."""
    _delete(p, stale)
    terminating = [pod for pod in stale if _terminating(pod)]
    if not terminating:
        return Outcome("deleting-old-generation")
    lost = _lost_nodes(p, [gang.node_of(pod) for pod in terminating])
    force_after = p.settings.force_delete_after_seconds
    recheck = force_after
    for pod in terminating:
        node = gang.node_of(pod)
        if node not in lost:
            continue  # its kubelet is alive: the pod goes when its containers have stopped
        if _only_pod_of_gang(pod) and node in p.nodes.not_ready and node not in p.nodes.snapshot.out_of_service:
            # Were its node only partitioned, the pod would still run, and the next generation would write to
            # the same checkpoint folder beside it. As a StatefulSet does, wait for the node to be deleted or
            # tainted out-of-service.
            _stuck_terminating(p, pod, node)
            recheck = min(recheck, p.settings.resync_seconds)
            continue
        since = timestamps.seconds_since(pod["metadata"]["deletionTimestamp"], p.session.server_now())
        overdue = (since or 0.0) - force_after
        if overdue >= 0:
            log.warning("force-deleting %s: node %s is lost", pod["metadata"]["name"], gang.node_of(pod))
            writes.delete_pod(p.session, p.namespace, pod["metadata"]["name"], force=True)
        else:
            recheck = min(recheck, -overdue + 0.5)
    note = start_failures.lingering_note(terminating, lost, p.session.server_now(), force_after)
    if note and write_status(p, {"message": note}):
        p.event("Warning", "StuckTerminating", note)
    return Outcome("deleting-old-generation", requeue_after=recheck)


def _only_pod_of_gang(pod: Mapping[str, Any]) -> bool:
    """Whether the pod was its gang's only one (its gang-size label; a pod without it is treated as alone)."""
    found = str((pod["metadata"].get("labels") or {}).get(labels.GANG_SIZE_LABEL) or "")
    return not found.isdigit() or int(found) <= 1


def _stuck_terminating(p: Pass, pod: Mapping[str, Any], node: str | None) -> None:
    message = (
        f"pod {pod['metadata']['name']} is stuck Terminating on NotReady node {node}; it is the gang's only pod, "
        f"so it is not force-deleted: delete the node, or taint it {OUT_OF_SERVICE_TAINT}=nodeshutdown:NoExecute "
        "once it is known to be down"
    )
    if write_status(p, {"message": message}):
        p.event("Warning", "StuckTerminating", message)


def write_status(p: Pass, patch: Mapping[str, Any]) -> bool:
    """Patch status when something in `patch` differs from it; True when written. Every write records the
    generation acted on (the spec is immutable, so this is the generation the job was admitted with)."""
    current = p.status
    patch = {**patch, "observedGeneration": p.generation}
    if p.spec_problem and patch.get("message"):
        patch["message"] = f"{patch['message']}{INVALID_NOTE}{p.spec_problem}"
    changed = any(
        not conditions.same(current.get(key), value) if key == "conditions" else current.get(key) != value
        for key, value in patch.items()
    )
    if changed:
        writes.patch_job_status(p.session, p.namespace, p.name, patch)
        if isinstance(p.job, dict):  # the rest of the pass builds on what it wrote (its conditions above all)
            merged = {**current, **patch}
            p.job["status"] = {key: value for key, value in merged.items() if value is not None}
        if "phase" in patch:
            m.observe_phase(p.namespace, p.name, patch["phase"])
    return changed


def _invalid(p: Pass, message: str) -> Outcome:
    """Valid=False with no admitted attempt (never admitted, or a gang restart into an invalid spec): Pending,
    holding no reservation (a restart's hold is released from its record), the old generation's pods deleted;
    an Event."""
    released = p.record is not None and p.record.reserving
    if p.record is not None:  # between attempts: the old generation may still be going
        pods = [pod for pod in reads.list_job_pods(p.session, p.namespace, p.name) if labels.owned_by(pod, p.uid)]
        if stale := [pod for pod in pods if _attempt_of(pod) != p.attempt]:
            _drain(p, stale)
        if released:
            _write_record(p, p.record.without_hold())
    cond = p.condition("Valid", "False", "InvalidSpec", message)
    patch = {"phase": "Pending", "message": f"invalid spec: {message}", "conditions": cond, "placement": None}
    if write_status(p, {**patch, "heldNodes": None, "heldUntil": None}):
        p.event("Warning", "InvalidSpec", message)
    return Outcome("invalid", wake_others=released)


RUNNING_CONTINUES = "; the running attempt continues, and nothing new starts until the spec is fixed"
INVALID_NOTE = f"{RUNNING_CONTINUES}; invalid spec: "


def _invalid_while_running(p: Pass) -> None:
    """Valid=False on a job whose attempt is live: an edit broke the spec (the fields the CRD lets change). The
    attempt goes on under its pinned spec, supervised as before (completion, failures, restarts); only the
    next attempt waits for a valid spec. One Event when the condition turns False."""
    cond = p.condition("Valid", "False", "InvalidSpec", p.spec_problem)
    # write_status adds the note to the gang's own message, as it does on every write of this pass.
    gang_message = str(p.status.get("message") or "").split(INVALID_NOTE)[0] or "supervising the running attempt"
    if write_status(p, {"message": gang_message, "conditions": cond}):
        p.event("Warning", "InvalidSpec", f"{p.spec_problem}{RUNNING_CONTINUES}")


def _rest(p: Pass) -> Outcome:
    """A finished job, first of all: its end stands whatever its spec says now. An edit afterwards changes only
    the Valid condition (False while the spec is invalid, True again once it is fixed), and the pods still
    holding GPUs are deleted."""
    current, problems = _current_spec(p)
    if current is None:
        cond = p.condition("Valid", "False", "InvalidSpec", problems)
    else:
        cond = p.condition("Valid", "True", "Validated", "the spec is valid")
    write_status(p, {"conditions": cond})
    m.observe_phase(p.namespace, p.name, p.status.get("phase"))
    pods = [pod for pod in reads.list_job_pods(p.session, p.namespace, p.name) if labels.owned_by(pod, p.uid)]
    _finished(p, pods)
    return Outcome("finished")


def _finished(p: Pass, pods: Sequence[Mapping[str, Any]], phase: str | None = None) -> None:
    """Delete the pods still holding GPUs; a finished job keeps its Succeeded pods for their logs."""
    ended = phase or (p.record.outcome if p.record is not None else None)
    keep = {"Succeeded"} if ended == "Succeeded" else set()
    _delete(p, [pod for pod in pods if (pod.get("status") or {}).get("phase") not in {"Failed", *keep}])


def admission_request(p: Pass) -> AdmissionRequest:
    """What places the job in the admission queue: whether its record says it restarted, its PriorityClass,
    its creation time."""
    template = (p.job.get("spec") or {}).get("template") or {}
    return AdmissionRequest(
        restarting=p.attempt > 0,
        priority_class=template.get("priorityClassName") if isinstance(template, Mapping) else None,
        created=str(p.job["metadata"].get("creationTimestamp") or ""),
    )


def _awaiting_admission(p: Pass) -> Outcome:
    """Hand the job to the admission queue; a restarting gang whose hold ran out lets the others in (its record
    no longer holds the old nodes)."""
    request = admission_request(p)
    remaining = _hold_remaining(p)
    if remaining is None and p.record is not None and p.record.held_nodes:
        _write_record(p, p.record.without_hold())
        write_status(p, {"heldNodes": None, "heldUntil": None})
        return Outcome("awaiting-admission", wake_others=True, admission=request)
    return Outcome("awaiting-admission", requeue_after=remaining, admission=request)


def _hold_remaining(p: Pass) -> float | None:
    """Seconds until a restarting gang's hold on its old nodes ends, as its record says; None when it holds
    none."""
    ends = p.record.hold_ends() if p.record is not None else None
    if ends is None:
        return None
    left = (ends - datetime.datetime.now(datetime.UTC)).total_seconds()
    return left + 0.5 if left > 0 else None


def _own_pods_gone(p: Pass, labelled: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """This job's pods that the usage index still counts but the API, read just now, no longer has: the index
    learns of a deletion a moment after the API, and a restarting gang must not wait on its own old pods."""
    named = re.compile(rf"{re.escape(p.name)}-\d+")
    present = {pod["metadata"]["name"] for pod in labelled}
    return [
        (namespace, name)
        for namespace, name in p.nodes.usage.claims
        if namespace == p.namespace and name.startswith(p.name) and named.fullmatch(name) and name not in present
    ]


def _admit(p: Pass, resolved: ResolvedJob, view: ClusterView, choice: Mapping[str, Any] | None) -> Outcome:
    """Plan the attempt on the cluster's free GPUs and write its ConfigMap with its record (the placement that
    reserves them: `choice` is the layout search's, for a job that gave a GPU budget), replacing the previous
    attempt's in one write."""
    try:
        outcome = placement.plan(resolved, view.nodes, view.usage, view.held, p.excluded, view.builder)
    except Exception as error:
        raise failures.PlanningFailed(str(error)) from error
    m.PLANNING.observe(outcome.seconds)
    if outcome.plan is None:
        return dataclasses.replace(_unschedulable(p, outcome.reason), held=tuple(view.held))
    name = labels.config_map_name(p.name)
    previous = reads.get_config_map(p.session, p.namespace, name)
    claim = labels.claim_of(previous, p.name, p.uid) if previous is not None else None
    if claim == "foreign":
        raise writes.NameConflict("ConfigMap", name, labels.holder_of(previous or {}))
    if claim == "namesake":
        return Outcome("waiting-for-previous-job", requeue_after=PREVIOUS_JOB_RECHECK_SECONDS)
    record = records.AttemptRecord(
        attempt=p.attempt,
        spec=api_types.spec_to_dict(resolved.spec),
        image=p.settings.image,
        nodes=tuple(entry["node"] for entry in sorted(outcome.plan["nodes"], key=lambda e: int(e["nodeRank"]))),
        excluded_nodes=tuple(p.excluded),
        gpus_per_node=int(outcome.plan["ranksPerNode"]),
        layout_choice=choice,
    )
    attempt = child_objects.build_attempt(
        p.job,
        resolved,
        outcome.plan,
        outcome.nodes,
        attempt=p.attempt,
        default_fabric=p.settings.default_fabric,
        default_nccl_env=dict(p.settings.default_nccl_env),
        record=record,
    )
    if refusal := attempt.refusal(resolved):
        # The job ends before any pod: its record says so first, so that no later pass plans it again.
        _write_attempt(p, previous, records.stamp(attempt.config_map, record.with_outcome("Failed")))
        return _refused_network(p, refusal)
    if p.fence is not None:
        p.fence()  # the reservations read above are still the cluster's: no other operator has planned since
    _write_attempt(p, previous, attempt.config_map)
    if write_status(p, _admitted_status(p, resolved, outcome.plan, attempt)):
        # What the RDMA request could not know (an unknown plugin kind, no RDMA resource on the nodes).
        for note in attempt.network.get("warnings") or ():
            p.event("Warning", "NetworkWarning", note)
    return Outcome("admitted")


def _write_attempt(p: Pass, previous: Mapping[str, Any] | None, config_map: Mapping[str, Any]) -> None:
    """Write the attempt's ConfigMap: created, or the previous attempt's replaced in one write, so that the job
    always has a record once it had one (a pass killed between a delete and a create would forget its
    restarts)."""
    if previous is None:
        writes.create(p.session, config_map)
    else:
        writes.replace_config_map(p.session, previous, config_map)


def _waits_on_conflict(p: Pass, pods: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a job whose record says a name conflict released its attempt still waits: until the pods it had
    created are gone, and while the object named in the conflict is still someone else's."""
    if p.record is None or not p.record.conflict:
        return False
    if pods:
        _delete(p, pods)
        return True
    named = writes.NameConflict.named_in(p.record.conflict)
    if named is None:
        return False
    held = writes.read(p.session, named[0], named[1], p.namespace)
    return held is not None and labels.claim_of(held, p.name, p.uid) == "foreign"


def _name_conflict(p: Pass, conflict: writes.NameConflict) -> Outcome:
    """A child name is taken by someone else's object: release the reservation (the record says so first, then
    this attempt's pods go), say which object in Scheduled=False and a Warning Event, and look again later."""
    message = str(conflict)
    if p.live is not None:
        _write_record(p, p.live.with_conflict(message))
    cond = p.condition("Scheduled", "False", NAME_CONFLICT, message)
    patch = {"phase": p.idle_phase, "message": message, "conditions": cond, "placement": None, "podsReady": 0}
    if write_status(p, patch):
        p.event("Warning", NAME_CONFLICT, message)
    # This pass may have created some of the pods already: list them again.
    _delete(p, [pod for pod in reads.list_job_pods(p.session, p.namespace, p.name) if labels.owned_by(pod, p.uid)])
    return Outcome("name-conflict", wake_others=True, requeue_after=NAME_CONFLICT_RECHECK_SECONDS)


def _unschedulable(p: Pass, reason: str) -> Outcome:
    cond = p.condition("Valid", "True", "Validated", "the spec is valid")
    cond = p.condition("Scheduled", "False", "Unschedulable", reason, base=cond)
    if write_status(p, {"phase": p.idle_phase, "message": reason, "conditions": cond, "placement": None}):
        p.event("Warning", "Unschedulable", reason)
    # A restarting gang's pass when its hold runs out lets the jobs waiting behind it in.
    recheck = min(UNSCHEDULABLE_RECHECK_SECONDS, _hold_remaining(p) or UNSCHEDULABLE_RECHECK_SECONDS)
    return Outcome("unschedulable", requeue_after=recheck)


def _placement_entries(p: Pass, plan: Mapping[str, Any]) -> list[dict[str, Any]]:
    entries = []
    for entry in plan["nodes"]:
        ranks = entry["ranks"]
        stages = sorted({coord["pipe"] for coord in entry.get("coords", [])})
        entries.append(
            {
                "nodeRank": entry["nodeRank"],
                "node": entry["node"],
                "ranks": f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0]),
                "stages": stages,
                "pod": labels.pod_name(p.name, entry["nodeRank"]),
            }
        )
    return entries


def _admitted_status(
    p: Pass, resolved: ResolvedJob, plan: Mapping[str, Any], attempt: child_objects.Attempt
) -> dict[str, Any]:
    cond = p.condition("Valid", "True", "Validated", "the spec is valid")
    message = f"placed {len(plan['nodes'])} node ranks; creating pods"
    cond = p.condition("Scheduled", "True", ADMITTED, message, base=cond)
    return {
        "phase": p.idle_phase,
        "message": message,
        "conditions": cond,
        "layout": resolved.layout,
        "worldSize": resolved.world_size,
        "nodes": len(plan["nodes"]),
        "gpusPerNode": plan["ranksPerNode"],
        "axisOrder": ",".join(plan["axisOrder"]),
        "placement": _placement_entries(p, plan),
        # The same computation the ConfigMap records and the pods are built from.
        "ncclEnv": attempt.nccl_env,
        "restarts": p.attempt,
        "podsReady": 0,
        "heldNodes": None,
        "heldUntil": None,
    }


def _creating(p: Pass) -> bool:
    """Whether the live attempt's pods are still to be created, as its record says."""
    return p.live is not None and not p.live.placed


def _create(p: Pass, resolved: ResolvedJob, pods: Sequence[Mapping[str, Any]]) -> Outcome:
    """Create the live attempt's children from its ConfigMap and record (the pinned spec, image and nodes),
    then mark the record placed: from then on a missing pod is a lost one, never created again."""
    found = reads.get_config_map(p.session, p.namespace, labels.config_map_name(p.name))
    if found is None or not labels.owned_by(found, p.uid) or configmap.attempt_of(found) != p.attempt:
        # The plan of this attempt is lost (someone deleted the ConfigMap): plan again.
        write_status(p, {"placement": None})
        return Outcome("replanning")
    nodes = p.placed_nodes
    if len(nodes) != configmap.plan_of(found).nodes:
        write_status(p, {"placement": None})
        return Outcome("replanning")
    image = p.live.image if p.live is not None else p.settings.image
    built = child_objects.build_children(
        p.job, resolved, found, nodes, image=image, pod_security=p.settings.pod_security
    )
    existing = {pod["metadata"]["name"] for pod in pods}
    for obj in [built.service, built.progress, *built.rbac]:
        writes.create(p.session, obj)
    writes.create_all(p.session, [pod for pod in built.pods if pod["metadata"]["name"] not in existing])
    if p.record is not None:
        _write_record(p, p.record.with_placed())
    message = f"{len(built.pods)} pods created on {len(nodes)} nodes; fabric {built.fabric}"
    cond = p.condition("Scheduled", "True", PLACED, message)
    if write_status(p, {"conditions": cond, "message": message}):
        hosts = ", ".join(f"{rank}->{node}" for rank, node in enumerate(nodes[:8]))
        more = f" (+{len(nodes) - 8} more)" if len(nodes) > 8 else ""
        p.event("Normal", "Placed", f"layout {resolved.layout}, fabric {built.fabric}: {hosts}{more}")
    return Outcome("created")


def _write_record(p: Pass, record: records.AttemptRecord) -> None:
    """Replace the attempt record in the job's ConfigMap, with the labels that go with it: the first write of
    every decision it holds."""
    name, data = labels.config_map_name(p.name), {records.RECORD_FILE: record.to_json()}
    writes.patch_config_map(p.session, p.namespace, name, data, records.labels_of(record))


def _watch(p: Pass, resolved: ResolvedJob, pods: Sequence[Mapping[str, Any]]) -> Outcome:
    placed = p.placed_nodes
    nodes = [*placed, *(gang.node_of(pod) for pod in pods)]
    planned = dict(enumerate(placed))
    lost, due = _past_grace(p, _lost_nodes(p, nodes))
    limits = start_failures.Limits(
        p.settings.start_timeout_seconds, p.settings.container_creating_timeout_seconds, p.settings.image_pull_retries
    )
    at, pulls = p.session.server_now(), p.nodes.pull_failures
    state = gang.judge(pods, len(placed), lost, limits=limits, at=at, planned_nodes=planned, pull_failures=pulls)
    if due is not None and state.verdict in ("running", "starting"):
        state = dataclasses.replace(state, recheck_in=min(due, state.recheck_in if state.recheck_in else due))
    handlers: dict[str, Callable[[Pass, ResolvedJob, Sequence[Mapping[str, Any]], gang.GangState], Outcome]] = {
        "succeeded": _succeeded,
        "broken": _broken,
        "running": _running,
        "starting": _starting,
    }
    return handlers[state.verdict](p, resolved, pods, state)


def _succeeded(p: Pass, resolved: ResolvedJob, pods: Sequence[Mapping[str, Any]], state: gang.GangState) -> Outcome:
    message = f"training finished after {p.attempt} restarts"
    step, folder = _rank0_report(p, resolved).get("lastCheckpointStep"), pod_manifests.job_folder(resolved)
    if step is not None and folder is not None:
        # The trainer always saves the last step; the Event tells where the job's result lies.
        message += f"; last checkpoint step {step} in {folder}/global_step{step}"
    cond = p.condition("Ready", "False", "Finished", message)
    cond = p.condition("Succeeded", "True", "TrainingFinished", message, base=cond)
    return _end(p, pods, "Succeeded", message, cond, ("Normal", "Completed"))


def _broken(p: Pass, resolved: ResolvedJob, pods: Sequence[Mapping[str, Any]], state: gang.GangState) -> Outcome:
    if state.cause != gang.BROKEN:
        p.event("Warning", state.cause, state.reason)
    if state.network is not None:
        return _network_failed(p, pods, state, state.network)
    limit = resolved.spec.failure_policy.backoff_limit
    if p.attempt >= limit:
        return _fail(p, pods, state, limit)
    return _restart(p, pods, state, limit)


def _scheduled_reason(state: gang.GangState) -> str:
    return gang.CREATE_FAILED if state.cause == gang.CREATE_FAILED else "GangRestart"


def _fail(p: Pass, pods: Sequence[Mapping[str, Any]], state: gang.GangState, limit: int) -> Outcome:
    message = f"{state.reason}; backoffLimit {limit} reached after {p.attempt} restarts"
    cond = p.condition("Ready", "False", "GangFailed" if state.cause == gang.BROKEN else state.cause, state.reason)
    if state.cause == gang.CREATE_FAILED:
        cond = p.condition("Scheduled", "False", gang.CREATE_FAILED, state.reason, base=cond)
    cond = p.condition("Failed", "True", "BackoffLimitExceeded", message, base=cond)
    return _end(p, pods, "Failed", message, cond, ("Warning", "Failed"))


def _refused_network(p: Pass, reason: str) -> Outcome:
    """spec.network.verify: fail, and the placed nodes cannot give the pods an RDMA device: Failed before
    any pod starts (NetworkReady=False, NoRdmaResource)."""
    message = f"{reason}; spec.network.verify is fail, so no pod was created"
    cond = p.condition("Valid", "True", "Validated", "the spec is valid")
    cond = p.condition("NetworkReady", "False", "NoRdmaResource", reason, base=cond)
    cond = p.condition("Failed", "True", gang.NETWORK, message, base=cond)
    return _end(p, [], "Failed", message, cond, ("Warning", "Failed"))


def _network_failed(
    p: Pass, pods: Sequence[Mapping[str, Any]], state: gang.GangState, network: NetworkFailure
) -> Outcome:
    """The network is not what the job planned: Failed at once, with the reason in its condition. Not a gang
    restart: the same spec on the same nodes fails the same way, so the restarts are kept for real faults."""
    message = f"{state.reason}; not restarted: fix spec.network or the nodes, then create the job again"
    cond = p.condition(network.condition, "False", network.reason, network.message)
    cond = p.condition("Ready", "False", gang.NETWORK, state.reason, base=cond)
    cond = p.condition("Failed", "True", gang.NETWORK, message, base=cond)
    return _end(p, pods, "Failed", message, cond, ("Warning", "Failed"))


def _end(
    p: Pass, pods: Sequence[Mapping[str, Any]], phase: str, message: str, cond: Any, event: tuple[str, str]
) -> Outcome:
    """A terminal phase: one status write and its Event, then the record (so a kill between the two leaves a
    live record, and the next pass judges the same pods and ends the job again), the remaining pods deleted,
    waiting jobs woken."""
    patch = {"phase": phase, "message": message, "conditions": cond, "podsReady": 0}
    # An invalid edit no longer gates anything once the job has ended: the Valid condition alone says so.
    ended = dataclasses.replace(p, spec_problem="")
    if write_status(ended, {**patch, "completionTime": timestamps.now()}):
        p.event(event[0], event[1], message)
    queueing.finish(p, phase, message)  # Kueue hook: Finished on the Workload returns its quota at once
    if p.live is not None:
        _write_record(p, p.live.with_outcome(phase))
    _finished(p, pods, phase)
    return Outcome(phase.lower(), wake_others=True)


def _restart(p: Pass, pods: Sequence[Mapping[str, Any]], state: gang.GangState, limit: int) -> Outcome:
    excluded = p.excluded
    for node in (state.node, *state.blamed):
        if node and node not in excluded:
            excluded = [*excluded, node]
    restarts = p.attempt + 1
    message = f"gang restart {restarts}/{limit}: {state.reason}; resuming from the last checkpoint"
    held, until = _hold(p, state)
    if p.live is not None:
        _write_record(p, p.live.with_restart(state.reason, excluded, into=restarts, held=held, until=until))
    cond = p.condition("Ready", "False", state.cause, state.reason)
    cond = p.condition("Scheduled", "False", _scheduled_reason(state), message, base=cond)
    # The next attempt verifies its own network (it may run on other nodes).
    patch = {"phase": "Restarting", "message": message, "conditions": cond, "restarts": restarts, "network": None}
    hold = {"heldNodes": held or None, "heldUntil": until if held else None}
    write_status(p, {**patch, "placement": None, "podsReady": 0, "excludedNodes": excluded or None, **hold})
    m.GANG_RESTARTS.inc()
    p.event("Warning", "Restarting", message)
    _delete(p, pods)
    return Outcome("restarting", wake_others=True)


def _hold(p: Pass, state: gang.GangState) -> tuple[list[str], str | None]:
    """The restarting gang's hold: its placed nodes less the one blamed, until restart_hold_seconds from now."""
    blamed = {state.node, *state.blamed}
    kept = [node for node in p.placed_nodes if node not in blamed]
    if not kept or p.settings.restart_hold_seconds <= 0:
        return [], None
    until = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=p.settings.restart_hold_seconds)
    return kept, timestamps.format_time(until)


def _running(p: Pass, resolved: ResolvedJob, pods: Sequence[Mapping[str, Any]], state: gang.GangState) -> Outcome:
    """Every pod runs. The record says since when (the first pass to see it records the time, and rank 0's
    network verdict once it has come), so Started is posted once per attempt and startTime never moves."""
    live = p.live
    assert live is not None  # a placed gang
    watched = live.network_report is None or resolved.spec.failure_policy.progress_timeout_seconds is not None
    reported = _rank0_report(p, resolved) if watched else {}
    network = live.network_report or reported.get("network")
    started = live.started_at or timestamps.now()
    if live.started_at is None or network != live.network_report:
        _write_record(p, live.with_started(started, network))
    message = f"all {state.ready} pods running"
    cond = _network_conditions(p, p.condition("Ready", "True", "AllPodsRunning", message), network)
    patch = {"phase": "Running", "message": message, "conditions": cond, "podsReady": state.ready}
    before = conditions.find(p.status.get("conditions"), "NetworkVerified")
    if write_status(p, {**patch, "startTime": started}):
        _network_event(p, cond, before)
    if live.started_at is None:
        p.event("Normal", "Started", f"{resolved.layout} on {state.ready} pods, attempt {p.attempt}")
    verdict = _progress_verdict(p, resolved, started, reported.get("progress"))
    if verdict.hung:
        hung = gang.GangState("broken", state.ready, verdict.message, cause=watchdog.NO_PROGRESS)
        return _broken(p, resolved, pods, hung)
    return Outcome("running", requeue_after=_resync(p, verdict.recheck_in, state.recheck_in))


def _rank0_report(p: Pass, resolved: ResolvedJob) -> dict[str, Any]:
    """What rank 0 reported in its progress ConfigMap, validated (`manifests.progress.status_of`): progress,
    lastCheckpointStep and the network verdict; empty without a ConfigMap of this job's."""
    found = reads.get_config_map(p.session, p.namespace, labels.progress_config_map_name(p.name))
    if found is None or not labels.owned_by(found, p.uid):
        return {}
    return progress_channel.status_of(found, resolved.spec.training.steps)


def _progress_verdict(
    p: Pass, resolved: ResolvedJob, running_since: str, reported: Mapping[str, Any] | None
) -> watchdog.Verdict:
    """The watchdog's verdict on rank 0's reported progress (only when the job sets a timeout), for the gang
    running since `running_since` (this attempt's, from its record)."""
    timeout = resolved.spec.failure_policy.progress_timeout_seconds
    if timeout is None:
        return watchdog.Verdict(False)
    return watchdog.judge_progress(reported, running_since, timeout, p.session.server_now())


def _resync(p: Pass, *due: float | None) -> float:
    """When to look at a gang again without an event: when something falls due, at most every resync period."""
    return min([p.settings.resync_seconds, *(after for after in due if after is not None)])


VERIFIED_STATUSES = ("True", "False", "Unknown")


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
