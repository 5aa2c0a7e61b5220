"""The network levels of a cluster: which node labels name its domains, coarse to fine, and how far apart two
nodes are in the fabric.

`detect_levels()` applies the documented rule (docs/planning.md, "Network levels") when spec.topology.levels
is unset, and `detect_nvlink_label()` the one for spec.topology.nvlinkDomainLabel; `path_of()` gives a node's
domains, `level_of_depth()` classifies the link between nodes for the cost model. Called by the planner.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Sequence

from paralleljob.planning.inventory import NodeInfo

ZONE = "topology.kubernetes.io/zone"
GKE = ("cloud.google.com/gce-topology-block", "cloud.google.com/gce-topology-subblock")
EKS = (
    "topology.k8s.aws/network-node-layer-1",
    "topology.k8s.aws/network-node-layer-2",
    "topology.k8s.aws/network-node-layer-3",
)
NVIDIA_PREFIX = "network.topology.nvidia.com/"
NVIDIA = tuple(f"{NVIDIA_PREFIX}{name}" for name in ("core", "spine", "block", "leaf"))
# Topograph's accelerator label names the multi-node NVLink domain (e.g. a GB200 NVL72 rack), not a switch.
TOPOGRAPH_NVLINK = f"{NVIDIA_PREFIX}accelerator"
# Label families in the order they are tried; the first family with a label on any node wins.
FAMILIES = (GKE, EKS, NVIDIA)


class LinkLevel(enum.IntEnum):
    """How far apart two ranks are, nearest first; the cost model gives each its bandwidth."""

    NODE = 0  # same node: NVLink / NVSwitch
    NVLINK = 1  # different nodes in one multi-node NVLink domain
    LEAF = 2  # same finest network domain (one leaf switch)
    BLOCK = 3  # same top-level domain, different leaves
    TOP = 4  # different top-level domains


def label_keys(nodes: Iterable[NodeInfo]) -> set[str]:
    """Every label key on any node: what `detect_levels` and `detect_nvlink_label` read, gathered in one pass."""
    present: set[str] = set()
    for node in nodes:
        present.update(node.labels)
    return present


def detect_levels(present: Collection[str]) -> tuple[str, ...]:
    """Label keys naming the network domains, coarse to fine, recognised among the label keys present."""
    for family in FAMILIES:
        found = tuple(key for key in family if key in present)
        if found:
            return _with_zone(found, present)
    return (ZONE,) if ZONE in present else ()


def detect_nvlink_label(present: Collection[str]) -> str | None:
    """The NVLink domain label when spec.topology.nvlinkDomainLabel is unset: Topograph's, if any node has it."""
    return TOPOGRAPH_NVLINK if TOPOGRAPH_NVLINK in present else None


def _with_zone(found: tuple[str, ...], present: Collection[str]) -> tuple[str, ...]:
    # A job should not straddle zones either, so the zone stays the coarsest level when nodes carry it.
    return (ZONE, *found) if ZONE in present else found


def path_of(node: NodeInfo, levels: Sequence[str]) -> tuple[str, ...]:
    """The node's domain at each level, coarse to fine.

    Where a label is missing the node is a domain of its own (`unlabelled()`): nothing says it shares a switch
    with the other unlabelled nodes, so they must not look like one domain.
    """
    path = tuple(map(node.labels.get, levels))
    if None in path or "" in path:
        return tuple(value or unlabelled(node.name) for value in path)
    return path  # type: ignore[return-value]  # no None left


def unlabelled(node_name: str) -> str:
    """The domain of a node that lacks a level's label; ':' cannot occur in a label value, so it never clashes."""
    return f"node:{node_name}"


def common_depth(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    """How many levels, from the top, two paths share."""
    depth = 0
    for x, y in zip(a, b, strict=True):
        if x != y:
            break
        depth += 1
    return depth


def level_of_depth(depth: int, levels: int) -> LinkLevel:
    """The link level between two different, non-NVLink-sharing nodes whose paths share `depth` levels."""
    if depth >= levels:
        return LinkLevel.LEAF
    return LinkLevel.BLOCK if depth > 0 else LinkLevel.TOP
