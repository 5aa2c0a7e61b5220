"""What one reconcile pass decides to write, as one value: a `Decision`.

Pure data, no I/O. A reconcile step (`handlers.steps`) turns what the pass observed (`handlers.observed`) into a
Decision; `k8s.apply` is the one code that writes it (an admitted attempt's ConfigMap, the status patch and its
Events, the attempt record, the pods to delete gracefully or force), and `handlers.reconcile` turns what is left
(the step's name, whether GPUs may have been freed, when to look again) into the scheduler's `Outcome`. It lives below `k8s` so that the module
that writes it may import it; the steps build it without importing `k8s`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from paralleljob.manifests.records import AttemptRecord


@dataclasses.dataclass(frozen=True)
class Event:
    """A core/v1 Event on the job, for `kubectl describe pj`: `type` is Normal or Warning."""

    type: str
    reason: str
    message: str


@dataclasses.dataclass(frozen=True)
class NodeLabel:
    """One label set on a Node for the cluster's administrators (the operator's --slow-node-label)."""

    node: str
    key: str
    value: str


@dataclasses.dataclass(frozen=True)
class WorkloadWrite:
    """One write of the job's Kueue Workload (`handlers.queueing`): `create` the Workload `body`; or a merge patch
    at the resourceVersion of `found` (the Workload as the pass read it), of its status (`release`: the quota given
    back, `finish`: Finished) or its metadata (`adopt`: the job made the controller of its prebuilt Workload)."""

    verb: str  # create, release, finish or adopt
    body: Mapping[str, Any]
    found: Mapping[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class AttemptWrite:
    """An admission's attempt ConfigMap (its plan, network and record, whose placement reserves the GPUs): created,
    or the one read in the pass (`replaces`, the previous attempt's) made into it with one write at that one's
    resourceVersion, so that the job always has a record once it had one. `fenced`: the admission lock's fence is
    asked right before it (the reservations the plan was made around are still the cluster's)."""

    config_map: Mapping[str, Any]
    replaces: Mapping[str, Any] | None = None
    fenced: bool = True


@dataclasses.dataclass(frozen=True)
class Decision:
    """Everything one step of a pass writes, and what it asks of the scheduler.

    `creates` are the job's children to create (a Service, RBAC, pods; the pods in growing batches); `attempt`
    is an admission's attempt ConfigMap (`AttemptWrite`), written after them and before the rest; `status`
    is the merge patch of the job's status subresource (None: nothing changed, no write); `events` go with it (a
    step asks for an Event only when its status patch is written, as a person reads them together); `record`
    replaces the attempt record in the job's `-config` ConfigMap; `deletes` are the names of the job's pods to
    delete with their grace period, `force_deletes` those removed at once (their kubelet is gone). The writer
    (`k8s.apply`) writes them in this order: the children first, so that a refused create leaves the record as
    it was (the refusal is the next decision's input); then the record, then the status, so that a status a
    reader sees is never ahead of the record the next pass acts on (a pass killed between the two leaves a
    record whose status `handlers.reported` writes again); the pods last, once the record says why they go.

    `record_last` turns the record's place around for a decision that ends the job (Succeeded or Failed): its
    status and Events first, then the record, so that a pass killed between them leaves a live record, and the
    next pass judges the same pods and ends the job again. A record written first would leave an ended job whose
    status never says so (the finished step writes only Valid). `node_labels` are set after the Events.

    `workloads` are the job's Kueue Workload writes (`WorkloadWrite`), written right after the children;
    `checkpoint_request` (not None) is the value written to the `checkpointRequest` key of rank 0's progress
    ConfigMap, last of all (an evicted gang asked for a checkpoint, "" once it stopped).

    `first` are decisions written whole before this one, in order (`before`): the earlier parts of one pass's
    decision that a kill between them must leave written, with their Events, as separate writes did (supervision's
    running status, in-place restarts counted, a broken gang's cause, before the restart or the end that
    follows)."""

    step: str
    _: dataclasses.KW_ONLY  # every write by name: a Decision is read as a table of what it writes
    creates: tuple[Mapping[str, Any], ...] = ()
    attempt: AttemptWrite | None = None
    status: Mapping[str, Any] | None = None
    events: tuple[Event, ...] = ()
    record: AttemptRecord | None = None
    deletes: tuple[str, ...] = ()
    force_deletes: tuple[str, ...] = ()
    node_labels: tuple[NodeLabel, ...] = ()
    workloads: tuple[WorkloadWrite, ...] = ()
    checkpoint_request: str | None = None
    record_last: bool = False
    first: tuple[Decision, ...] = ()
    requeue_after: float | None = None
    wake_others: bool = False

    @property
    def writes_nothing(self) -> bool:
        """Whether applying it makes no API call (a quiet pass over a quiet job)."""
        return not (
            self.creates
            or self.attempt
            or self.status
            or self.events
            or self.record
            or self.deletes
            or self.force_deletes
            or self.node_labels
            or self.workloads
            or self.checkpoint_request is not None
            or self.first
        )

    def before(self, later: Decision) -> Decision:
        """This decision written whole, then `later` (`first`): for two parts of one pass's decision where a kill
        between them must leave the earlier written, record, status and Events, as two writes would. What the pass
        asks of the scheduler is the later's, with the GPUs either frees."""
        parts = (*self.first, dataclasses.replace(self, first=()), *later.first)
        return dataclasses.replace(
            later,
            first=tuple(part for part in parts if not part.writes_nothing),
            wake_others=self.wake_others or later.wake_others,
        )

    def then(self, later: Decision) -> Decision:
        """This decision's writes followed by `later`'s, written as one: the status patches merged (the later's
        keys win), the Events, pods and node labels of both, the later's record (with its place, `record_last`),
        and the parts either must write whole before it (`first`, this one's then the later's); what the pass asks
        of the scheduler is the later's (its step and when to look again), since the later decided knowing the
        first."""
        status = {**(self.status or {}), **(later.status or {})} or None
        return Decision(
            step=later.step,
            creates=(*self.creates, *later.creates),
            attempt=later.attempt if later.attempt is not None else self.attempt,
            status=status,
            events=(*self.events, *later.events),
            record=later.record if later.record is not None else self.record,
            deletes=tuple(dict.fromkeys((*self.deletes, *later.deletes))),
            force_deletes=tuple(dict.fromkeys((*self.force_deletes, *later.force_deletes))),
            node_labels=tuple(dict.fromkeys((*self.node_labels, *later.node_labels))),
            workloads=(*self.workloads, *later.workloads),
            checkpoint_request=self.checkpoint_request
            if later.checkpoint_request is None
            else later.checkpoint_request,
            record_last=later.record_last if later.record is not None else self.record_last,
            first=(*self.first, *later.first),
            requeue_after=later.requeue_after,
            wake_others=self.wake_others or later.wake_others,
        )
