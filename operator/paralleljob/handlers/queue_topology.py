"""Kueue's Topology-Aware Scheduling for a queued job, observed (`handlers.queueing` calls these): the topology
request to write into a new Workload when the queue's flavour has a Kueue Topology, the nodes of an admission's
TopologyAssignment (or the hard rule they break) and those Kueue is to replace, and the cluster view narrowed to
the assigned nodes.

Observe here (the LocalQueue, its ClusterQueue, the flavour, the Topology; the node records of the watch), compute
with `manifests.kueue_topology` (pure), and let the Kueue step (`handlers.steps.kueue`) decide, which also marks
the job's pods as Kueue's TAS pods. A queue whose flavours have no topologyName never reaches anything but
`flavour_topology`, which then says None.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from paralleljob.api import ResolvedJob
from paralleljob.handlers import passes
from paralleljob.handlers.placement import ClusterView
from paralleljob.k8s import workloads
from paralleljob.manifests import kueue_topology as kt
from paralleljob.manifests import workload as wl


@dataclasses.dataclass(frozen=True)
class FlavourTopology:
    """A queue's TAS flavour: its name, its node labels, and its Topology's levels (coarse to fine)."""

    flavour: str
    node_labels: Mapping[str, str]
    levels: tuple[str, ...]


def flavour_topology(p: passes.Pass, queue: str) -> FlavourTopology | None:
    """The first flavour of the queue's ClusterQueue that names a Kueue Topology, or None (quota only)."""
    local = workloads.queue_object(p.session, kt.LOCAL_QUEUE_PLURAL, queue, p.namespace)
    cluster_queue = str(((local or {}).get("spec") or {}).get("clusterQueue") or "")
    found = workloads.queue_object(p.session, kt.CLUSTER_QUEUE_PLURAL, cluster_queue) if cluster_queue else None
    for group in ((found or {}).get("spec") or {}).get("resourceGroups") or ():
        for entry in group.get("flavors") or ():
            flavour = workloads.flavor(p.session, str(entry.get("name")))
            spec = (flavour or {}).get("spec") or {}
            if not spec.get("topologyName"):
                continue
            topology = workloads.queue_object(p.session, kt.TOPOLOGY_PLURAL, str(spec["topologyName"]))
            levels = kt.levels_of(topology or {})
            if levels:
                return FlavourTopology(str(entry["name"]), dict(spec.get("nodeLabels") or {}), tuple(levels))
    return None


def topology_request(p: passes.Pass, current: ResolvedJob, queue: str, pods: int) -> dict[str, Any] | None:
    """The pod set's topologyRequest for a new Workload, from the layout and the flavour's nodes; None when the
    queue's flavours have no Topology."""
    found = flavour_topology(p, queue)
    if found is None:
        return None
    selector = {**found.node_labels, **(current.spec.template.node_selector or {})}
    nodes = [
        info.labels
        for info in p.nodes.snapshot.infos
        if all(info.labels.get(key) == value for key, value in selector.items())
    ]
    return kt.request_for(kt.shape_for(current, pods), found.levels, nodes)


def _labels(p: passes.Pass) -> dict[str, Mapping[str, str]]:
    return {info.name: info.labels for info in p.nodes.snapshot.infos}


def assigned(p: passes.Pass, current: ResolvedJob, found: Mapping[str, Any]) -> kt.AssignedNodes | None:
    """The nodes of the admission's TopologyAssignment, or the hard rule they break; None without one."""
    assignment = kt.assigned_domains(found)
    if assignment is None:
        return None
    labels = _labels(p)
    nodes = kt.assigned_nodes(assignment, labels)
    if nodes.broken is not None or current.needs_layout:
        return nodes
    spec = current.spec
    rule = kt.broken_rule(
        nodes.nodes, labels, current.tensor, spec.gpus_per_node or 1, spec.topology.nvlink_domain_label
    )
    return dataclasses.replace(nodes, broken=rule) if rule is not None else nodes


def lost(p: passes.Pass, nodes: kt.AssignedNodes, found: Mapping[str, Any]) -> list[str]:
    """The assigned nodes Kueue is to replace (`kueue_topology.awaiting_replacement`), by the watch's nodes."""
    snapshot = p.nodes.snapshot
    return kt.awaiting_replacement(nodes.nodes, found, snapshot.known, snapshot.not_ready)


def inside_assignment(p: passes.Pass, current: ResolvedJob, view: ClusterView) -> ClusterView:
    """The cluster view of a placed queued job's admission pass (its hot spares topped up), narrowed to the nodes
    of its Workload's TopologyAssignment, read now; the view itself without one."""
    if wl.queue_of(p.job) is None or not p.settings.kueue:
        return view
    found = workloads.get(p.session, p.namespace, p.name)
    return inside(view, assigned(p, current, found) if found is not None else None)


def inside(view: ClusterView, nodes: kt.AssignedNodes | None) -> ClusterView:
    """The cluster view narrowed to the nodes Kueue's TopologyAssignment names (the planner then chooses which
    node gets which rank with its cost model); the view itself without one, or with one that breaks a rule."""
    if nodes is None or nodes.broken is not None:
        return view
    allowed = set(nodes.nodes)
    snapshot = view.nodes
    narrowed = dataclasses.replace(
        snapshot,
        infos=tuple(info for info in snapshot.infos if info.name in allowed),
        dicts={name: node for name, node in snapshot.dicts.items() if name in allowed},
    )
    return dataclasses.replace(view, nodes=narrowed)
