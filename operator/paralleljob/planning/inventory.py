"""The cluster as the planner sees it: nodes, the GPUs already held on them, and their labels.

`build_cluster()` turns Kubernetes objects (Node dicts as `kubectl get nodes -o yaml` prints them, bound Pod
dicts, and the reservations of other ParallelJobs not yet bound, which `job_reservations()` reads from
ParallelJob dicts) into a `Cluster` of `NodeInfo`, counting pods through the usage index
(`paralleljob.planning.usage`); the operator, which keeps node records and the index from its watches,
assembles clusters with a `ClusterBuilder` instead. This is the parsing step; everything after it
(`paralleljob.planning.planner`) reads only these frozen records.
The CLI, the operator and the local runner build clusters here; `local_cluster_nodes()` makes the Node dicts
the local runner simulates.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
import sys
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from paralleljob.planning.usage import (
    GPU_RESOURCE,
    TERMINAL_POD_PHASES,
    NodeUsage,
    UsageIndex,
    claim_of,
    milli_quantity,
)

__all__ = ["GPU_RESOURCE", "TERMINAL_POD_PHASES"]  # re-exported: callers read them here

PRODUCT_LABEL = "nvidia.com/gpu.product"
MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB, as NVIDIA GPU Feature Discovery writes it
TERMINAL_JOB_PHASES = frozenset({"Succeeded", "Failed"})
BLOCKING_TAINT_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
_DIGITS = re.compile(r"(\d+)")
_TYPED_LISTS = frozenset({"NodeList", "PodList", "ParallelJobList"})


@dataclasses.dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str

    def render(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


@dataclasses.dataclass(frozen=True)
class Reservation:
    """GPUs promised to another ParallelJob's plan whose pods are not bound yet."""

    node: str
    gpus: int
    holder: str = "another ParallelJob"  # the ParallelJob's name, shown in unschedulable messages


@dataclasses.dataclass(frozen=True, slots=True)
class NodeInfo:
    """What the planner reads from one Node, with the GPUs already held on it subtracted."""

    name: str
    labels: Mapping[str, str]
    allocatable_gpus: int
    used_gpus: int = 0
    holders: tuple[str, ...] = ()  # names of the bound pods that hold GPUs here
    reserved_by: tuple[str, ...] = ()  # names of the unbound ParallelJobs whose plans hold GPUs here
    ready: bool = True
    unschedulable: bool = False
    taints: tuple[Taint, ...] = ()
    product: str = ""  # nvidia.com/gpu.product
    gpu_memory_mib: int | None = None  # nvidia.com/gpu.memory
    # Every other allocatable resource (cpu, memory, rdma/..., vpc.amazonaws.com/efa), and what bound pods
    # request of them, in milli-units (`usage.milli_quantity`), sorted by name.
    allocatable: tuple[tuple[str, int], ...] = ()
    requested: tuple[tuple[str, int], ...] = ()
    free_gpus: int = dataclasses.field(init=False)
    free_resources: Mapping[str, int] = dataclasses.field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        # Read once here rather than in every planning pass over thousands of nodes.
        object.__setattr__(self, "free_gpus", max(0, self.allocatable_gpus - self.used_gpus))
        requested = dict(self.requested)
        free = {name: amount - requested.get(name, 0) for name, amount in self.allocatable}
        object.__setattr__(self, "free_resources", free)

    def free(self, resource: str) -> int | None:
        """Milli-units of `resource` not requested by bound pods; None when the node does not list it."""
        return self.free_resources.get(resource)


class ClusterObjects(NamedTuple):
    """Node, Pod and ParallelJob dicts found in YAML documents (`split_objects`)."""

    nodes: list[Mapping[str, Any]]
    pods: list[Mapping[str, Any]]
    jobs: list[Mapping[str, Any]]


@dataclasses.dataclass(frozen=True)
class Cluster:
    """Every node, in natural name order (the order a topology-oblivious scheduler would fill them in)."""

    nodes: tuple[NodeInfo, ...]

    def __len__(self) -> int:
        return len(self.nodes)

    def by_name(self) -> dict[str, NodeInfo]:
        return {node.name: node for node in self.nodes}


def build_cluster(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]] = (),
    reservations: Iterable[Reservation] = (),
) -> Cluster:
    """A Cluster from Node dicts, bound Pod dicts and other jobs' reservations (camelCase, as kubectl prints).

    A pod listed twice (same namespace and name, e.g. read live and from a file) counts once: the last copy.
    """
    return ClusterBuilder().build(
        sort_nodes(node_info(node) for node in nodes), UsageIndex.of(pods).usage(), reservations
    )


def sort_nodes(infos: Iterable[NodeInfo]) -> tuple[NodeInfo, ...]:
    """Nodes in natural name order, so that the planner's passes over the nodes read memory in order."""
    return tuple(sorted(infos, key=lambda info: natural_key(info.name)))


class ClusterBuilder:
    """Builds Clusters from node records (no usage yet, in `sort_nodes` order), the usage index's totals and
    reservations, reusing the NodeInfo of every node whose record and usage are the same objects as last time:
    the operator's nodes and usage change a few at a time, so a pass over 10,000 nodes builds few records."""

    def __init__(self) -> None:
        self._memo: dict[str, tuple[NodeInfo, NodeUsage | None, NodeInfo]] = {}

    def build(
        self, infos: Iterable[NodeInfo], usage: Mapping[str, NodeUsage], reservations: Iterable[Reservation] = ()
    ) -> Cluster:
        reserved: dict[str, list[Reservation]] = {}
        for reservation in reservations:
            reserved.setdefault(reservation.node, []).append(reservation)
        memo, fresh = self._memo, {}
        built = []
        for info in infos:
            held = usage.get(info.name)
            cached = memo.get(info.name)
            if cached is not None and cached[0] is info and cached[1] is held:
                with_usage = cached[2]
            else:
                with_usage = _with_usage(info, held)
            fresh[info.name] = (info, held, with_usage)
            taken = reserved.get(info.name)
            built.append(_with_reservations(with_usage, taken) if taken else with_usage)
        self._memo = fresh
        return Cluster(tuple(built))


def _with_usage(info: NodeInfo, held: NodeUsage | None) -> NodeInfo:
    if held is None:
        return info
    return dataclasses.replace(
        info, used_gpus=info.used_gpus + held.gpus, holders=info.holders + held.holders, requested=held.requests
    )


def _with_reservations(info: NodeInfo, taken: Sequence[Reservation]) -> NodeInfo:
    return dataclasses.replace(
        info,
        used_gpus=info.used_gpus + sum(r.gpus for r in taken),
        reserved_by=info.reserved_by + tuple(r.holder for r in taken),
    )


def natural_key(name: str) -> tuple[tuple[int, str], ...]:
    """Sort key that puts local-2 before local-10, as people read node names."""
    return tuple((int(part), "") if part.isdigit() else (-1, part) for part in _DIGITS.split(name) if part)


def split_objects(documents: Iterable[Any]) -> ClusterObjects:
    """Nodes, Pods and ParallelJobs in YAML documents: single objects, NodeList, PodList, ParallelJobList or
    List, in any mix."""
    found = ClusterObjects([], [], [])
    for obj in _flatten(documents, ""):
        kind = obj.get("kind")
        if kind == "Node":
            found.nodes.append(obj)
        elif kind == "Pod":
            found.pods.append(obj)
        elif kind == "ParallelJob":
            found.jobs.append(obj)
    return found


def unique_objects(objects: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Objects without repeats of one (namespace, name): the last copy wins; objects without a name all stay."""
    named: dict[tuple[str, str], Mapping[str, Any]] = {}
    anonymous: list[Mapping[str, Any]] = []
    for obj in objects:
        metadata = obj.get("metadata") or {}
        if metadata.get("name"):
            key = (str(metadata.get("namespace") or ""), str(metadata["name"]))
            named.pop(key, None)  # a later copy takes the place of the earlier one
            named[key] = obj
        else:
            anonymous.append(obj)
    return [*named.values(), *anonymous]


def job_reservations(
    jobs: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]] = (),
    exclude: tuple[str, str] | None = None,
    *,
    bound: Collection[tuple[str, str]] | None = None,
    now: datetime.datetime | None = None,
) -> list[Reservation]:
    """GPUs that placed, unfinished ParallelJobs hold on nodes where their pod is not bound yet, and that
    restarting gangs still hold on their old nodes during their grace period.

    Reads each ParallelJob dict's status (`placement[].node`, `placement[].pod`, `gpusPerNode`, `phase`,
    `spareNodes`, `heldNodes`, `heldUntil`), as the operator writes it for people: this is `paralleljob plan`'s estimate from
    what anyone can read. The operator itself plans around the jobs' attempt records
    (`manifests.records.reservations_of`), never their status; `exclude` is the (namespace, name) of the job being
    planned. A bound pod counts through its own GPU requests instead (the usage index subtracts it), so it
    reserves nothing here; `bound` names the (namespace, name) of the pods holding GPUs, else `pods` tells.
    """
    bound = bound if bound is not None else {_key(pod) for pod in pods if pod_gpu_claim(pod)[1]}
    now = now or datetime.datetime.now(datetime.UTC)
    found: list[Reservation] = []
    for job in unique_objects(jobs):
        key, status = _key(job), job.get("status") or {}
        if key == exclude or status.get("phase") in TERMINAL_JOB_PHASES:
            continue
        gpus = _int_or_none(status.get("gpusPerNode")) or 0
        holder = f"{key[0]}/{key[1]}"
        placement = status.get("placement")
        if isinstance(placement, list):
            for entry in placement:
                if (
                    isinstance(entry, Mapping)
                    and entry.get("node")
                    and (key[0], str(entry.get("pod") or "")) not in bound
                ):
                    found.append(Reservation(str(entry["node"]), gpus, holder))
            # Hot spares hold their GPUs while the job is placed: no pod of the job is bound there.
            found += [Reservation(str(node), gpus, holder) for node in status.get("spareNodes") or () if node]
        elif held_until(status) > now:
            found += [Reservation(str(node), gpus, holder) for node in status.get("heldNodes") or () if node]
    return found


def held_until(status: Mapping[str, Any]) -> datetime.datetime:
    """When a restarting gang's hold on its old nodes ends (`status.heldUntil`); long past when it has none."""
    try:
        return datetime.datetime.fromisoformat(str(status["heldUntil"]))
    except (KeyError, TypeError, ValueError):
        return datetime.datetime.min.replace(tzinfo=datetime.UTC)


def _flatten(documents: Iterable[Any], item_kind: str) -> Iterable[Mapping[str, Any]]:
    for obj in documents:
        if not isinstance(obj, Mapping):
            continue
        kind = str(obj.get("kind") or item_kind)
        if kind.endswith("List") or (not kind and "items" in obj):
            # Items of a NodeList, PodList or ParallelJobList may omit their own kind (the API client drops it).
            yield from _flatten(obj.get("items") or (), kind[: -len("List")] if kind in _TYPED_LISTS else "")
        elif kind == obj.get("kind"):
            yield obj
        else:
            yield {**obj, "kind": kind}


def node_info(
    node: Mapping[str, Any], held: Sequence[tuple[str, int]] = (), reserved: Sequence[tuple[str, int]] = ()
) -> NodeInfo:
    """One Node dict as a NodeInfo; `held` and `reserved` list (pod or job name, GPUs) already taken on it."""
    metadata = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    allocatable = status.get("allocatable") or status.get("capacity") or {}
    # Interned: every node repeats the same keys and most values, and the planner looks them up on every node.
    labels = {sys.intern(str(k)): sys.intern(str(v)) for k, v in (metadata.get("labels") or {}).items()}
    return NodeInfo(
        name=str(metadata.get("name", "")),
        labels=labels,
        product=labels.get(PRODUCT_LABEL, ""),
        gpu_memory_mib=_int_or_none(labels.get(MEMORY_LABEL)),
        allocatable_gpus=_int_or_none(allocatable.get(GPU_RESOURCE)) or 0,
        used_gpus=sum(gpus for _, gpus in held) + sum(gpus for _, gpus in reserved),
        holders=tuple(holder for holder, _ in held),
        reserved_by=tuple(holder for holder, _ in reserved),
        ready=_is_ready(status.get("conditions")),
        unschedulable=bool(spec.get("unschedulable", False)),
        taints=tuple(_taint(t) for t in spec.get("taints") or () if isinstance(t, Mapping)),
        allocatable=_other_resources(allocatable),
    )


def _other_resources(allocatable: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    """Allocatable resources other than GPUs, in milli-units (unparsable quantities are left out)."""
    found = []
    for resource, value in allocatable.items():
        amount = milli_quantity(value)
        if resource != GPU_RESOURCE and amount is not None:
            found.append((sys.intern(str(resource)), amount))
    return tuple(sorted(found))


def pod_gpu_claim(pod: Mapping[str, Any]) -> tuple[str | None, int]:
    """(node, GPUs) a bound, non-terminal pod holds; (None, 0) for pods that hold nothing."""
    claim = claim_of(pod)
    return (claim.node, claim.gpus) if claim is not None and claim.gpus else (None, 0)


def local_cluster_nodes(
    count: int, gpus_per_node: int, prefix: str = "local-", offers: Mapping[str, int] | None = None
) -> list[dict[str, Any]]:
    """Node dicts for `count` identical, Ready, flat-network nodes named local-0..N-1 (the local runner's),
    each offering `offers` besides its GPUs (milli-units: what one pod requests, which local processes get)."""
    extra = {resource: f"{amount}m" for resource, amount in (offers or {}).items()}
    return [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": f"{prefix}{i}", "labels": {"kubernetes.io/hostname": f"{prefix}{i}"}},
            "status": {
                "allocatable": {GPU_RESOURCE: str(gpus_per_node), **extra},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
        for i in range(count)
    ]


def tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Taint) -> bool:
    """Kubernetes toleration matching for one taint."""
    return any(_toleration_matches(toleration, taint) for toleration in tolerations)


def _toleration_matches(toleration: Mapping[str, Any], taint: Taint) -> bool:
    effect = toleration.get("effect") or ""
    if effect and effect != taint.effect:
        return False
    key = toleration.get("key") or ""
    if toleration.get("operator") == "Exists":
        return not key or key == taint.key
    return key == taint.key and str(toleration.get("value") or "") == taint.value


def _is_ready(conditions: Any) -> bool:
    # Hand-written cluster files may omit conditions; a node without a Ready condition counts as Ready.
    for condition in conditions or ():
        if isinstance(condition, Mapping) and condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return True


def _taint(raw: Mapping[str, Any]) -> Taint:
    return Taint(str(raw.get("key", "")), str(raw.get("value") or ""), str(raw.get("effect", "")))


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    metadata = obj.get("metadata") or {}
    return str(metadata.get("namespace") or ""), str(metadata.get("name") or "")


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None
