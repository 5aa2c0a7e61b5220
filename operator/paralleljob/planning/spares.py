"""Hot spares (spec.failurePolicy.spareNodes): which free nodes a plan keeps for a job beyond its own, and which
spare takes a lost node rank's place.

Both choices are the cost model's: a spare is priced as the plan with it in the place of the node rank it would
replace (`choose_spares` at planning, `cheapest_replacement` when a node is lost). Candidates are grouped by
their NVLink domain and network path, since nodes with the same site cost the same, and only the few groups
nearest the replaced node are priced, so choosing spares costs a pass over the free nodes plus a few pricings
per spare. Spares are spread over the job's leaves, the most populated first, so that any lost node has one
nearby. When a tensor group spans nodes (multi-node NVLink), a spare must be in the replaced node's NVLink
domain: anything else would stretch a tensor group over the network. Called by the planner and the operator;
pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from paralleljob.planning import levels as levels_mod
from paralleljob.planning.costmodel import LEVEL_NAMES, Site, price_reached, rank_groups, reach, span_level
from paralleljob.planning.estimates import CommBytes
from paralleljob.planning.inventory import NodeInfo
from paralleljob.planning.levels import LinkLevel
from paralleljob.planning.plan import Plan, SpareNode

# Site groups priced per spare, nearest first: a farther group is never cheaper than the nearer ones in
# practice, and pricing every leaf of a 4,000-node cluster for each spare would cost more than the plan.
PRICED_GROUPS = 3

# The plan's modeled communication seconds with one node rank moved to another site.
Price = Callable[[int, Site], float]
SiteKey = tuple[str, tuple[str, ...]]


def choose_spares(
    count: int, placed: Sequence[Site], free: Sequence[tuple[NodeInfo, Site]], cost: Price, *, same_nvlink: bool
) -> list[tuple[NodeInfo, int]]:
    """Up to `count` spares from `free` (qualifying nodes not in the plan, in name order, with their sites), each
    with the node rank it guards; `placed` are the plan's node ranks' sites, `cost` prices a move of one."""
    buckets: dict[SiteKey, list[NodeInfo]] = {}
    for node, site in free:
        buckets.setdefault((site.nvlink, site.path), []).append(node)
    for members in buckets.values():
        members.sort(key=lambda node: node.free_gpus)  # best fit first; the sort is stable, so name order next
    chosen: list[tuple[NodeInfo, int]] = []
    for rank in guarded_ranks(placed, count):
        taken = _cheapest(rank, placed, buckets, cost, same_nvlink)
        if taken is not None:
            chosen.append((taken, rank))
    return chosen


def guarded_ranks(placed: Sequence[Site], count: int) -> list[int]:
    """The node ranks to guard, one per spare: the first rank of each (NVLink domain, leaf), the most populated
    first, then a second round, and so on."""
    groups: dict[SiteKey, list[int]] = {}
    for rank, site in enumerate(placed):
        groups.setdefault((site.nvlink, site.path), []).append(rank)
    ordered = sorted(groups.values(), key=lambda ranks: (-len(ranks), ranks[0]))
    found: list[int] = []
    depth = 0
    while len(found) < count and ordered:
        found += [ranks[depth % len(ranks)] for ranks in ordered][: count - len(found)]
        depth += 1
    return found


def _cheapest(
    rank: int, placed: Sequence[Site], buckets: dict[SiteKey, list[NodeInfo]], cost: Price, same_nvlink: bool
) -> NodeInfo | None:
    target = placed[rank]
    keys = [key for key, members in buckets.items() if members and (not same_nvlink or key[0] == target.nvlink)]
    if not keys:
        return None
    keys.sort(key=lambda key: (-_nearness(target, key), key))
    best: tuple[float, int, SiteKey] | None = None
    for order, key in enumerate(keys[:PRICED_GROUPS]):
        priced = (round(cost(rank, Site(buckets[key][0].name, key[0], key[1])), 12), order, key)
        if best is None or priced < best:
            best = priced
    assert best is not None
    return buckets[best[2]].pop(0)


def _nearness(target: Site, key: SiteKey) -> int:
    """How close a site group is to the replaced node: the shared network depth, and its NVLink domain above all."""
    nvlink, path = key
    same_domain = bool(target.nvlink) and nvlink == target.nvlink
    return levels_mod.common_depth(target.path, path) + (len(path) + 1) * same_domain


def cheapest_replacement(plan: Plan, node_rank: int, spares: Sequence[SpareNode] | None = None) -> SpareNode | None:
    """The spare that costs least in node rank `node_rank`'s place, by the plan's own modeled bytes and
    bandwidths; None when no spare may take it (none left, or none in its NVLink domain when a tensor group
    spans nodes)."""
    spares = plan.spares if spares is None else spares
    sites = [plan_site(plan, entry.node, entry.domains) for entry in plan.nodes]
    target = sites[node_rank]
    same_nvlink = plan.layout.tensor > plan.ranks_per_node
    allowed = [spare for spare in spares if not same_nvlink or _nvlink_of(plan, spare.domains) == target.nvlink]
    if not allowed:
        return None
    volume = CommBytes(**{kind: float(plan.estimates.bytes_per_step.get(kind, 0.0)) for kind in _KINDS})
    cost = ReplacementPrice(
        plan.ranks_per_node, sites, rank_groups(plan.layout, plan.ranks_per_node), volume, _bandwidths(plan)
    )

    def priced(spare: SpareNode) -> tuple[float, int, str]:
        site = plan_site(plan, spare.node, spare.domains)
        return round(cost(node_rank, site), 12), -_nearness(target, (site.nvlink, site.path)), spare.node

    return min(allowed, key=priced)


class ReplacementPrice:
    """The cost model's price of a plan with one node rank moved to another site (`Price`): the groups that node
    rank is in are reached again, the rest are kept from the plan, so a move costs a few groups, not the plan."""

    def __init__(
        self,
        ranks_per_node: int,
        sites: Sequence[Site],
        groups: Mapping[str, list[list[int]]],
        volume: CommBytes,
        bandwidths: Mapping[LinkLevel, float],
    ) -> None:
        self._per_node, self._sites, self._groups = ranks_per_node, list(sites), groups
        self._volume, self._bandwidths = volume, bandwidths
        self._reached = reach(ranks_per_node, sites, groups)
        self._touching: dict[str, dict[int, list[int]]] = {}
        for kind, members in groups.items():
            index: dict[int, list[int]] = {}
            for number, group in enumerate(members):
                for node_rank in {rank // ranks_per_node for rank in group}:
                    index.setdefault(node_rank, []).append(number)
            self._touching[kind] = index

    def __call__(self, node_rank: int, site: Site) -> float:
        sites = list(self._sites)
        sites[node_rank] = site
        reached: dict[str, list[LinkLevel]] = {}
        for kind, levels in self._reached.items():
            touched = self._touching[kind].get(node_rank, ())
            if touched:
                levels = list(levels)
                for number in touched:
                    levels[number] = span_level([sites[rank // self._per_node] for rank in self._groups[kind][number]])
            reached[kind] = levels
        return price_reached(reached, self._volume, self._bandwidths).total


_KINDS = ("tensor", "pipeline", "data")


def plan_site(plan: Plan, node: str, domains: Mapping[str, str]) -> Site:
    """A node's site as the plan recorded it (its `domains`)."""
    path = tuple(domains.get(level) or levels_mod.unlabelled(node) for level in plan.levels)
    return Site(node, _nvlink_of(plan, domains), path)


def _nvlink_of(plan: Plan, domains: Mapping[str, str]) -> str:
    return domains.get(plan.nvlink_domain_label, "") if plan.nvlink_domain_label else ""


def _bandwidths(plan: Plan) -> dict[LinkLevel, float]:
    """Bytes per second per GPU at each link level, from the plan's recorded assumptions (GB/s)."""
    recorded = plan.estimates.assumptions.get("bandwidthGBps") or {}
    return {LEVEL_NAMES[name]: float(gbps) * 1e9 for name, gbps in recorded.items() if name in LEVEL_NAMES}
