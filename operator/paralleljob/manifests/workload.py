"""A queued ParallelJob's Kueue Workload: the object built from the job, and what the operator reads back.

Pure. A ParallelJob labelled `kueue.x-k8s.io/queue-name` is queued through Kueue (`handlers.queueing`); the
operator owns its Workload (`kueue.x-k8s.io/v1beta2`, the version the pinned Kueue stores), named
`paralleljob-<job>`, controlled by the job (so the garbage collector deletes it with the job). Its one pod set,
`main`, has one pod per node rank: `count` = the nodes the job asks for (a GPU budget's nodes for a job that
gives one: its layout is chosen later, at placement, inside what was admitted), each with the pod template's
requests plus the GPUs of a node rank and the declared RDMA resource, the job's nodeSelector and tolerations,
and its priority: `kueue.x-k8s.io/priority-class` (a WorkloadPriorityClass) or the template's
priorityClassName (a PriorityClass), with the value the operator read.

Kueue writes `status.admission` (the ClusterQueue and each resource's ResourceFlavor) and the conditions
QuotaReserved, Admitted, Evicted and Requeued; the operator writes Finished when the job ends, and clears a
quota reservation it gives back (an evicted gang stopped, a gang its planner cannot place), as Kueue's own job
integrations do.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from paralleljob.api import ResolvedJob
from paralleljob.manifests import labels

GROUP, VERSION, PLURAL, KIND = "kueue.x-k8s.io", "v1beta2", "workloads", "Workload"
FLAVOR_PLURAL = "resourceflavors"
PRIORITY_PLURAL = "workloadpriorityclasses"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
POD_SET = "main"
GPU_RESOURCE = "nvidia.com/gpu"
# Kueue's condition types and the reasons the operator writes (`metav1.Condition` reasons are CamelCase).
ADMITTED, QUOTA_RESERVED, EVICTED, REQUEUED, FINISHED = "Admitted", "QuotaReserved", "Evicted", "Requeued", "Finished"
PREEMPTED, NODE_FAILURES = "Preempted", "NodeFailures"
PLACEMENT_FAILED = "PlacementFailed"


def workload_name(job: str) -> str:
    return f"paralleljob-{job}"


def queue_of(job: Mapping[str, Any]) -> str | None:
    """The LocalQueue a job is queued in (its `kueue.x-k8s.io/queue-name` label); None: not queued."""
    found = ((job.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL)
    return str(found) if found else None


@dataclasses.dataclass(frozen=True)
class Priority:
    """The Workload's priority: the class named (a WorkloadPriorityClass or a PriorityClass) and its value."""

    group: str
    kind: str
    name: str
    value: int


def priority_source(job: Mapping[str, Any], resolved: ResolvedJob) -> tuple[str, str, str] | None:
    """(group, kind, name) of the class that gives the job its priority, as Kueue's job integrations choose it:
    the `kueue.x-k8s.io/priority-class` label first, then the pods' PriorityClass; None without either."""
    label = ((job.get("metadata") or {}).get("labels") or {}).get(PRIORITY_LABEL)
    if label:
        return GROUP, "WorkloadPriorityClass", str(label)
    if resolved.spec.template.priority_class_name:
        return "scheduling.k8s.io", "PriorityClass", resolved.spec.template.priority_class_name
    return None


def pod_count(resolved: ResolvedJob) -> int | None:
    """The pods (node ranks) the job asks Kueue for: its world size (or GPU budget) over gpusPerNode; None when
    the job does not say gpusPerNode (Kueue counts pods, so the operator cannot leave it to placement)."""
    per_node = resolved.spec.gpus_per_node
    if not per_node:
        return None
    return -(-resolved.world_size // per_node)


def pod_requests(resolved: ResolvedJob) -> dict[str, str]:
    """What one pod requests: the template's requests, the GPUs of a node rank, the declared RDMA resource."""
    requests = {str(k): str(v) for k, v in ((resolved.spec.template.resources or {}).get("requests") or {}).items()}
    requests[GPU_RESOURCE] = str(resolved.spec.gpus_per_node or 0)
    rdma = resolved.spec.network.rdma_resource
    if rdma is not None and rdma.count:
        requests[rdma.name] = str(rdma.count)
    return requests


def build_workload(
    job: Mapping[str, Any],
    resolved: ResolvedJob,
    queue: str,
    pods: int,
    priority: Priority | None,
    topology_request: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The Workload of a queued job (`pods` from `pod_count`; `topology_request` from `kueue_topology.request_for`
    when the queue's flavour has a Kueue Topology)."""
    metadata = job["metadata"]
    template = resolved.spec.template
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [{"name": "trainer", "image": "trainer", "resources": {"requests": pod_requests(resolved)}}],
    }
    if template.node_selector:
        pod_spec["nodeSelector"] = dict(template.node_selector)
    if template.tolerations:
        pod_spec["tolerations"] = [dict(toleration) for toleration in template.tolerations]
    if template.priority_class_name:
        pod_spec["priorityClassName"] = template.priority_class_name
    spec: dict[str, Any] = {
        "queueName": queue,
        "podSets": [{"name": POD_SET, "count": pods, "template": {"spec": pod_spec}}],
    }
    if topology_request:
        spec["podSets"][0]["topologyRequest"] = dict(topology_request)
    if priority is not None:
        spec["priorityClassRef"] = {"group": priority.group, "kind": priority.kind, "name": priority.name}
        spec["priority"] = priority.value
    owner = owner_reference(job)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "name": workload_name(metadata["name"]),
            "namespace": metadata["namespace"],
            "labels": {labels.JOB_LABEL: metadata["name"]},
            "ownerReferences": [owner],
        },
        "spec": spec,
    }


def owner_reference(job: Mapping[str, Any]) -> dict[str, Any]:
    """The Workload's controller reference to its job: the children's one
    (`labels.owner_reference`) with `blockOwnerDeletion`, as Kueue's integrations set it."""
    return {**labels.owner_reference(job), "blockOwnerDeletion": True}


def condition(workload: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for found in (workload.get("status") or {}).get("conditions") or ():
        if found.get("type") == kind:
            return dict(found)
    return None


def is_true(workload: Mapping[str, Any], kind: str) -> bool:
    return (condition(workload, kind) or {}).get("status") == "True"


def owned_by(workload: Mapping[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in (workload.get("metadata") or {}).get("ownerReferences") or ())


def admitted(workload: Mapping[str, Any]) -> bool:
    """Admitted and not evicted: the gang may run."""
    return is_true(workload, ADMITTED) and not is_true(workload, EVICTED) and not is_true(workload, FINISHED)


def holds_quota(workload: Mapping[str, Any]) -> bool:
    return is_true(workload, QUOTA_RESERVED) or bool((workload.get("status") or {}).get("admission"))


def eviction(workload: Mapping[str, Any]) -> tuple[str, str] | None:
    """(reason, message) of Kueue's eviction, while the Workload is evicted."""
    found = condition(workload, EVICTED)
    if found is None or found.get("status") != "True":
        return None
    return str(found.get("reason") or "Evicted"), str(found.get("message") or "")


def flavors(workload: Mapping[str, Any]) -> list[str]:
    """The ResourceFlavors the admission assigned to the pod set, each once, in order."""
    admission = (workload.get("status") or {}).get("admission") or {}
    names: list[str] = []
    for assignment in admission.get("podSetAssignments") or ():
        for name in (assignment.get("flavors") or {}).values():
            if name not in names:
                names.append(str(name))
    return names


def cluster_queue(workload: Mapping[str, Any]) -> str:
    return str(((workload.get("status") or {}).get("admission") or {}).get("clusterQueue") or "")


def waiting_message(workload: Mapping[str, Any]) -> str:
    """What Kueue says of a Workload that waits: QuotaReserved=False's message, Admitted=False's once quota is
    reserved (admission checks pending), or that it has not looked yet."""
    for kind, status in ((QUOTA_RESERVED, "False"), (ADMITTED, "False")):
        found = condition(workload, kind)
        if found and found.get("status") == status and found.get("message"):
            return str(found["message"])
    return "Kueue has not considered the Workload yet"


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where an admission lets the gang go: the admitted flavours' node labels and the taints they tolerate."""

    node_labels: Mapping[str, str]
    tolerations: Sequence[Mapping[str, Any]]


def placement_of(flavor_objects: Sequence[Mapping[str, Any]]) -> Placement:
    """The node labels and tolerations of the ResourceFlavors an admission assigned (as Kueue adds them to a
    job's pods): every flavour's nodeLabels, and a toleration for each of its nodeTaints plus its tolerations."""
    labels: dict[str, str] = {}
    tolerations: list[Mapping[str, Any]] = []
    for flavor in flavor_objects:
        spec = flavor.get("spec") or {}
        labels.update({str(k): str(v) for k, v in (spec.get("nodeLabels") or {}).items()})
        for taint in spec.get("nodeTaints") or ():
            tolerations.append(
                {
                    "key": taint.get("key"),
                    "operator": "Equal",
                    "value": taint.get("value", ""),
                    "effect": taint.get("effect"),
                }
            )
        tolerations += [dict(toleration) for toleration in spec.get("tolerations") or ()]
    return Placement(labels, tolerations)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _set(
    conditions: Sequence[Mapping[str, Any]], kind: str, status: str, reason: str, message: str, at: str
) -> list[dict[str, Any]]:
    kept = [dict(found) for found in conditions if found.get("type") != kind]
    before = next((found for found in conditions if found.get("type") == kind), None)
    since = before.get("lastTransitionTime") if before and before.get("status") == status else at
    return [
        *kept,
        {"type": kind, "status": status, "reason": reason, "message": message[:32768], "lastTransitionTime": since},
    ]


def released_status(
    workload: Mapping[str, Any],
    reason: str,
    message: str,
    *,
    requeued: bool,
    requeue_at: str | None = None,
    at: str | None = None,
) -> dict[str, Any]:
    """The status patch that gives a reservation back: no admission, QuotaReserved and Admitted False, and
    Requeued (True: Kueue queues it again, after `requeue_at` when given; False: it waits, as Kueue's own
    integrations leave a Workload evicted for other reasons than preemption). Conditions that change are dated
    `at` (RFC 3339), now by default."""
    at = at or _now()
    found = (workload.get("status") or {}).get("conditions") or []
    found = _set(found, QUOTA_RESERVED, "False", "Pending", message, at)
    found = _set(found, ADMITTED, "False", "NoReservation", "The workload has no reservation", at)
    found = _set(found, REQUEUED, "True" if requeued else "False", reason, message, at)
    patch: dict[str, Any] = {"admission": None, "conditions": found}
    if requeue_at is not None:
        state = dict((workload.get("status") or {}).get("requeueState") or {})
        patch["requeueState"] = {**state, "requeueAt": requeue_at}
    return patch


def finished_status(
    workload: Mapping[str, Any], succeeded: bool, message: str, at: str | None = None
) -> dict[str, Any]:
    """The status patch that says the job ended, so that Kueue returns its quota at once (dated `at`, now by
    default)."""
    found = (workload.get("status") or {}).get("conditions") or []
    reason = "Succeeded" if succeeded else "Failed"
    return {"conditions": _set(found, FINISHED, "True", reason, message, at or _now())}
