"""What one reconcile pass read, as one frozen value (`Observed`), and the pure helpers every decision uses on
it: a condition set at a moment, and the status patch that is written only when it changes something.

Pure: `handlers.reconcile` fills an Observed from the API and the watches (`observe`), the steps
(`handlers.steps`) decide from it without importing `paralleljob.k8s`, and `k8s.apply` writes their Decision.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from paralleljob.api import ResolvedJob
from paralleljob.handlers import conditions
from paralleljob.handlers.placement import ClusterView
from paralleljob.manifests import kueue_topology, labels, records, timestamps
from paralleljob.manifests import workload as wl
from paralleljob.planning.inventory import TERMINAL_POD_PHASES

RUNNING_CONTINUES = "; the running attempt continues, and nothing new starts until the spec is fixed"
INVALID_NOTE = f"{RUNNING_CONTINUES}; invalid spec: "
# How often to look again while a deleted job's children wait for the garbage collector.
PREVIOUS_JOB_RECHECK_SECONDS = 2.0
# How often a job whose child name is held by a foreign object looks whether it is gone (no watch sees it).
NAME_CONFLICT_RECHECK_SECONDS = 30.0


class JobFields:
    """What a pass reads off its job and its attempt record: shared by `Observed` and by `passes.Pass`."""

    job: Mapping[str, Any]
    record: records.AttemptRecord | None

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


@dataclasses.dataclass(frozen=True)
class QueueSeen:
    """What the Kueue step (`steps.kueue`) decides from, for a job queued through Kueue (`handlers.queueing`
    reads it): the LocalQueue, whether the operator runs with Kueue, the job's Workload as read, and only what the
    decision at hand uses besides: the priority and topology request of a Workload to create, the admitted
    ResourceFlavors, the TopologyAssignment's nodes (or the rule they break) and those Kueue is to replace."""

    name: str
    enabled: bool = True
    workload: Mapping[str, Any] | None = None
    priority: wl.Priority | None = None
    topology_request: Mapping[str, Any] | None = None
    flavors: tuple[Mapping[str, Any], ...] = ()
    assigned: kueue_topology.AssignedNodes | None = None
    awaiting: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Observed(JobFields):
    """The job, its attempt record, its pods and what the watches say of their nodes, at one moment."""

    job: Mapping[str, Any]
    # The latest attempt's record (`manifests.records`): what every decision comes from. None before the first
    # admission (or when someone deleted the ConfigMap: the job has no attempt).
    record: records.AttemptRecord | None = None
    # The job's current spec resolved and checked (`handlers.specs.current_spec`), or None with why not.
    spec: ResolvedJob | None = None
    spec_problems: str = ""
    # The spec the live attempt was admitted with (`handlers.specs.pinned_spec`), once the pass has it.
    pinned: ResolvedJob | None = None
    # The job's own `-config` ConfigMap, as read with the record (the attempt's plan and network).
    config_map: Mapping[str, Any] | None = None
    # The job's own pods (its uid in their ownerReference), and those of a deleted job of the same name that
    # the garbage collector has not removed yet.
    pods: tuple[Mapping[str, Any], ...] = ()
    namesake: tuple[Mapping[str, Any], ...] = ()
    # Every pod labelled with the job's name, whoever owns it (what the usage index is checked against).
    labelled: tuple[Mapping[str, Any], ...] = ()
    # Of the nodes of the terminating pods above, those NotReady or deleted, with why; the watch's NotReady and
    # out-of-service nodes.
    lost: Mapping[str, str] = dataclasses.field(default_factory=dict)
    not_ready: frozenset[str] = frozenset()
    out_of_service: frozenset[str] = frozenset()
    # Whether the object named in the record's name conflict is still someone else's (read only then).
    conflict_held: bool = False
    # Why the current spec is invalid while its running attempt is still supervised from its record.
    spec_problem: str = ""
    # A write this pass made that the API refused because a child's name is someone else's (`writes.NameConflict`):
    # the refusal is observed, with the pods read again, and decided on like anything else read.
    refused: str = ""
    # The nodes the Node watch knows, and its slim Node dicts by name (their labels price a spare's move).
    known: frozenset[str] = frozenset()
    watched_nodes: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    # For the spare step (`steps.replacement`, `observe.for_spares`): the live gang's nodes and spares that break
    # it now, with why (supervision's judgement, and those whose pod vanished, looked up afresh), and the gang's
    # lost-peer evidence as weighed for the pass (`handlers.lost_peers`).
    lost_now: Mapping[str, str] = dataclasses.field(default_factory=dict)
    peers_lost: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # Rank 0's last reported checkpoint step (the progress ConfigMap), read by an admission pass over a shrunk
    # job only once its full size fits again (`observe.last_checkpoint`); None when it reported none.
    checkpoint_step: int | None = None
    # For supervision and the spare step (`observe.for_gang`, read once for both): of the live gang's nodes, its
    # spares and its pods' nodes, those NotReady or deleted, with why (a node the watch does not know is looked
    # up once); when each NotReady node turned so (the Ready condition's transition, the server's clock); the
    # failed image pulls per pod uid (the job-pods watch); and when the gang's lost-peer evidence next falls due.
    gang_nodes_lost: Mapping[str, str] = dataclasses.field(default_factory=dict)
    not_ready_since: Mapping[str, str] = dataclasses.field(default_factory=dict)
    pull_failures: Mapping[str, int] = dataclasses.field(default_factory=dict)
    peers_recheck_in: float | None = None
    # For the admission step (`observe.for_admission`): what it plans against (the watches' nodes and usage, every
    # other job's reservations), and the job's `-config` ConfigMap read again under the admission lock (its
    # previous attempt's, or a deleted namesake's), which the new attempt's replaces; `spec` is then the spec to
    # plan, narrowed to Kueue's admitted flavours for a queued job.
    cluster: ClusterView | None = None
    admission_config_map: Mapping[str, Any] | None = None
    # The job's own progress ConfigMap (rank 0's report), read only when supervision's decision uses it
    # (`steps.supervision.reads_report`, `observe.with_report`); None when not read, or not the job's.
    progress: Mapping[str, Any] | None = None
    # For a job queued through Kueue, what the Kueue step decides from (`handlers.queueing`); None otherwise.
    queue: QueueSeen | None = None

    @property
    def live(self) -> records.AttemptRecord | None:
        """The record of the attempt whose pods are the job's current gang, when that attempt was admitted."""
        return self.record if self.record is not None and self.record.live else None

    @property
    def finished(self) -> bool:
        """Succeeded or Failed, as the record says."""
        return self.record is not None and self.record.outcome in TERMINAL_POD_PHASES

    @property
    def idle_phase(self) -> str:
        """The phase of a job between attempts: Restarting once it has restarted, else Pending."""
        return "Restarting" if self.attempt else "Pending"

    @property
    def stale(self) -> tuple[Mapping[str, Any], ...]:
        """The job's pods of an older attempt than its record's."""
        return tuple(pod for pod in self.pods if attempt_of(pod) != self.attempt)

    def with_status(self, patch: Mapping[str, Any] | None) -> Observed:
        """The same observation with a status patch already written (for a decision that follows another)."""
        if not patch:
            return self
        merged = {**self.status, **patch}
        status = {key: value for key, value in merged.items() if value is not None}
        return dataclasses.replace(self, job={**self.job, "status": status})


def attempt_of(pod: Mapping[str, Any]) -> int:
    return int(pod["metadata"].get("labels", {}).get(labels.ATTEMPT_LABEL, -1))


def is_terminating(pod: Mapping[str, Any]) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


def deleting_for(pod: Mapping[str, Any], now: datetime.datetime) -> float:
    """Seconds since the pod's deletion was asked (its deletionTimestamp less its grace period). A pod on a lost
    node waits `force_delete_after_seconds` from the ask, not from that deadline: the node's kubelet honours no
    grace period, so waiting it out only delays the gang (30 s of a spare's replacement, measured)."""
    meta = pod["metadata"]
    since = timestamps.seconds_since(meta.get("deletionTimestamp"), now) or 0.0
    return since + float(meta.get("deletionGracePeriodSeconds") or 0)


def pod_name(pod: Mapping[str, Any]) -> str:
    return str(pod["metadata"]["name"])


def pods_holding_gpus(pods: Sequence[Mapping[str, Any]], ended: str | None) -> tuple[str, ...]:
    """The pods of a job that ended `ended` to delete (the finished step, and supervision ending the job): those
    still holding GPUs and not already terminating; a Succeeded job keeps its Succeeded pods for their logs."""
    keep = {"Failed", "Succeeded"} if ended == "Succeeded" else {"Failed"}
    return tuple(
        pod_name(pod) for pod in pods if (pod.get("status") or {}).get("phase") not in keep and not is_terminating(pod)
    )


def condition(
    seen: Observed,
    kind: str,
    status: str,
    reason: str,
    message: str,
    now: datetime.datetime,
    base: Any = None,
) -> list[dict[str, Any]]:
    """The job's conditions (or `base`) with `kind` set; a transition is dated `now`."""
    current = seen.status.get("conditions") if base is None else base
    at = now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return conditions.set_condition(current, kind, status, reason, message, seen.generation, at=at)


def status_patch(seen: Observed, patch: Mapping[str, Any]) -> dict[str, Any] | None:
    """The status patch to write, or None when nothing in `patch` differs from the job's status: every write
    records the generation acted on, and while an edit made the spec invalid, a message says so."""
    current = seen.status
    full = {**patch, "observedGeneration": seen.generation}
    if seen.spec_problem and full.get("message"):
        full["message"] = f"{full['message']}{INVALID_NOTE}{seen.spec_problem}"
    changed = any(
        not conditions.same(current.get(key), value) if key == "conditions" else current.get(key) != value
        for key, value in full.items()
    )
    return full if changed else None
