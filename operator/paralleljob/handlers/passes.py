"""What one reconcile pass works with (`Pass`: the job, its attempt record, the watches' view, the operator's
`Settings`) and what it returns (`Outcome`), with the writes every step shares: the one status patch
(`write_status`, skipped when nothing changed), the attempt record, deleting the job's pods, and ending the
job in a terminal phase. The steps (`handlers.steps`) import this module, never each other; `handlers.reconcile`
runs them in order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from paralleljob import defaults, planning
from paralleljob.api import policy
from paralleljob.handlers import conditions
from paralleljob.handlers import metrics as m
from paralleljob.handlers.nodes import NodeSnapshot
from paralleljob.k8s import events, reads, timestamps, writes
from paralleljob.k8s.session import Session
from paralleljob.manifests import labels, records, security
from paralleljob.planning.inventory import TERMINAL_POD_PHASES, ClusterBuilder
from paralleljob.planning.usage import UsageSnapshot

# A job's terminal phases are named like a pod's.
TERMINAL = TERMINAL_POD_PHASES
ADMITTED, PLACED = "Admitted", "Placed"
# How often to look again while a deleted job's children wait for the garbage collector.
PREVIOUS_JOB_RECHECK_SECONDS = 2.0
# How often a job whose child name is held by a foreign object looks whether it is gone (no watch sees it).
NAME_CONFLICT_RECHECK_SECONDS = 30.0


@dataclasses.dataclass(frozen=True)
class Settings:
    """Operator-wide settings from the command line; the defaults are `paralleljob.defaults`'."""

    image: str = defaults.TRAINER_IMAGE
    default_fabric: str = defaults.FABRIC
    # NCCL variables every job gets unless its spec.network.ncclEnv sets the same name.
    default_nccl_env: tuple[tuple[str, str], ...] = ()
    namespaces: tuple[str, ...] | None = None  # None: all namespaces
    # A pod the scheduler refuses, or whose container cannot be created, fails its attempt after this long
    # (from the API server's times: `handlers.start_failures`).
    start_timeout_seconds: float = defaults.START_TIMEOUT_SECONDS
    # A pod still ContainerCreating this long after being scheduled (a mount that fails) fails its attempt.
    container_creating_timeout_seconds: float = defaults.CONTAINER_CREATING_TIMEOUT_SECONDS
    # A pod whose image failed to pull this many times fails its attempt, blaming its node.
    image_pull_retries: int = defaults.IMAGE_PULL_RETRIES
    # A pod stuck Terminating on a NotReady or deleted node is force-deleted this long after its deletion
    # deadline (deletionTimestamp): its kubelet cannot confirm that the containers stopped.
    force_delete_after_seconds: float = defaults.FORCE_DELETE_AFTER_SECONDS
    # What a job may ask of its pods, and what its pods run as: the administrator's, never the job's.
    admission_policy: policy.AdmissionPolicy = dataclasses.field(default_factory=policy.AdmissionPolicy)
    pod_security: security.PodSecurity = dataclasses.field(default_factory=security.PodSecurity)
    # A restarting gang keeps its old nodes (less the one blamed) from other jobs this long.
    restart_hold_seconds: float = defaults.RESTART_HOLD_SECONDS
    # Every unfinished placed gang gets a pass this often without an event, so a watch event missed while a
    # watch restarted (a deleted pod, a lost node) cannot strand it; a pass over a quiet gang writes nothing.
    resync_seconds: float = defaults.RESYNC_SECONDS
    # A NotReady node breaks its gang only after this long (Kubernetes' default not-ready toleration), unless
    # its pods fail first: a kubelet that misses a few heartbeats does not cost a gang restart.
    not_ready_grace_seconds: float = defaults.NOT_READY_GRACE_SECONDS
    # Kueue (`handlers.queueing`): watch the Workloads of jobs labelled with a queue; before an evicted gang
    # stops, ask rank 0 for a checkpoint when its last one is older than this.
    kueue: bool = False
    kueue_checkpoint_grace_seconds: float = defaults.KUEUE_CHECKPOINT_GRACE_SECONDS


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


RUNNING_CONTINUES = "; the running attempt continues, and nothing new starts until the spec is fixed"


INVALID_NOTE = f"{RUNNING_CONTINUES}; invalid spec: "


def write_record(p: Pass, record: records.AttemptRecord) -> None:
    """Replace the attempt record in the job's ConfigMap, with the labels that go with it: the first write of
    every decision it holds."""
    name, data = labels.config_map_name(p.name), {records.RECORD_FILE: record.to_json()}
    writes.patch_config_map(p.session, p.namespace, name, data, records.labels_of(record))


def attempt_of(pod: Mapping[str, Any]) -> int:
    return int(pod["metadata"].get("labels", {}).get(labels.ATTEMPT_LABEL, -1))


def is_terminating(pod: Mapping[str, Any]) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


def deleting_for(p: Pass, pod: Mapping[str, Any]) -> float:
    """Seconds since the pod's deletion was asked (its deletionTimestamp less its grace period). A pod on a lost
    node waits `force_delete_after_seconds` from the ask, not from that deadline: the node's kubelet honours no
    grace period, so waiting it out only delays the gang (30 s of a spare's replacement, measured)."""
    meta = pod["metadata"]
    since = timestamps.seconds_since(meta.get("deletionTimestamp"), p.session.server_now()) or 0.0
    return since + float(meta.get("deletionGracePeriodSeconds") or 0)


def delete_pods(p: Pass, pods: Sequence[Mapping[str, Any]]) -> None:
    """Delete gracefully; a pod already terminating is left to its kubelet (a second delete changes nothing)."""
    for pod in pods:
        if not is_terminating(pod):
            writes.delete_pod(p.session, p.namespace, pod["metadata"]["name"])


def lost_nodes(p: Pass, names: Collection[str | None]) -> dict[str, str]:
    """Of these nodes, those NotReady or deleted, with why. The Node watch answers; a node it has not seen
    (it may not have listed yet) is looked up with one list before being called deleted."""
    wanted = {name for name in names if name}
    lost = {name: "is NotReady" for name in wanted if name in p.nodes.not_ready}
    unknown = wanted - p.nodes.known
    if unknown:
        existing = {name for name in unknown if reads.node_exists(p.session, name)}
        lost.update({name: "no longer exists" for name in unknown - existing})
    return lost


def end(
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
    if p.live is not None:
        write_record(p, p.live.with_outcome(phase))
    delete_finished_pods(p, pods, phase)
    return Outcome(phase.lower(), wake_others=True)


def delete_finished_pods(p: Pass, pods: Sequence[Mapping[str, Any]], phase: str | None = None) -> None:
    """Delete the pods still holding GPUs; a finished job keeps its Succeeded pods for their logs."""
    ended = phase or (p.record.outcome if p.record is not None else None)
    keep = {"Succeeded"} if ended == "Succeeded" else set()
    delete_pods(p, [pod for pod in pods if (pod.get("status") or {}).get("phase") not in {"Failed", *keep}])
