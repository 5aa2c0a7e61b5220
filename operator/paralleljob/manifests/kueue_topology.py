"""Kueue's Topology-Aware Scheduling (TAS) for a queued ParallelJob: the topology request its Workload makes, the
TopologyAssignment Kueue answers with, decoded into nodes, and the hard rules an assignment must keep.

Pure; called by `handlers.queueing` (and `manifests.workload`, which writes the request into the pod set).

The operator owns its Workload (it is Kueue's external framework), so it writes `spec.podSets[].topologyRequest`
itself, the field Kueue's own job integrations fill from the pod-template annotations
`kueue.x-k8s.io/podset-required-topology`, `-preferred-topology`, `-slice-required-topology` and
`-slice-size`. What the layout needs, in Kueue's terms (`request_for`):

- one pod per node: a pod requests the GPUs of one node rank (`manifests.workload.pod_requests`);
- a pipeline replica (pipeline x tensor GPUs, `replica_nodes` nodes) is one slice: `podSetSliceSize` =
  `replica_nodes`, `podSetSliceRequiredTopology` = the finest level of the Topology one of whose domains holds that
  many of the flavour's nodes (`finest_level_holding`), so no replica's point-to-point stage traffic leaves that
  domain; the whole gang is `preferred` at the finest level that holds it, so the data-parallel all-reduce stays
  as close as Kueue can pack it. Kueue supports slices only with a required level, so `spec.topology.kueueTopology:
  Preferred` drops the slices and asks for the replicas' level as `preferred` only;
- one replica (data 1), or replicas of less than two nodes: no slices (a slice of one node says nothing); the
  pod set is required (or preferred) at the level that holds the replica;
- a tensor group wider than a node, when spec.topology.nvlinkDomainLabel is a level of the Topology: the slices
  are the tensor groups at that level instead (Kueue v0.17.0 takes one slice layer without the alpha
  TASMultiLayerTopology gate), since keeping a tensor group in one NVLink domain is a hard rule;
- a GPU budget's layout is chosen later, inside the admission: the gang is only `preferred` at the finest level
  that holds it.

Kueue's answer (`status.admission.podSetAssignments[].topologyAssignment`, v1beta2) lists domains at the lowest
level of the Topology (`kubernetes.io/hostname` when it has it: then only that level) with a pod count each, in
slices whose values may be `universal` or `individual` with a common `prefix`/`suffix` (`assigned_domains`).
`assigned_nodes` turns the domains into node names, and `broken_rule` says which hard rule of the layout the nodes
break (two pods on one node; a tensor group that cannot sit in one NVLink domain), or None.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from paralleljob.api import ResolvedJob

HOSTNAME = "kubernetes.io/hostname"
# Kueue's annotation keys. A pod carrying one of the topology annotations is a TAS pod to Kueue: its usage is
# counted from the Workload's assignment and left out of the "non-TAS usage" Kueue reads from bound pods, so the
# operator puts the one its request uses on every pod. `WORKLOAD` names the pod's Workload, as on Kueue's own pods:
# Kueue's node controller finds the pods on a failed node by it and by the hostname nodeSelector.
REQUIRED_ANNOTATION = "kueue.x-k8s.io/podset-required-topology"
PREFERRED_ANNOTATION = "kueue.x-k8s.io/podset-preferred-topology"
WORKLOAD_ANNOTATION = "kueue.x-k8s.io/workload"
TOPOLOGY_PLURAL, LOCAL_QUEUE_PLURAL, CLUSTER_QUEUE_PLURAL = "topologies", "localqueues", "clusterqueues"


@dataclasses.dataclass(frozen=True)
class Shape:
    """What the request is built from: the gang's nodes and a pipeline replica's (0: not known yet, a budget)."""

    nodes: int
    replica_nodes: int
    mode: str = "Required"  # spec.topology.kueueTopology
    tensor_nodes: int = 1  # the nodes of one tensor group (more than 1: a multi-node NVLink domain)
    nvlink_label: str | None = None  # spec.topology.nvlinkDomainLabel


def shape_of(
    nodes: int, pipeline: int, tensor: int, gpus_per_node: int, mode: str, nvlink_label: str | None = None
) -> Shape:
    """The gang's shape: a replica is pipeline x tensor GPUs, whole nodes of them (0 when replicas share nodes)."""
    replica_gpus = pipeline * tensor
    replica = replica_gpus // gpus_per_node if replica_gpus % gpus_per_node == 0 else 0
    tensor_nodes = tensor // gpus_per_node if tensor > gpus_per_node else 1
    return Shape(nodes, replica, mode, tensor_nodes, nvlink_label)


def shape_for(resolved: ResolvedJob, pods: int) -> Shape:
    """The shape of a queued job of `pods` nodes (`manifests.workload.pod_count`); a budget's replicas unknown."""
    spec = resolved.spec
    per_node = spec.gpus_per_node or 1
    if resolved.needs_layout:
        return Shape(pods, 0, spec.topology.kueue_topology)
    return shape_of(
        pods,
        resolved.pipeline,
        resolved.tensor,
        per_node,
        spec.topology.kueue_topology,
        spec.topology.nvlink_domain_label,
    )


def levels_of(topology: Mapping[str, Any]) -> list[str]:
    """A Kueue Topology's node label keys, coarse to fine."""
    return [str(level["nodeLabel"]) for level in (topology.get("spec") or {}).get("levels") or ()]


def finest_level_holding(levels: Sequence[str], nodes: Sequence[Mapping[str, str]], count: int) -> str | None:
    """The finest level one of whose domains holds `count` of these nodes (their labels), or None."""
    for depth in range(len(levels), 0, -1):
        if levels[depth - 1] == HOSTNAME and count > 1:
            continue
        sizes = Counter(tuple(labels.get(level, "") for level in levels[:depth]) for labels in nodes)
        if sizes and max(sizes.values()) >= count:
            return levels[depth - 1]
    return None


def request_for(shape: Shape, levels: Sequence[str], nodes: Sequence[Mapping[str, str]]) -> dict[str, Any]:
    """The pod set's `topologyRequest` (see the module docstring); `nodes` are the labels of the flavour's nodes.

    A level no domain can hold is asked for at the coarsest level all the same: Kueue then says, in the
    Workload's QuotaReserved message, that the topology cannot fit the pods, and the job waits with that reason.
    """
    coarsest = levels[0]
    gang = finest_level_holding(levels, nodes, shape.nodes) or coarsest
    if shape.tensor_nodes > 1 and shape.nvlink_label in levels:
        # The hard rule first: every tensor group inside one NVLink domain, a level of the Topology.
        slices = {"podSetSliceRequiredTopology": shape.nvlink_label, "podSetSliceSize": shape.tensor_nodes}
        return {"preferred": gang, **slices}
    replica = shape.replica_nodes
    if replica == 0:
        return {"preferred": gang}
    replica_level = finest_level_holding(levels, nodes, replica) or coarsest
    replicas = shape.nodes // replica
    if replicas <= 1 or replica <= 1 or shape.mode == "Preferred":
        level = replica_level if replicas <= 1 else gang
        return {"required" if shape.mode == "Required" else "preferred": level}
    return {"preferred": gang, "podSetSliceRequiredTopology": replica_level, "podSetSliceSize": replica}


def is_tas_pod(annotations: Mapping[str, str] | None) -> bool:
    """Whether a pod template carries Kueue's topology annotation (the job was admitted with a topology)."""
    return bool(annotations) and any(key in (annotations or {}) for key in (REQUIRED_ANNOTATION, PREFERRED_ANNOTATION))


def pod_annotation(request: Mapping[str, Any]) -> tuple[str, str]:
    """The topology annotation the pods carry (the pod set's own level), so Kueue counts them as TAS pods."""
    if "required" in request:
        return REQUIRED_ANNOTATION, str(request["required"])
    return PREFERRED_ANNOTATION, str(request.get("preferred") or "")


# -- Kueue's answer --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Domain:
    """One domain of an assignment: its node-label values at the assignment's levels, and its pods."""

    values: tuple[str, ...]
    pods: int


@dataclasses.dataclass(frozen=True)
class Assignment:
    """A pod set's TopologyAssignment, decoded: the node label keys and the domains at the lowest level."""

    levels: tuple[str, ...]
    domains: tuple[Domain, ...]

    @property
    def pods(self) -> int:
        return sum(domain.pods for domain in self.domains)


def _level_values(entry: Mapping[str, Any], count: int) -> list[str]:
    if entry.get("universal") is not None:
        return [str(entry["universal"])] * count
    individual = entry.get("individual") or {}
    prefix, suffix = str(individual.get("prefix") or ""), str(individual.get("suffix") or "")
    return [f"{prefix}{root}{suffix}" for root in individual.get("roots") or ()]


def _pod_counts(counts: Mapping[str, Any], count: int) -> list[int]:
    if counts.get("universal") is not None:
        return [int(counts["universal"])] * count
    return [int(found) for found in counts.get("individual") or ()]


def decode(topology_assignment: Mapping[str, Any]) -> Assignment:
    """A `topologyAssignment` (v1beta2: levels, and slices of domainCount, valuesPerLevel, podCounts)."""
    levels = tuple(str(level) for level in topology_assignment.get("levels") or ())
    domains: list[Domain] = []
    for piece in topology_assignment.get("slices") or ():
        count = int(piece.get("domainCount") or 0)
        columns = [_level_values(entry, count) for entry in piece.get("valuesPerLevel") or ()]
        pods = _pod_counts(piece.get("podCounts") or {}, count)
        for index in range(count):
            domains.append(Domain(tuple(column[index] for column in columns), pods[index]))
    return Assignment(levels, tuple(domains))


def assigned_domains(workload: Mapping[str, Any]) -> Assignment | None:
    """The decoded assignment of the Workload's (one) pod set, or None when Kueue assigned no topology."""
    admission = (workload.get("status") or {}).get("admission") or {}
    for pod_set in admission.get("podSetAssignments") or ():
        if pod_set.get("topologyAssignment"):
            return decode(pod_set["topologyAssignment"])
    return None


@dataclasses.dataclass(frozen=True)
class AssignedNodes:
    """The nodes an assignment names, each once, in name order; or the rule it breaks."""

    nodes: tuple[str, ...]
    broken: str | None = None


def assigned_nodes(assignment: Assignment, nodes: Mapping[str, Mapping[str, str]]) -> AssignedNodes:
    """The node names of the assignment's pods (`nodes`: each known node's labels). A domain above the hostname
    level takes its pods' count of the domain's nodes in name order (Kueue counted capacity, not names)."""
    chosen: list[str] = []
    for domain in assignment.domains:
        pairs = list(zip(assignment.levels, domain.values, strict=True))
        if assignment.levels and assignment.levels[-1] == HOSTNAME:
            if domain.pods > 1:
                return AssignedNodes((), f"one pod per node: Kueue assigned {domain.pods} pods to {domain.values[-1]}")
            chosen.append(domain.values[-1])
            continue
        members = sorted(
            name for name, labels in nodes.items() if name not in chosen and all(labels.get(k) == v for k, v in pairs)
        )
        if len(members) < domain.pods:
            where = ", ".join(f"{k}={v}" for k, v in pairs)
            return AssignedNodes((), f"one pod per node: {domain.pods} pods in {where}, which has {len(members)} nodes")
        chosen += members[: domain.pods]
    return AssignedNodes(tuple(sorted(chosen)))


def broken_rule(
    nodes: Sequence[str], labels: Mapping[str, Mapping[str, str]], tensor: int, gpus_per_node: int, nvlink: str | None
) -> str | None:
    """The hard rule of the layout these assigned nodes break, or None: a tensor group larger than a node needs
    tensor/gpusPerNode nodes of one NVLink domain (spec.topology.nvlinkDomainLabel) for every group."""
    if tensor <= gpus_per_node:
        return None
    per_group = tensor // gpus_per_node
    if nvlink is None:
        return f"tensor group in one NVLink domain: tensor {tensor} spans nodes of {gpus_per_node} GPUs"
    domains = Counter(labels.get(node, {}).get(nvlink, "") for node in nodes)
    split = sorted(domain or "(none)" for domain, count in domains.items() if not domain or count % per_group)
    if split:
        return (
            f"tensor group in one NVLink domain: the assigned nodes of {nvlink} {', '.join(split)} cannot hold "
            f"whole tensor groups of {per_group} nodes; add {nvlink} as a level of the Kueue Topology"
        )
    return None


def awaiting_replacement(
    nodes: Sequence[str], workload: Mapping[str, Any], known: frozenset[str], not_ready: frozenset[str]
) -> list[str]:
    """The assigned nodes Kueue is to replace, or may yet: those in the Workload's `status.unhealthyNodes`, gone
    from the cluster, or NotReady. Kueue's TASFailedNodeReplacement (beta, on by default in v0.17.0) marks such a
    node unhealthy (at once when it is gone or its pods ended, else 30 s after NotReady) and rewrites the
    assignment in place with a node of the same required domain, or evicts the Workload when it finds none
    (TASFailedNodeReplacementFailFast); so the gang waits for the new assignment instead of giving the quota back."""
    unhealthy = {str(node.get("name")) for node in (workload.get("status") or {}).get("unhealthyNodes") or ()}
    return sorted(node for node in nodes if node in unhealthy or node not in known or node in not_ready)
