"""What the Kueue step (`handlers.steps.kueue`, pure: quotas from Kueue) decides from, read for a job queued
through Kueue (labelled `kueue.x-k8s.io/queue-name`); and the watch of the operator's Workloads.

The reconcile pass (`handlers.reconcile`) observes here, lets the step decide and `k8s.apply` write, at four
points, each only for a queued job: `for_gate` where a job without a placement would be handed to the admission
queue, `for_workload` after an admission pass that could not place it (`steps.kueue.released`), before a placed
gang is supervised (`steps.kueue.evicting`, with rank 0's progress ConfigMap when the decision reads it) and when
the job ends (`steps.kueue.finished`). What `for_gate` reads beyond the Workload follows the step's own `stage`:
the priority and the topology request only to create a Workload, the admitted flavours and Kueue's
TopologyAssignment only once admitted, nothing at all while an evicted gang's pods are still going.

An operator started without `--kueue` (the chart's `kueue.enabled`) has neither the Workload rights nor the
watch: a labelled job then waits, Queued with the reason KueueNotEnabled, rather than run around Kueue. With it,
`watch_workloads` asks for a pass whenever one of the operator's Workloads changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import kopf

from paralleljob.api import ResolvedJob
from paralleljob.handlers import observe, queue_topology
from paralleljob.handlers.observed import Observed, QueueSeen
from paralleljob.handlers.passes import Pass
from paralleljob.handlers.steps import kueue
from paralleljob.k8s import reads, workloads
from paralleljob.manifests import labels
from paralleljob.manifests import workload as wl


def queued(job: Mapping[str, Any]) -> bool:
    return wl.queue_of(job) is not None


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


def for_gate(p: Pass, seen: Observed, current: ResolvedJob) -> Observed:
    """What `steps.kueue.gate` decides from: the Workload, then what its `stage` needs next."""
    queue = _queue(p)
    seen = dataclasses.replace(seen, queue=queue)
    if kueue.stage(seen, current) in ("disabled", "stopping"):
        return seen
    queue = _queue(p, workloads.get(p.session, p.namespace, p.name))
    seen = dataclasses.replace(seen, queue=queue)
    match kueue.stage(seen, current):
        case "create" if (pods := wl.pod_count(current)) is not None:
            request = queue_topology.topology_request(p, current, queue.name, pods)
            queue = dataclasses.replace(queue, priority=_priority(p, current), topology_request=request)
        case "admitted":
            assert queue.workload is not None
            queue = _admission(p, current, queue, queue.workload)
    return dataclasses.replace(seen, queue=queue)


def _admission(p: Pass, current: ResolvedJob, queue: QueueSeen, found: Mapping[str, Any]) -> QueueSeen:
    """An admitted Workload's TopologyAssignment (its nodes, or the rule they break, and those Kueue is to
    replace), and the admitted ResourceFlavors when the job goes on to admission with them."""
    nodes = queue_topology.assigned(p, current, found)
    awaiting = tuple(queue_topology.lost(p, nodes, found)) if nodes is not None and nodes.broken is None else ()
    queue = dataclasses.replace(queue, assigned=nodes, awaiting=awaiting)
    if (nodes is not None and nodes.broken is not None) or awaiting:
        return queue
    flavors = tuple(flavor for name in wl.flavors(found) if (flavor := workloads.flavor(p.session, name)) is not None)
    return dataclasses.replace(queue, flavors=flavors)


def _priority(p: Pass, current: ResolvedJob) -> wl.Priority | None:
    source = wl.priority_source(p.job, current)
    if source is None:
        return None
    group, kind, name = source
    if kind == "PriorityClass":
        value = reads.priority_value(p.session, name)
    else:
        value = workloads.workload_priority_value(p.session, name)
    return wl.Priority(group, kind, name, value or 0)


def for_workload(p: Pass, seen: Observed) -> Observed:
    """The observation with the job's Workload read now (`steps.kueue.released`, `evicting`, `finished`)."""
    return dataclasses.replace(seen, queue=_queue(p, workloads.get(p.session, p.namespace, p.name)))


def _queue(p: Pass, workload: Mapping[str, Any] | None = None) -> QueueSeen:
    """The job's queue as the pass sees it, with its Workload when read."""
    return QueueSeen(wl.queue_of(p.job) or "", enabled=p.settings.kueue, workload=workload)


def for_eviction(p: Pass, seen: Observed, resolved: ResolvedJob, pods: Sequence[Mapping[str, Any]]) -> Observed:
    """What `steps.kueue.evicting` decides from: the Workload, and rank 0's progress ConfigMap when the decision
    reads it (`steps.kueue.reads_progress`: to ask for a checkpoint or to see it came)."""
    seen = for_workload(p, seen)
    return observe.with_report(p, seen) if kueue.reads_progress(seen, resolved, pods) else seen
