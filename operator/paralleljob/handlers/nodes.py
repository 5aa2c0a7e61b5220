"""What the operator remembers of Nodes between watch events: which exist, which are NotReady, and whether
an event changed anything the planner reads (so heartbeats do not trigger re-planning).

Rebuilt from the watch's initial listing after every operator restart; it is a cache of the cluster, never
the source of a decision the API could contradict.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from paralleljob.planning.inventory import node_info

Signature = tuple[Any, ...]


class NodeWatch:
    """Readiness and planning-relevant signature per node name."""

    def __init__(self) -> None:
        self._signatures: dict[str, Signature] = {}
        self._lock = threading.Lock()

    def observe(self, event_type: str, node: Mapping[str, Any]) -> bool:
        """Record a watch event; True when it changes what planning or the gang policy sees."""
        name = str(node["metadata"]["name"])
        with self._lock:
            if event_type == "DELETED":
                return self._signatures.pop(name, None) is not None
            info = node_info(node, [])
            signature = (
                info.ready,
                info.unschedulable,
                info.allocatable_gpus,
                info.taints,
                tuple(sorted(info.labels.items())),
            )
            changed = self._signatures.get(name) != signature
            self._signatures[name] = signature
            return changed

    def known(self) -> frozenset[str]:
        """Every node seen and not deleted (empty until the watch's first listing arrives)."""
        with self._lock:
            return frozenset(self._signatures)

    def not_ready(self) -> frozenset[str]:
        with self._lock:
            return frozenset(name for name, signature in self._signatures.items() if not signature[0])
