"""Choosing the nodes of a job and their order in the fabric.

A *unit* is what must share an NVLink domain: one node, or, when a tensor group is larger than a node,
tensor/ranksPerNode nodes of one NVLink domain (`make_units`). `select_units` picks the units best-fit,
top-down in the domain tree: the smallest single domain at the finest level that holds the whole job, then,
inside it, whole children largest first and the smallest child that holds the remainder (so a part-used leaf
is taken before a whole free one is broken up). `orderings` lists the candidate node orders the cost model
then prices. Called by the planner; pure and O(n log n) in nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from paralleljob.planning import levels as levels_mod
from paralleljob.planning.inventory import NodeInfo

Path = tuple[str, ...]


class Member(NamedTuple):
    """One unit: its nodes (in rank order), network path, spare GPUs left over, and its name order for ties."""

    path: Path
    spare: int
    order: int
    nodes: tuple[NodeInfo, ...]


def make_units(
    nodes: Sequence[NodeInfo], levels: Sequence[str], gpus: int, size: int, nvlink_label: str | None
) -> tuple[list[Member], int]:
    """Units of `size` nodes sharing an NVLink domain, and how many nodes were left over.

    `nodes` come in name order; a unit's `order` is its first node's place in it.
    """
    if size == 1:
        return [Member(levels_mod.path_of(n, levels), n.free_gpus - gpus, i, (n,)) for i, n in enumerate(nodes)], 0
    place = {node.name: i for i, node in enumerate(nodes)}
    domains: dict[str, list[NodeInfo]] = {}
    for node in nodes:
        domain = node.labels.get(nvlink_label or "", "")
        domains.setdefault(domain or f"node:{node.name}", []).append(node)
    units: list[Member] = []
    left_over = 0
    for members in domains.values():
        members.sort(key=lambda n: (levels_mod.path_of(n, levels), n.free_gpus, place[n.name]))
        whole = len(members) - len(members) % size
        left_over += len(members) - whole
        for start in range(0, whole, size):
            chunk = tuple(members[start : start + size])
            spare = sum(n.free_gpus - gpus for n in chunk)
            units.append(Member(levels_mod.path_of(chunk[0], levels), spare, place[chunk[0].name], chunk))
    return units, left_over


class _Tree:
    """Units grouped by domain prefix at every depth, with counts and spare GPUs per domain."""

    def __init__(self, units: Sequence[Member], depth: int) -> None:
        self.depth = depth
        self.leaves: dict[Path, list[Member]] = {}
        for unit in units:
            self.leaves.setdefault(unit.path, []).append(unit)
        self.size: dict[Path, list[int]] = {}  # prefix -> [units, spare GPUs]
        self.children: dict[Path, list[Path]] = {}
        for path, members in self.leaves.items():
            spare = sum(member.spare for member in members)
            for cut in range(depth + 1):
                prefix = path[:cut]
                entry = self.size.get(prefix)
                if entry is None:
                    self.size[prefix] = [len(members), spare]
                    if cut:
                        self.children.setdefault(path[: cut - 1], []).append(prefix)
                else:
                    entry[0] += len(members)
                    entry[1] += spare

    def key(self, prefix: Path) -> tuple[int, int, Path]:
        count, spare = self.size[prefix]
        return count, spare, prefix

    def smallest_domain_holding(self, need: int) -> Path | None:
        """The best-fit domain at the finest level where one domain holds `need` units."""
        for cut in range(self.depth, -1, -1):
            fits = [p for p in self.size if len(p) == cut and self.size[p][0] >= need]
            if fits:
                return min(fits, key=self.key)
        return None

    def take(self, prefix: Path, need: int) -> list[Member]:
        if len(prefix) == self.depth:
            members = sorted(self.leaves[prefix], key=lambda m: (m.spare, m.order))
            return members[:need]
        children = self.children[prefix]
        holding = [c for c in children if self.size[c][0] >= need]
        if holding:
            return self.take(min(holding, key=self.key), need)
        return self._take_spread(children, need)

    def _take_spread(self, children: list[Path], need: int) -> list[Member]:
        # Whole children, largest first, until the remainder fits in one; that one is the best fit.
        remaining = sorted(children, key=lambda c: (-self.size[c][0], self.size[c][1], c))
        taken: list[Member] = []
        while need > 0:
            holding = [c for c in remaining if self.size[c][0] >= need]
            if holding:
                return taken + self.take(min(holding, key=self.key), need)
            child = remaining.pop(0)
            taken += self.take(child, self.size[child][0])
            need -= self.size[child][0]
        return taken


def select_units(units: Sequence[Member], need: int, depth: int) -> list[Member] | None:
    """`need` units in as few domains as possible at every level; None when there are too few."""
    if len(units) < need:
        return None
    tree = _Tree(units, depth)
    domain = tree.smallest_domain_holding(need)
    return None if domain is None else tree.take(domain, need)


def orderings(chosen: Sequence[Member]) -> list[list[Member]]:
    """Candidate unit orders: by network path; leaves largest first; leaves smallest first."""
    by_path = sorted(chosen, key=lambda m: (m.path, m.order))
    leaves: dict[Path, list[Member]] = {}
    for member in by_path:
        leaves.setdefault(member.path, []).append(member)
    groups = list(leaves.values())
    # Leaves stay grouped under their parent domain; only their order inside it changes.
    largest = [m for g in sorted(groups, key=lambda g: (g[0].path[:-1], -len(g), g[0].path)) for m in g]
    smallest = [m for g in sorted(groups, key=lambda g: (g[0].path[:-1], len(g), g[0].path)) for m in g]
    unique: list[list[Member]] = []
    for order in (by_path, largest, smallest):
        if order not in unique:
            unique.append(order)
    return unique
