"""Step 5, admission: a job without a placement. A supervision pass hands it to the admission queue
(`handlers.admission_queue`, `awaiting`) and stops; the admission pass (`admit=True`, only ever run by the queue's
one worker) plans with gang admission from the watches' node records and usage index (no cluster-wide pod or node
LIST), choosing the layout first for a job that gives a GPU budget (once: the record keeps the choice), around the
reservations in every job's record. Unschedulable -> Pending + Scheduled=False; else the ConfigMap is written (the
plan and network of this attempt, and its record, whose placement reserves the GPUs) -> Admitted.

Pure, as every step is: `decide(observed, settings, now) -> Decision` from what `handlers.observe.for_admission`
read (the cluster view, and the `-config` ConfigMap the attempt's replaces); `k8s.apply` writes the attempt's
ConfigMap right after the admission lock's fence. A planner that raises is a `placement.PlanningFailed`.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any

from paralleljob import planning
from paralleljob.api import ResolvedJob, validate_document
from paralleljob.api import types as api_types
from paralleljob.api.sections.deepspeed import zero_stage
from paralleljob.api.validation import validate_job
from paralleljob.handlers import gang, placement
from paralleljob.handlers import metrics as m
from paralleljob.handlers.observed import PREVIOUS_JOB_RECHECK_SECONDS, JobFields, Observed, condition, status_patch
from paralleljob.handlers.placement import ClusterView, PlanningFailed
from paralleljob.handlers.settings import Settings
from paralleljob.manifests import children as child_objects
from paralleljob.manifests import labels, records, timestamps
from paralleljob.manifests.decisions import AttemptWrite, Decision, Event
from paralleljob.planning import layout_search, shrink

# A waiting job also re-plans this often: GPUs held by pods of other workloads are freed without an event
# the operator watches (it watches only its own pods).
UNSCHEDULABLE_RECHECK_SECONDS = 60.0
ADMITTED = "Admitted"


@dataclasses.dataclass(frozen=True)
class AdmissionRequest:
    """What places the job in the admission queue: whether its record says it restarted, its PriorityClass,
    its creation time."""

    restarting: bool
    priority_class: str | None
    created: str


def request(job: JobFields) -> AdmissionRequest:
    """The job's place in the admission queue, from its record and its spec."""
    template = (job.job.get("spec") or {}).get("template") or {}
    return AdmissionRequest(
        restarting=job.attempt > 0,
        priority_class=template.get("priorityClassName") if isinstance(template, Mapping) else None,
        created=str(job.job["metadata"].get("creationTimestamp") or ""),
    )


def awaiting(seen: Observed, now: datetime.datetime) -> Decision:
    """A job handed to the admission queue (its place: `request`): a restarting gang whose hold ran out lets the
    others in (its record no longer holds the old nodes); else it looks again when the hold ends."""
    remaining = _hold_remaining(seen, now)
    if remaining is None and seen.record is not None and seen.record.held_nodes:
        status = status_patch(seen, {"heldNodes": None, "heldUntil": None})
        return Decision("awaiting-admission", record=seen.record.without_hold(), status=status, wake_others=True)
    return Decision("awaiting-admission", requeue_after=remaining)


def _hold_remaining(seen: Observed, now: datetime.datetime) -> float | None:
    """Seconds until a restarting gang's hold on its old nodes ends, as its record says; None when it holds
    none."""
    ends = seen.record.hold_ends() if seen.record is not None else None
    if ends is None:
        return None
    left = (ends - now).total_seconds()
    return left + 0.5 if left > 0 else None


def decide(seen: Observed, settings: Settings, now: datetime.datetime) -> Decision:
    """The admission pass's decision over `seen` (`observe.for_admission`): for a job that gives a GPU budget and
    has no layout recorded, the layout chosen first (its status and Event written whole before the rest), then
    the attempt planned and its ConfigMap written, or why not."""
    current, view = seen.spec, seen.cluster
    assert current is not None and view is not None  # observe.for_admission
    choice = seen.record.layout_choice if seen.record is not None else None
    if not current.needs_layout:
        return _admit(seen, current, view, choice, settings, now)
    try:
        found = placement.choose_layout(current, view.nodes, view.usage, view.held, view.builder)
    except Exception as error:
        raise PlanningFailed(str(error)) from error
    if found.job is None:
        cond = condition(seen, "Valid", "True", "Validated", "the spec is valid", now)
        cond = condition(seen, "LayoutChosen", "False", "NoLayout", found.message, now, base=cond)
        written = status_patch(seen, {"phase": "Pending", "message": found.message, "conditions": cond})
        events = (Event("Warning", "NoLayout", found.message),) if written else ()
        return Decision("no-layout", status=written, events=events, requeue_after=UNSCHEDULABLE_RECHECK_SECONDS)
    # The choice is said (status.layoutChoice, the LayoutChosen condition and an Event) before the job is placed;
    # the attempt record keeps it, so that restarts place the same layout.
    cond = condition(seen, "LayoutChosen", "True", "LayoutChosen", found.message, now)
    patch = {"layoutChoice": found.record, "layout": found.job.layout, "conditions": cond}
    chosen = Decision(
        "layout-chosen", status=status_patch(seen, patch), events=(Event("Normal", "LayoutChosen", found.message),)
    )
    return chosen.before(_admit(seen.with_status(chosen.status), found.job, view, found.record, settings, now))


def _admit(
    seen: Observed,
    resolved: ResolvedJob,
    view: ClusterView,
    choice: Mapping[str, Any] | None,
    settings: Settings,
    now: datetime.datetime,
) -> Decision:
    """Plan the attempt on the cluster's free GPUs and write its ConfigMap with its record (the placement that
    reserves them: `choice` is the layout search's, for a job that gave a GPU budget), replacing the previous
    attempt's in one write. A shrink or re-layout's Event is written first, whatever follows."""
    try:
        outcome = placement.plan(
            resolved, view.nodes, view.usage, view.held, placement.Avoid.of(seen.record), view.builder
        )
        said: tuple[Event, ...] = ()
        if outcome.plan is None and (shrunk := _shrunk(seen, resolved, view, outcome.reason)) is not None:
            resolved, outcome, said = shrunk
        elif outcome.plan is None and (replanned := _relayout(seen, resolved, view, outcome.reason)) is not None:
            resolved, outcome, said = replanned
    except Exception as error:
        raise PlanningFailed(str(error)) from error
    m.PLANNING.observe(outcome.seconds)  # the operator's metric, not an API write
    return Decision("planned", events=said).before(_placed(seen, resolved, outcome, choice, settings, now))


def _placed(
    seen: Observed,
    resolved: ResolvedJob,
    outcome: placement.Outcome,
    choice: Mapping[str, Any] | None,
    settings: Settings,
    now: datetime.datetime,
) -> Decision:
    if outcome.plan is None:
        return _unschedulable(seen, outcome.reason, now)
    previous = seen.admission_config_map
    if previous is not None and labels.claim_of(previous, seen.name, seen.uid) == "namesake":
        return Decision("waiting-for-previous-job", requeue_after=PREVIOUS_JOB_RECHECK_SECONDS)
    avoid = placement.Avoid.of(seen.record)
    record = records.AttemptRecord(
        attempt=seen.attempt,
        spec=api_types.spec_to_dict(resolved.spec),
        image=settings.image,
        nodes=tuple(entry.node for entry in sorted(outcome.plan.nodes, key=lambda entry: entry.node_rank)),
        excluded_nodes=tuple(avoid.excluded),
        suspect_nodes=tuple(avoid.suspect),
        gpus_per_node=outcome.plan.ranks_per_node,
        layout_choice=choice,
        spare_nodes=tuple(outcome.plan.spare_names()),
        grow_restarts=seen.record.grow_restarts if seen.record is not None else 0,
    )
    attempt = child_objects.build_attempt(
        seen.job,
        resolved,
        outcome.plan,
        outcome.nodes,
        attempt=seen.attempt,
        default_fabric=settings.default_fabric,
        default_nccl_env=dict(settings.default_nccl_env),
        record=record,
    )
    if refusal := attempt.refusal(resolved):
        # The job ends before any pod: its record says so first, so that no later pass plans it again.
        failed = records.stamp(attempt.config_map, record.with_outcome("Failed"))
        return _refused_network(seen, AttemptWrite(failed, previous, fenced=False), refusal, now)
    written = status_patch(seen, _admitted_status(seen, resolved, outcome.plan, attempt, now))
    # What the RDMA request could not know (an unknown plugin kind, no RDMA resource on the nodes).
    notes = tuple(Event("Warning", "NetworkWarning", note) for note in attempt.network.get("warnings") or ())
    return Decision(
        "admitted", attempt=AttemptWrite(attempt.config_map, previous), status=written, events=notes if written else ()
    )


def _shrunk(
    seen: Observed, resolved: ResolvedJob, view: ClusterView, reason: str
) -> tuple[ResolvedJob, placement.Outcome, tuple[Event, ...]] | None:
    """spec.failurePolicy.allowDataShrink: a restarting gang that no longer fits at its own DP resumes at the
    largest smaller DP that places (`planning.shrink`: TP, PP and the global batch kept), and says so; None when
    it may not or none places. Once the full size fits again it grows back at its next checkpoint
    (`steps.replacement`)."""
    if seen.attempt == 0 or not resolved.spec.failure_policy.allow_data_shrink:
        return None
    for smaller in shrink.shrunk_jobs(resolved):
        found = placement.plan(
            smaller, view.nodes, view.usage, view.held, placement.Avoid.of(seen.record), view.builder
        )
        if found.plan is not None:
            before, after = resolved.batch, smaller.batch
            said = Event(
                "Warning",
                "DataShrunk",
                f"{resolved.layout} does not fit on the nodes left ({reason}); resuming "
                f"as {smaller.layout}: data parallelism {resolved.data} -> {smaller.data}, gradient accumulation "
                f"{before.gradient_accumulation_steps} -> {after.gradient_accumulation_steps}, global batch "
                f"{after.train_batch_size} kept; it grows back at a checkpoint once the full size fits",
            )
            return smaller, found, (said,)
    return None


def _relayout(
    seen: Observed, resolved: ResolvedJob, view: ClusterView, reason: str
) -> tuple[ResolvedJob, placement.Outcome, tuple[Event, ...]] | None:
    """spec.failurePolicy.allowRelayout: a restarting budget job that no longer fits resumes at the best layout
    the planner finds for fewer whole nodes (`planning.shrink.relayout_budgets`, largest first), pipeline and
    tensor included, the global batch kept, and says so; the trainer re-cuts the checkpoint. None when it may not
    or none places. It grows back to its chosen layout at its next checkpoint once that fits
    (`steps.replacement`)."""
    template = validate_document(seen.job).resolved
    if seen.attempt == 0 or template is None or template.budget is None:
        return None
    if not template.spec.failure_policy.allow_relayout or seen.record is None:
        return None
    stage = zero_stage(resolved.spec)
    if stage == 0 and resolved.spec.model.precision != "fp32":
        return None  # the trainer cannot re-cut bf16/fp16 optimizer state saved at ZeRO 0 (docs/trainer.md)
    template = _with_zero_stage(template, stage)  # the checkpoint's optimizer state is of this stage
    full = layout_search.budget_of(template)
    assert full is not None
    for budget in shrink.relayout_budgets(full, seen.record.gpus_per_node):
        chosen = placement.choose_layout(template, view.nodes, view.usage, view.held, view.builder, budget)
        if chosen.job is None:
            continue
        found = placement.plan(
            chosen.job, view.nodes, view.usage, view.held, placement.Avoid.of(seen.record), view.builder
        )
        if found.plan is not None:
            said = Event(
                "Warning",
                "Relayout",
                f"{resolved.layout} does not fit on the nodes left ({reason}); resuming at {chosen.job.layout} "
                f"(PP x TP x DP) on {budget.gpus} GPUs, the planner's best layout for them, global batch "
                f"{chosen.job.batch.train_batch_size} kept; the checkpoint is re-cut, and the job grows back to "
                f"{resolved.layout} at a checkpoint once it fits",
            )
            return chosen.job, found, (said,)
    return None


def _with_zero_stage(template: ResolvedJob, stage: int) -> ResolvedJob:
    """The budget job with its ZeRO stage pinned, so that the layout search keeps it."""
    deepspeed = dict(template.spec.deepspeed or {})
    zero = deepspeed.get("zero_optimization")
    deepspeed["zero_optimization"] = {**(zero if isinstance(zero, dict) else {}), "stage": stage}
    spec = dataclasses.replace(template.spec, deepspeed=deepspeed)
    return validate_job(dataclasses.replace(template.job, spec=spec)).resolved or template


def _refused_network(seen: Observed, failed: AttemptWrite, reason: str, now: datetime.datetime) -> Decision:
    """spec.network.verify: fail, and the placed nodes cannot give the pods an RDMA device: Failed before any
    pod starts (NetworkReady=False, NoRdmaResource). The attempt's ConfigMap, its record Failed, is written
    first; the job has no pod and no live attempt to end."""
    message = f"{reason}; spec.network.verify is fail, so no pod was created"
    cond = condition(seen, "Valid", "True", "Validated", "the spec is valid", now)
    cond = condition(seen, "NetworkReady", "False", "NoRdmaResource", reason, now, base=cond)
    cond = condition(seen, "Failed", "True", gang.NETWORK, message, now, base=cond)
    patch = {"phase": "Failed", "message": message, "conditions": cond, "podsReady": 0}
    written = status_patch(seen, {**patch, "completionTime": timestamps.format_time(now)})
    events = (Event("Warning", "Failed", message),) if written else ()
    return Decision("failed", attempt=failed, status=written, events=events, wake_others=True)


def _unschedulable(seen: Observed, reason: str, now: datetime.datetime) -> Decision:
    cond = condition(seen, "Valid", "True", "Validated", "the spec is valid", now)
    cond = condition(seen, "Scheduled", "False", "Unschedulable", reason, now, base=cond)
    written = status_patch(seen, {"phase": seen.idle_phase, "message": reason, "conditions": cond, "placement": None})
    # A restarting gang's pass when its hold runs out lets the jobs waiting behind it in.
    recheck = min(UNSCHEDULABLE_RECHECK_SECONDS, _hold_remaining(seen, now) or UNSCHEDULABLE_RECHECK_SECONDS)
    events = (Event("Warning", "Unschedulable", reason),) if written else ()
    return Decision("unschedulable", status=written, events=events, requeue_after=recheck)


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
    seen: Observed, resolved: ResolvedJob, plan: planning.Plan, attempt: child_objects.Attempt, now: datetime.datetime
) -> dict[str, Any]:
    cond = condition(seen, "Valid", "True", "Validated", "the spec is valid", now)
    message = f"placed {len(plan.nodes)} node ranks; creating pods"
    cond = condition(seen, "Scheduled", "True", ADMITTED, message, now, base=cond)
    return {
        "phase": seen.idle_phase,
        "message": message,
        "conditions": cond,
        "layout": resolved.layout,
        "worldSize": resolved.world_size,
        "nodes": len(plan.nodes),
        "gpusPerNode": plan.ranks_per_node,
        "axisOrder": ",".join(plan.axis_order),
        "placement": placement_entries(seen.name, plan),
        "spareNodes": plan.spare_names() or None,
        # The same computation the ConfigMap records and the pods are built from.
        "ncclEnv": attempt.nccl_env,
        "restarts": seen.attempt,
        "podsReady": 0,
        "heldNodes": None,
        "heldUntil": None,
    }
