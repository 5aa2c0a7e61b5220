"""One reconcile pass over one ParallelJob: read the cluster, decide, act, write status once.

Level-triggered and idempotent, so the operator can die at any moment and converge after a restart.
The pass reads the job and its pods from the API, then takes the first step that applies:

1. invalid spec: Valid=False, an Event, no children;
2. finished (Succeeded/Failed): delete the pods still running;
3. pods of an older attempt exist: delete them, and wait (two generations never run at once);
4. no placement: plan with gang admission; unschedulable -> Pending + Scheduled=False; else write the
   ConfigMap (the plan, for this attempt) and the placement (which reserves the GPUs) -> reason Admitted;
5. admitted: create the Service, the progress RBAC and every missing pod from the ConfigMap's plan
   -> reason Placed;
6. placed: judge the gang (`handlers.gang`): Running, Succeeded, or a gang restart / Failed.

Each step ends with at most one status patch, skipped when nothing changed, so a quiet cluster sees no writes.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from paralleljob.api import ResolvedJob, validate_document
from paralleljob.handlers import conditions, gang, placement, reservations
from paralleljob.handlers import metrics as m
from paralleljob.k8s import events, reads, writes
from paralleljob.k8s.session import Session
from paralleljob.manifests import children as child_objects
from paralleljob.manifests import configmap, labels

log = logging.getLogger(__name__)

EXCLUDED_NODES_ANNOTATION = "paralleljob.io/excluded-nodes"
TERMINAL = frozenset({"Succeeded", "Failed"})
ADMITTED, PLACED = "Admitted", "Placed"
# Admissions run one at a time: each reads the placements the previous one wrote, so two jobs admitted a
# moment apart never plan onto the same GPUs.
ADMISSION = threading.Lock()


@dataclasses.dataclass(frozen=True)
class Settings:
    """Operator-wide settings from the command line."""

    image: str = "ghcr.io/paralleljob/trainer:0.1.0"
    default_fabric: str = "auto"
    # NCCL variables every job gets unless its spec.network.ncclEnv sets the same name.
    default_nccl_env: tuple[tuple[str, str], ...] = ()
    namespaces: tuple[str, ...] | None = None  # None: all namespaces


@dataclasses.dataclass(frozen=True)
class Pass:
    """What one pass works with."""

    session: Session
    settings: Settings
    job: Mapping[str, Any]
    not_ready: Collection[str]

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
    def generation(self) -> int | None:
        return self.job["metadata"].get("generation")

    @property
    def attempt(self) -> int:
        return int(self.status.get("restarts") or 0)

    def condition(self, kind: str, status: str, reason: str, message: str, base: Any = None) -> list[dict[str, Any]]:
        current = self.status.get("conditions") if base is None else base
        return conditions.set_condition(current, kind, status, reason, message, self.generation)

    def event(self, kind: str, reason: str, message: str) -> None:
        events.post(self.session, self.job, kind, reason, message)


def reconcile(session: Session, settings: Settings, namespace: str, name: str, not_ready: Collection[str]) -> str:
    """One pass; returns the step taken (for logs and metrics)."""
    job = reads.get_job(session, namespace, name)
    if job is None or job["metadata"].get("deletionTimestamp"):
        m.observe_phase(namespace, name, None)
        return "gone"
    job.setdefault("metadata", {}).setdefault("namespace", namespace)
    step = _step(Pass(session, settings, job, not_ready))
    m.RECONCILES.labels(outcome=step).inc()
    return step


def _step(p: Pass) -> str:
    result = validate_document(p.job)
    if result.resolved is None or not result.ok:
        return _invalid(p, "; ".join(problem.render() for problem in result.problems if problem.severity == "error"))
    m.observe_phase(p.namespace, p.name, p.status.get("phase"))
    if p.status.get("phase") in TERMINAL:
        return _finished(p, reads.list_job_pods(p.session, p.namespace, p.name))
    pods = reads.list_job_pods(p.session, p.namespace, p.name)
    stale = [pod for pod in pods if _attempt_of(pod) != p.attempt]
    if stale:
        _delete(p, stale)
        return "deleting-old-generation"
    if not p.status.get("placement"):
        with ADMISSION:
            return _admit(p, result.resolved)
    if conditions.is_true(p.status.get("conditions"), "Scheduled", ADMITTED):
        return _create(p, result.resolved, pods)
    return _watch(p, result.resolved, pods)


def _attempt_of(pod: Mapping[str, Any]) -> int:
    return int(pod["metadata"].get("labels", {}).get(labels.ATTEMPT_LABEL, -1))


def _delete(p: Pass, pods: Sequence[Mapping[str, Any]]) -> None:
    for pod in pods:
        writes.delete_pod(p.session, p.namespace, pod["metadata"]["name"])


def write_status(p: Pass, patch: Mapping[str, Any]) -> bool:
    """Patch status when something in `patch` differs from it; True when written."""
    current = p.status
    changed = any(
        not conditions.same(current.get(key), value) if key == "conditions" else current.get(key) != value
        for key, value in patch.items()
    )
    if changed:
        writes.patch_job_status(p.session, p.namespace, p.name, patch)
        if "phase" in patch:
            m.observe_phase(p.namespace, p.name, patch["phase"])
    return changed


def _invalid(p: Pass, message: str) -> str:
    cond = p.condition("Valid", "False", "InvalidSpec", message)
    if write_status(p, {"phase": "Pending", "message": f"invalid spec: {message}", "conditions": cond}):
        p.event("Warning", "InvalidSpec", message)
    return "invalid"


def _finished(p: Pass, pods: Sequence[Mapping[str, Any]], phase: str | None = None) -> str:
    """Delete the pods still holding GPUs; a finished job keeps its Succeeded pods for their logs."""
    keep = {"Succeeded"} if (phase or p.status.get("phase")) == "Succeeded" else set()
    running = [pod for pod in pods if (pod.get("status") or {}).get("phase") not in {"Failed", *keep}]
    _delete(p, running)
    return "finished"


def _excluded(p: Pass) -> list[str]:
    raw = (p.job["metadata"].get("annotations") or {}).get(EXCLUDED_NODES_ANNOTATION, "")
    return [node for node in raw.split(",") if node]


def _admit(p: Pass, resolved: ResolvedJob) -> str:
    nodes = reads.list_nodes(p.session)
    all_pods = reads.list_all_pods(p.session)
    jobs = reads.list_jobs(p.session, p.settings.namespaces)
    held = reservations.job_reservations(jobs, all_pods, exclude=(p.namespace, p.name))
    outcome = placement.plan(resolved, nodes, all_pods, held, _excluded(p))
    m.PLANNING.observe(outcome.seconds)
    if outcome.plan is None:
        return _unschedulable(p, outcome.reason)
    built = _children(p, resolved, outcome.plan, outcome.nodes)
    if reads.get_config_map(p.session, p.namespace, labels.config_map_name(p.name)) is not None:
        writes.delete_config_map(p.session, p.namespace, labels.config_map_name(p.name))
    writes.create(p.session, built.config_map)
    write_status(p, _admitted_status(p, resolved, outcome.plan, built))
    return "admitted"


def _children(
    p: Pass, resolved: ResolvedJob, plan: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]]
) -> child_objects.Children:
    return child_objects.build_children(
        p.job,
        resolved,
        plan,
        nodes,
        image=p.settings.image,
        attempt=p.attempt,
        default_fabric=p.settings.default_fabric,
        default_nccl_env=dict(p.settings.default_nccl_env),
    )


def _unschedulable(p: Pass, reason: str) -> str:
    cond = p.condition("Valid", "True", "Validated", "the spec is valid")
    cond = p.condition("Scheduled", "False", "Unschedulable", reason, base=cond)
    phase = "Restarting" if p.attempt else "Pending"
    if write_status(p, {"phase": phase, "message": reason, "conditions": cond, "placement": None}):
        p.event("Warning", "Unschedulable", reason)
    return "unschedulable"


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
    p: Pass, resolved: ResolvedJob, plan: Mapping[str, Any], built: child_objects.Children
) -> dict[str, Any]:
    cond = p.condition("Valid", "True", "Validated", "the spec is valid")
    message = f"placed {len(plan['nodes'])} node ranks; creating pods"
    cond = p.condition("Scheduled", "True", ADMITTED, message, base=cond)
    return {
        "phase": "Restarting" if p.attempt else "Pending",
        "message": message,
        "conditions": cond,
        "observedGeneration": p.generation,
        "layout": resolved.layout,
        "worldSize": resolved.world_size,
        "nodes": len(plan["nodes"]),
        "gpusPerNode": plan["ranksPerNode"],
        "axisOrder": ",".join(plan["axisOrder"]),
        "placement": _placement_entries(p, plan),
        "ncclEnv": built.nccl_env,
        "restarts": p.attempt,
        "podsReady": 0,
    }


def _create(p: Pass, resolved: ResolvedJob, pods: Sequence[Mapping[str, Any]]) -> str:
    found = reads.get_config_map(p.session, p.namespace, labels.config_map_name(p.name))
    if found is None or configmap.attempt_of(found) != p.attempt:
        # The plan of this attempt is lost (someone deleted the ConfigMap): plan again.
        write_status(p, {"placement": None})
        return "replanning"
    plan = configmap.plan_of(found)
    used = {entry["node"] for entry in plan["nodes"]}
    nodes = [node for node in reads.list_nodes(p.session) if node["metadata"]["name"] in used]
    built = _children(p, resolved, plan, nodes)
    existing = {pod["metadata"]["name"] for pod in pods}
    for obj in [built.service, *built.rbac]:
        writes.create(p.session, obj)
    for pod in built.pods:
        if pod["metadata"]["name"] not in existing:
            writes.create(p.session, pod)
    message = f"{len(built.pods)} pods created on {len(used)} nodes; fabric {built.fabric}"
    cond = p.condition("Scheduled", "True", PLACED, message)
    if write_status(p, {"conditions": cond, "message": message}):
        hosts = ", ".join(f"{e['nodeRank']}->{e['node']}" for e in plan["nodes"][:8])
        more = f" (+{len(plan['nodes']) - 8} more)" if len(plan["nodes"]) > 8 else ""
        p.event("Normal", "Placed", f"layout {resolved.layout}, fabric {built.fabric}: {hosts}{more}")
    return "created"


def _watch(p: Pass, resolved: ResolvedJob, pods: Sequence[Mapping[str, Any]]) -> str:
    expected = len(p.status.get("placement") or [])
    state = gang.judge(pods, expected, p.not_ready)
    handlers: dict[str, Callable[[Pass, ResolvedJob, Sequence[Mapping[str, Any]], gang.GangState], str]] = {
        "succeeded": _succeeded,
        "broken": _broken,
        "running": _running,
        "starting": _starting,
    }
    return handlers[state.verdict](p, resolved, pods, state)


def _succeeded(p: Pass, resolved: ResolvedJob, pods: Sequence[Mapping[str, Any]], state: gang.GangState) -> str:
    message = f"training finished after {p.attempt} restarts"
    cond = p.condition("Ready", "False", "Finished", message)
    cond = p.condition("Succeeded", "True", "TrainingFinished", message, base=cond)
    patch = {"phase": "Succeeded", "message": message, "conditions": cond, "podsReady": 0}
    patch["completionTime"] = conditions.now()
    if write_status(p, patch):
        p.event("Normal", "Completed", message)
    return _finished(p, pods, "Succeeded")


def _broken(p: Pass, resolved: ResolvedJob, pods: Sequence[Mapping[str, Any]], state: gang.GangState) -> str:
    limit = resolved.spec.failure_policy.backoff_limit
    if p.attempt >= limit:
        message = f"{state.reason}; backoffLimit {limit} reached after {p.attempt} restarts"
        cond = p.condition("Ready", "False", "GangFailed", state.reason)
        cond = p.condition("Failed", "True", "BackoffLimitExceeded", message, base=cond)
        patch = {"phase": "Failed", "message": message, "conditions": cond, "podsReady": 0}
        if write_status(p, {**patch, "completionTime": conditions.now()}):
            p.event("Warning", "Failed", message)
        _delete(p, pods)
        return "failed"
    return _restart(p, pods, state, limit)


def _restart(p: Pass, pods: Sequence[Mapping[str, Any]], state: gang.GangState, limit: int) -> str:
    if state.node and state.node not in _excluded(p):
        joined = ",".join([*_excluded(p), state.node])
        writes.patch_job_annotations(p.session, p.namespace, p.name, {EXCLUDED_NODES_ANNOTATION: joined})
    restarts = p.attempt + 1
    message = f"gang restart {restarts}/{limit}: {state.reason}; resuming from the last checkpoint"
    cond = p.condition("Ready", "False", "GangRestart", state.reason)
    cond = p.condition("Scheduled", "False", "GangRestart", message, base=cond)
    patch = {"phase": "Restarting", "message": message, "conditions": cond, "restarts": restarts}
    write_status(p, {**patch, "placement": None, "podsReady": 0})
    m.GANG_RESTARTS.inc()
    p.event("Warning", "Restarting", message)
    _delete(p, pods)
    return "restarting"


def _running(p: Pass, resolved: ResolvedJob, pods: Sequence[Mapping[str, Any]], state: gang.GangState) -> str:
    message = f"all {state.ready} pods running"
    cond = p.condition("Ready", "True", "AllPodsRunning", message)
    patch: dict[str, Any] = {"phase": "Running", "message": message, "conditions": cond, "podsReady": state.ready}
    if p.status.get("phase") != "Running":
        patch["startTime"] = conditions.now()
    if write_status(p, patch) and "startTime" in patch:
        p.event("Normal", "Started", f"{resolved.layout} on {state.ready} pods, attempt {p.attempt}")
    return "running"


def _starting(p: Pass, resolved: ResolvedJob, pods: Sequence[Mapping[str, Any]], state: gang.GangState) -> str:
    write_status(p, {"podsReady": state.ready})
    return "starting"
