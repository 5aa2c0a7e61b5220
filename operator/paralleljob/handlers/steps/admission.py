"""Step 5, admission: a job without a placement. A supervision pass hands it to the admission queue
(`handlers.admission_queue`) and stops; the admission pass (`admit=True`, only ever run by the queue's one
worker) plans with gang admission from the watches' node records and usage index (no cluster-wide pod or node
LIST), choosing the layout first for a job that gives a GPU budget (once: the record keeps the choice), around
the reservations in every job's record. Unschedulable -> Pending + Scheduled=False; else the ConfigMap is
written (the plan and network of this attempt, and its record, whose placement reserves the GPUs) -> Admitted.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from paralleljob import planning
from paralleljob.api import ResolvedJob, validate_document
from paralleljob.api import types as api_types
from paralleljob.api.sections.deepspeed import zero_stage
from paralleljob.api.validation import validate_job
from paralleljob.handlers import failures, gang, placement
from paralleljob.handlers import metrics as m
from paralleljob.handlers.nodes import NodeSnapshot
from paralleljob.handlers.observed import PREVIOUS_JOB_RECHECK_SECONDS
from paralleljob.handlers.passes import (
    ADMITTED,
    AdmissionRequest,
    Outcome,
    Pass,
    end,
    write_record,
    write_status,
)
from paralleljob.k8s import reads, writes
from paralleljob.manifests import children as child_objects
from paralleljob.manifests import labels, records
from paralleljob.planning import layout_search, shrink
from paralleljob.planning.inventory import ClusterBuilder
from paralleljob.planning.usage import NodeUsage

# A waiting job also re-plans this often: GPUs held by pods of other workloads are freed without an event
# the operator watches (it watches only its own pods).
UNSCHEDULABLE_RECHECK_SECONDS = 60.0


def admission_request(p: Pass) -> AdmissionRequest:
    """What places the job in the admission queue: whether its record says it restarted, its PriorityClass,
    its creation time."""
    template = (p.job.get("spec") or {}).get("template") or {}
    return AdmissionRequest(
        restarting=p.attempt > 0,
        priority_class=template.get("priorityClassName") if isinstance(template, Mapping) else None,
        created=str(p.job["metadata"].get("creationTimestamp") or ""),
    )


def awaiting_admission(p: Pass) -> Outcome:
    """Hand the job to the admission queue; a restarting gang whose hold ran out lets the others in (its record
    no longer holds the old nodes)."""
    request = admission_request(p)
    remaining = _hold_remaining(p)
    if remaining is None and p.record is not None and p.record.held_nodes:
        write_record(p, p.record.without_hold())
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


@dataclasses.dataclass(frozen=True)
class ClusterView:
    """What an admission plans against, from the watches: node records, the usage totals of bound pods (less
    this job's own departed pods), other jobs' reservations, and the builder that reuses the node records."""

    nodes: NodeSnapshot
    usage: Mapping[str, NodeUsage]
    held: list[planning.Reservation]
    builder: ClusterBuilder


def cluster_view(p: Pass, labelled: Sequence[Mapping[str, Any]]) -> ClusterView:
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


def _own_pods_gone(p: Pass, labelled: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """This job's pods that the usage index still counts but the API, read just now, no longer has: the index
    learns of a deletion a moment after the API, and a restarting gang must not wait on its own old pods."""
    present = {pod["metadata"]["name"] for pod in labelled}
    return departed_pods(p.namespace, p.name, p.nodes.usage.claims, present)


def departed_pods(
    namespace: str, job: str, claims: Iterable[tuple[str, str]], present: Collection[str]
) -> list[tuple[str, str]]:
    """Of the usage index's pods, the job's rank pods (`<job>-<nodeRank>` in its namespace) not in `present`."""
    named = re.compile(rf"{re.escape(job)}-\d+")
    return [
        (their_namespace, name)
        for their_namespace, name in claims
        if their_namespace == namespace and name.startswith(job) and named.fullmatch(name) and name not in present
    ]


def choose_layout(p: Pass, template: ResolvedJob, view: ClusterView) -> tuple[ResolvedJob, Mapping[str, Any]] | Outcome:
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


def admit(p: Pass, resolved: ResolvedJob, view: ClusterView, choice: Mapping[str, Any] | None) -> Outcome:
    """Plan the attempt on the cluster's free GPUs and write its ConfigMap with its record (the placement that
    reserves them: `choice` is the layout search's, for a job that gave a GPU budget), replacing the previous
    attempt's in one write."""
    try:
        outcome = placement.plan(resolved, view.nodes, view.usage, view.held, p.excluded, view.builder)
        if outcome.plan is None and (shrunk := _shrunk(p, resolved, view, outcome.reason)) is not None:
            resolved, outcome = shrunk
        elif outcome.plan is None and (replanned := _relayout(p, resolved, view, outcome.reason)) is not None:
            resolved, outcome = replanned
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
        nodes=tuple(entry.node for entry in sorted(outcome.plan.nodes, key=lambda entry: entry.node_rank)),
        excluded_nodes=tuple(p.excluded),
        gpus_per_node=outcome.plan.ranks_per_node,
        layout_choice=choice,
        spare_nodes=tuple(outcome.plan.spare_names()),
        grow_restarts=p.record.grow_restarts if p.record is not None else 0,
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


def _shrunk(
    p: Pass, resolved: ResolvedJob, view: ClusterView, reason: str
) -> tuple[ResolvedJob, placement.Outcome] | None:
    """spec.failurePolicy.allowDataShrink: a restarting gang that no longer fits at its own DP resumes at the
    largest smaller DP that places (`planning.shrink`: TP, PP and the global batch kept); None when it may not
    or none places. Once the full size fits again it grows back at its next checkpoint (`steps.replacement`)."""
    if p.attempt == 0 or not resolved.spec.failure_policy.allow_data_shrink:
        return None
    for smaller in shrink.shrunk_jobs(resolved):
        found = placement.plan(smaller, view.nodes, view.usage, view.held, p.excluded, view.builder)
        if found.plan is not None:
            before, after = resolved.batch, smaller.batch
            p.event(
                "Warning",
                "DataShrunk",
                f"{resolved.layout} does not fit on the nodes left ({reason}); resuming "
                f"as {smaller.layout}: data parallelism {resolved.data} -> {smaller.data}, gradient accumulation "
                f"{before.gradient_accumulation_steps} -> {after.gradient_accumulation_steps}, global batch "
                f"{after.train_batch_size} kept; it grows back at a checkpoint once the full size fits",
            )
            return smaller, found
    return None


def _relayout(
    p: Pass, resolved: ResolvedJob, view: ClusterView, reason: str
) -> tuple[ResolvedJob, placement.Outcome] | None:
    """spec.failurePolicy.allowRelayout: a restarting budget job that no longer fits resumes at the best layout
    the planner finds for fewer whole nodes (`planning.shrink.relayout_budgets`, largest first), pipeline and
    tensor included, the global batch kept; the trainer re-cuts the checkpoint. None when it may not or none
    places. It grows back to its chosen layout at its next checkpoint once that fits (`steps.replacement`)."""
    template = validate_document(p.job).resolved
    if p.attempt == 0 or template is None or template.budget is None:
        return None
    if not template.spec.failure_policy.allow_relayout or p.record is None:
        return None
    stage = zero_stage(resolved.spec)
    if stage == 0 and resolved.spec.model.precision != "fp32":
        return None  # the trainer cannot re-cut bf16/fp16 optimizer state saved at ZeRO 0 (docs/trainer.md)
    template = _with_zero_stage(template, stage)  # the checkpoint's optimizer state is of this stage
    full = layout_search.budget_of(template)
    assert full is not None
    for budget in shrink.relayout_budgets(full, p.record.gpus_per_node):
        chosen = placement.choose_layout(template, view.nodes, view.usage, view.held, view.builder, budget)
        if chosen.job is None:
            continue
        found = placement.plan(chosen.job, view.nodes, view.usage, view.held, p.excluded, view.builder)
        if found.plan is not None:
            p.event(
                "Warning",
                "Relayout",
                f"{resolved.layout} does not fit on the nodes left ({reason}); resuming at {chosen.job.layout} "
                f"(PP x TP x DP) on {budget.gpus} GPUs, the planner's best layout for them, global batch "
                f"{chosen.job.batch.train_batch_size} kept; the checkpoint is re-cut, and the job grows back to "
                f"{resolved.layout} at a checkpoint once it fits",
            )
            return chosen.job, found
    return None


def _with_zero_stage(template: ResolvedJob, stage: int) -> ResolvedJob:
    """The budget job with its ZeRO stage pinned, so that the layout search keeps it."""
    deepspeed = dict(template.spec.deepspeed or {})
    zero = deepspeed.get("zero_optimization")
    deepspeed["zero_optimization"] = {**(zero if isinstance(zero, dict) else {}), "stage": stage}
    spec = dataclasses.replace(template.spec, deepspeed=deepspeed)
    return validate_job(dataclasses.replace(template.job, spec=spec)).resolved or template


def _write_attempt(p: Pass, previous: Mapping[str, Any] | None, config_map: Mapping[str, Any]) -> None:
    """Write the attempt's ConfigMap: created, or the previous attempt's replaced in one write, so that the job
    always has a record once it had one (a pass killed between a delete and a create would forget its
    restarts)."""
    if previous is None:
        writes.create(p.session, config_map)
    else:
        writes.replace_config_map(p.session, previous, config_map)


def _refused_network(p: Pass, reason: str) -> Outcome:
    """spec.network.verify: fail, and the placed nodes cannot give the pods an RDMA device: Failed before
    any pod starts (NetworkReady=False, NoRdmaResource)."""
    message = f"{reason}; spec.network.verify is fail, so no pod was created"
    cond = p.condition("Valid", "True", "Validated", "the spec is valid")
    cond = p.condition("NetworkReady", "False", "NoRdmaResource", reason, base=cond)
    cond = p.condition("Failed", "True", gang.NETWORK, message, base=cond)
    return end(p, [], "Failed", message, cond, ("Warning", "Failed"))


def _unschedulable(p: Pass, reason: str) -> Outcome:
    cond = p.condition("Valid", "True", "Validated", "the spec is valid")
    cond = p.condition("Scheduled", "False", "Unschedulable", reason, base=cond)
    if write_status(p, {"phase": p.idle_phase, "message": reason, "conditions": cond, "placement": None}):
        p.event("Warning", "Unschedulable", reason)
    # A restarting gang's pass when its hold runs out lets the jobs waiting behind it in.
    recheck = min(UNSCHEDULABLE_RECHECK_SECONDS, _hold_remaining(p) or UNSCHEDULABLE_RECHECK_SECONDS)
    return Outcome("unschedulable", requeue_after=recheck)


def placement_entries(job: str, plan: planning.Plan) -> list[dict[str, Any]]:
    """status.placement: per node rank, its node, ranks, pipeline stages and pod."""
    return [
        {
            "nodeRank": entry.node_rank,
            "node": entry.node,
            "ranks": entry.rank_range,
            "stages": list(entry.stages),
            "pod": labels.pod_name(job, entry.node_rank),
        }
        for entry in plan.nodes
    ]


def _admitted_status(
    p: Pass, resolved: ResolvedJob, plan: planning.Plan, attempt: child_objects.Attempt
) -> dict[str, Any]:
    cond = p.condition("Valid", "True", "Validated", "the spec is valid")
    message = f"placed {len(plan.nodes)} node ranks; creating pods"
    cond = p.condition("Scheduled", "True", ADMITTED, message, base=cond)
    return {
        "phase": p.idle_phase,
        "message": message,
        "conditions": cond,
        "layout": resolved.layout,
        "worldSize": resolved.world_size,
        "nodes": len(plan.nodes),
        "gpusPerNode": plan.ranks_per_node,
        "axisOrder": ",".join(plan.axis_order),
        "placement": placement_entries(p.name, plan),
        "spareNodes": plan.spare_names() or None,
        # The same computation the ConfigMap records and the pods are built from.
        "ncclEnv": attempt.nccl_env,
        "restarts": p.attempt,
        "podsReady": 0,
        "heldNodes": None,
        "heldUntil": None,
    }
