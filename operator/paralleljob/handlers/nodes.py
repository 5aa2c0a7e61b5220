"""What the operator remembers of Nodes between watch events: the planner's record of each (`NodeInfo`), the
slim Node dict the network detection reads (name, labels, allocatable), which nodes exist and which are
NotReady, and whether an event changed anything the planner reads (so heartbeats do not trigger re-planning).

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

from paralleljob.planning.inventory import NodeInfo, node_info, sort_nodes


@dataclasses.dataclass(frozen=True)
class NodeSnapshot:
    """The nodes at one moment: records in natural name order, and each one's slim Node dict."""

    infos: tuple[NodeInfo, ...] = ()
    dicts: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)

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
                self._snapshot = NodeSnapshot(sort_nodes(self._infos.values()), dict(self._dicts))
            return self._snapshot

    def known(self) -> frozenset[str]:
        """Every node seen and not deleted (empty until the first listing arrives)."""
        return self.snapshot().known

    def not_ready(self) -> frozenset[str]:
        return self.snapshot().not_ready

    def _record(self, name: str, node: Mapping[str, Any]) -> bool:
        info = node_info(node)
        slim = _slim(node, info)
        if self._infos.get(name) == info and self._dicts.get(name) == slim:
            return False
        self._infos[name] = info
        self._dicts[name] = slim
        self._snapshot = None
        return True

    def _forget(self, name: str) -> bool:
        self._dicts.pop(name, None)
        if self._infos.pop(name, None) is None:
            return False
        self._snapshot = None
        return True


def _slim(node: Mapping[str, Any], info: NodeInfo) -> dict[str, Any]:
    """The parts of a Node the manifests read (labels shared with the record, allocatable)."""
    allocatable = (node.get("status") or {}).get("allocatable") or (node.get("status") or {}).get("capacity") or {}
    return {
        "metadata": {"name": info.name, "labels": info.labels},
        "status": {"allocatable": {str(k): str(v) for k, v in allocatable.items()}},
    }
