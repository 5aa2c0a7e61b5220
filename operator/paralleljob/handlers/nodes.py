"""What the operator remembers of Nodes between watch events: the planner's record of each (`NodeInfo`), the
slim Node dict the network detection reads (name, labels, allocatable), which nodes exist and which are
NotReady (with since when, as the API server reports the Ready condition's transition), which carry the
`node.kubernetes.io/out-of-service` taint, and whether an event changed anything the planner reads (so
heartbeats do not trigger re-planning).

Fed by the Node informer (`paralleljob.k8s.informer`): rebuilt from its listing after every operator restart
and every relist; it is a cache of the cluster, never the source of a decision the API could contradict.
The rest of a Node object (images, conditions other than Ready, addresses) is never kept.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from paralleljob.manifests import timestamps
from paralleljob.planning.inventory import NodeInfo, node_info, sort_nodes

# Set by a cluster admin on a node known to be shut down: its pods may be force-deleted (KEP-2268).
OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"


@dataclasses.dataclass(frozen=True)
class NodeSnapshot:
    """The nodes at one moment: records in natural name order, and each one's slim Node dict."""

    infos: tuple[NodeInfo, ...] = ()
    dicts: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    # NotReady nodes, with since when (RFC 3339), and the nodes tainted out-of-service.
    not_ready_since: Mapping[str, str] = dataclasses.field(default_factory=dict)
    out_of_service: frozenset[str] = frozenset()

    @functools.cached_property
    def known(self) -> frozenset[str]:
        return frozenset(self.dicts)

    @functools.cached_property
    def not_ready(self) -> frozenset[str]:
        return frozenset(info.name for info in self.infos if not info.ready)


class NodeWatch:
    """Node records by name; `observe()` a watch event, `replace()` from a listing, `snapshot()` to plan."""

    def __init__(self) -> None:
        self._infos: dict[str, NodeInfo] = {}
        self._dicts: dict[str, dict[str, Any]] = {}
        self._not_ready_since: dict[str, str] = {}
        self._out_of_service: set[str] = set()
        self._snapshot: NodeSnapshot | None = NodeSnapshot()
        self._lock = threading.Lock()

    def observe(self, event_type: str, node: Mapping[str, Any]) -> bool:
        """Record a watch event; True when it changes what planning or the gang policy sees."""
        name = str(node["metadata"]["name"])
        with self._lock:
            if event_type == "DELETED":
                return self._forget(name)
            return self._record(name, node)

    def replace(self, nodes: Iterable[Mapping[str, Any]]) -> int:
        """Become exactly these nodes (a listing, possibly a generator over pages); returns how many changed."""
        seen: set[str] = set()
        changed = 0
        for node in nodes:
            name = str(node["metadata"]["name"])
            seen.add(name)
            with self._lock:
                changed += self._record(name, node)
        with self._lock:
            for name in [name for name in self._infos if name not in seen]:
                changed += self._forget(name)
        return changed

    def snapshot(self) -> NodeSnapshot:
        """The current nodes; the same object until a node changes, so its sorting is paid once per change."""
        with self._lock:
            if self._snapshot is None:
                self._snapshot = NodeSnapshot(
                    sort_nodes(self._infos.values()),
                    dict(self._dicts),
                    dict(self._not_ready_since),
                    frozenset(self._out_of_service),
                )
            return self._snapshot

    def known(self) -> frozenset[str]:
        """Every node seen and not deleted (empty until the first listing arrives)."""
        return self.snapshot().known

    def not_ready(self) -> frozenset[str]:
        return self.snapshot().not_ready

    def _record(self, name: str, node: Mapping[str, Any]) -> bool:
        info = node_info(node)
        slim = _slim(node, info)
        health = self._record_health(name, node, info.ready)
        if self._infos.get(name) == info and self._dicts.get(name) == slim and not health:
            return False
        self._infos[name] = info
        self._dicts[name] = slim
        self._snapshot = None
        return True

    def _record_health(self, name: str, node: Mapping[str, Any], ready: bool) -> bool:
        """Note since when the node is NotReady and whether it is out of service; True when either changed."""
        before = (self._not_ready_since.get(name), name in self._out_of_service)
        if ready:
            self._not_ready_since.pop(name, None)
        elif name not in self._not_ready_since:
            self._not_ready_since[name] = _ready_transition(node) or timestamps.now()
        if out_of_service(node):
            self._out_of_service.add(name)
        else:
            self._out_of_service.discard(name)
        return before != (self._not_ready_since.get(name), name in self._out_of_service)

    def _forget(self, name: str) -> bool:
        self._not_ready_since.pop(name, None)
        self._out_of_service.discard(name)
        self._dicts.pop(name, None)
        if self._infos.pop(name, None) is None:
            return False
        self._snapshot = None
        return True


def out_of_service(node: Mapping[str, Any]) -> bool:
    """Whether the Node carries the out-of-service taint."""
    return any(taint.get("key") == OUT_OF_SERVICE_TAINT for taint in (node.get("spec") or {}).get("taints") or ())


def shut_down(node: Mapping[str, Any]) -> bool:
    """Whether the Node is declared shut down: NotReady and tainted out-of-service (KEP-2268)."""
    return not node_info(node).ready and out_of_service(node)


def _slim(node: Mapping[str, Any], info: NodeInfo) -> dict[str, Any]:
    """The parts of a Node the manifests read (labels shared with the record, allocatable)."""
    allocatable = (node.get("status") or {}).get("allocatable") or (node.get("status") or {}).get("capacity") or {}
    return {
        "metadata": {"name": info.name, "labels": info.labels},
        "status": {"allocatable": {str(k): str(v) for k, v in allocatable.items()}},
    }


def _ready_transition(node: Mapping[str, Any]) -> str | None:
    """When the node's Ready condition last changed, as the API server reports it (None when it does not say)."""
    for condition in (node.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "Ready" and condition.get("lastTransitionTime"):
            return str(condition["lastTransitionTime"])
    return None
