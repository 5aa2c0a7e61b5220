"""Write one reconcile decision (`manifests.decisions.Decision`): the one place a pass's step writes.

Called by `handlers.reconcile` after a step decided. In order: the children to create (one at a time, then the pods in
growing batches, `writes.create_all`: the job's own copy already there (409) is an outcome; a name held by someone else
or a create refused for good raises, and the pass turns that refusal into the input of its next decision, before
anything else of this one is written); the Kueue Workload's writes (`Decision.workloads`); an admission's attempt
ConfigMap (`Decision.attempt`: created, or the previous attempt's made into it in one write, right after the admission
lock's `fence`); the attempt record (its ConfigMap's `attempt.json` and labels); the status patch (one merge patch of
the status subresource) and the Events that go with it; the Node labels (a merge patch of one label; a Node gone, 404,
is an outcome); the pods deleted gracefully, then those force-deleted; last, a checkpoint request in rank 0's progress
ConfigMap (`Decision.checkpoint_request`). A decision that ends the job (`Decision.record_last`) writes its record after
the labels instead, right before the pods. A decision's `first` parts are written whole before it, each in this order.
Idempotent as every write here is: a pod already gone (404) is an outcome, not an error; a patch whose job, ConfigMap or
Workload is gone raises `writes.Gone`, which the pass turns into its ordinary end. A job dict given as a `dict` is
updated with the status written, so the rest of a pass builds on it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from paralleljob.k8s import events, workloads, writes
from paralleljob.k8s.session import Session
from paralleljob.manifests import labels, records
from paralleljob.manifests.decisions import AttemptWrite, Decision, WorkloadWrite
from paralleljob_contract import progress

log = logging.getLogger(__name__)


def apply(
    session: Session, job: Mapping[str, Any], decision: Decision, fence: Callable[[], None] | None = None
) -> None:
    """Write `decision` for `job` (as read at the start of the pass). `fence` (the admission lock's, for an
    admission pass) raises when the lock is no longer safely held: it is asked right before a fenced attempt's
    ConfigMap, the write that reserves GPUs."""
    for part in decision.first:  # the earlier parts of the pass's decision, each whole, in order
        apply(session, job, part, fence)
    namespace, name = str(job["metadata"]["namespace"]), str(job["metadata"]["name"])
    for child in decision.creates:
        if child["kind"] != "Pod":
            writes.create(session, child)
    writes.create_all(session, [child for child in decision.creates if child["kind"] == "Pod"])
    for write in decision.workloads:
        write_workload(session, write)
    if decision.attempt is not None:
        write_attempt(session, decision.attempt, fence)
    # The record is the operator's truth and the status its report: the record goes first, so a status a reader
    # sees (Placed, say) is never ahead of the record the next pass acts on. A job's end goes the other way round
    # (`record_last`): its live record makes the next pass end the job again if this one is killed in between.
    if decision.record is not None and not decision.record_last:
        write_record(session, namespace, name, decision.record)
    if decision.status:
        writes.patch_job_status(session, namespace, name, decision.status)
        _merge_status(job, decision.status)
    for event in decision.events:
        events.post(session, job, event.type, event.reason, event.message)
    for label in decision.node_labels:
        writes.label_node(session, label.node, label.key, label.value)
    if decision.record is not None and decision.record_last:
        write_record(session, namespace, name, decision.record)
    for pod in decision.deletes:
        writes.delete_pod(session, namespace, pod)
    for pod in decision.force_deletes:
        log.warning("force-deleting pod %s/%s: its node is lost", namespace, pod)
        writes.delete_pod(session, namespace, pod, force=True)
    if decision.checkpoint_request is not None:
        data = {progress.CHECKPOINT_REQUEST: decision.checkpoint_request}
        writes.patch_config_map(session, namespace, labels.progress_config_map_name(name), data, {})


def write_workload(session: Session, write: WorkloadWrite) -> None:
    """One write of the job's Kueue Workload: created, or patched at the resourceVersion the pass read."""
    if write.verb == "create":
        workloads.create(session, write.body)
        return
    assert write.found is not None, write.verb
    if write.verb == "adopt":
        workloads.patch_metadata(session, write.found, write.body)
        return
    workloads.patch_status(session, write.found, write.body)
    if write.verb == "release":
        metadata = write.found.get("metadata") or {}
        log.info("Workload %s/%s gave its Kueue quota back", metadata.get("namespace"), metadata.get("name"))


def write_attempt(session: Session, attempt: AttemptWrite, fence: Callable[[], None] | None = None) -> None:
    """Write an admission's attempt ConfigMap: created, or the previous attempt's replaced in one write, so that
    the job always has a record once it had one (a pass killed between a delete and a create would forget its
    restarts)."""
    if attempt.fenced and fence is not None:
        fence()  # the reservations read for the plan are still the cluster's: no other operator has planned since
    if attempt.replaces is None:
        writes.create(session, attempt.config_map)
    else:
        writes.replace_config_map(session, attempt.replaces, attempt.config_map)


def write_record(session: Session, namespace: str, job: str, record: records.AttemptRecord) -> None:
    """Replace the attempt record in the job's ConfigMap, with the labels that go with it."""
    data = {records.RECORD_FILE: record.to_json()}
    writes.patch_config_map(session, namespace, labels.config_map_name(job), data, records.labels_of(record))


def _merge_status(job: Mapping[str, Any], patch: Mapping[str, Any]) -> None:
    if isinstance(job, dict):
        merged = {**(job.get("status") or {}), **patch}
        job["status"] = {key: value for key, value in merged.items() if value is not None}
