"""The placement cost model: what one training step's communication costs on a given node order.

Each group (tensor, pipeline pair, data) moves the bytes of `estimates.comm_bytes()` over the slowest link it
spans (`levels.LinkLevel`); a kind of group costs as much as its slowest group, since every step waits for it.
Link bandwidths come per GPU product (`GPU_PROFILES`) and can be overridden (`CostModel.bandwidths`).
The planner calls `price()` on every candidate order; docs/planning.md documents the numbers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from paralleljob.planning import estimates, levels
from paralleljob.planning.levels import LinkLevel
from paralleljob_contract.efficiency import PEAK_BF16_TFLOPS
from paralleljob_contract.layout import Coord, Layout

GB = 1e9


@dataclasses.dataclass(frozen=True)
class GpuProfile:
    """Public per-GPU figures: NVLink and network bandwidth (GB/s) and dense bf16 peak (TFLOP/s)."""

    match: str
    nvlink_gbps: float
    network_gbps: float
    peak_tflops: float


# First match wins (substring of nvidia.com/gpu.product, case-insensitive). Network: one NIC per GPU,
# HDR 200 Gb/s for A100 systems, NDR 400 Gb/s for H100 and later. Peaks are the contract's table, which the
# trainer's MFU reads too.
GPU_PROFILES = (
    GpuProfile("GB200", 1800, 50, PEAK_BF16_TFLOPS["GB200"]),
    GpuProfile("B200", 1800, 50, PEAK_BF16_TFLOPS["B200"]),
    GpuProfile("H200", 900, 50, PEAK_BF16_TFLOPS["H200"]),
    GpuProfile("H100", 900, 50, PEAK_BF16_TFLOPS["H100"]),
    GpuProfile("A100", 600, 25, PEAK_BF16_TFLOPS["A100"]),
    GpuProfile("L40S", 32, 12.5, PEAK_BF16_TFLOPS["L40S"]),
)
DEFAULT_PROFILE = GpuProfile("", 300, 12.5, 100)
LEVEL_NAMES: dict[str, LinkLevel] = {level.name.lower(): level for level in LinkLevel}


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Assumptions of the cost and step-time models; every field is documented in docs/planning.md."""

    # GB/s per GPU by level name (node, nvlink, leaf, block, top); overrides the product's defaults.
    bandwidths: Mapping[str, float] = dataclasses.field(default_factory=dict)
    block_factor: float = 0.5  # leaf-to-leaf through a 2:1 oversubscribed spine
    top_factor: float = 0.25  # across top-level domains
    kernel_efficiency: float = 0.55  # share of peak the matmuls reach
    peak_tflops: float | None = None  # overrides the product's peak

    def profile(self, product: str) -> GpuProfile:
        upper = product.upper()
        return next((p for p in GPU_PROFILES if p.match in upper), DEFAULT_PROFILE)

    def link_bandwidths(self, product: str) -> dict[LinkLevel, float]:
        """Bytes per second per GPU at each link level."""
        profile = self.profile(product)
        leaf = profile.network_gbps
        defaults = {
            LinkLevel.NODE: profile.nvlink_gbps,
            LinkLevel.NVLINK: profile.nvlink_gbps,
            LinkLevel.LEAF: leaf,
            LinkLevel.BLOCK: leaf * self.block_factor,
            LinkLevel.TOP: leaf * self.top_factor,
        }
        for name, value in self.bandwidths.items():
            defaults[LEVEL_NAMES[name]] = value
        return {level: gbps * GB for level, gbps in defaults.items()}

    def peak_flops(self, product: str) -> float:
        return (self.peak_tflops or self.profile(product).peak_tflops) * 1e12


@dataclasses.dataclass(frozen=True)
class Site:
    """Where a node rank sits: node name, NVLink domain and network path (coarse to fine)."""

    node: str
    nvlink: str
    path: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class CommCost:
    """Modeled seconds per step of each kind of communication, and the link levels they reach."""

    tensor: float
    pipeline: float
    data: float
    spread: float  # mean seconds over all groups: breaks ties between orders with equal bottlenecks
    tensor_level: LinkLevel
    pipeline_level: LinkLevel
    data_level: LinkLevel

    @property
    def total(self) -> float:
        return self.tensor + self.pipeline + self.data


def span_level(sites: Sequence[Site]) -> LinkLevel:
    """The slowest link level a group of node ranks spans."""
    first = sites[0]
    if all(site.node == first.node for site in sites):
        return LinkLevel.NODE
    if first.nvlink and all(site.nvlink == first.nvlink for site in sites):
        return LinkLevel.NVLINK
    depth = min(levels.common_depth(first.path, site.path) for site in sites)
    return levels.level_of_depth(depth, len(first.path))


def price(
    layout: Layout,
    ranks_per_node: int,
    sites: Sequence[Site],
    volume: estimates.CommBytes,
    bw: Mapping[LinkLevel, float],
    groups: Mapping[str, list[list[int]]] | None = None,
) -> CommCost:
    """Cost of one step's communication with node rank i on sites[i]; `groups` are `rank_groups(layout, ...)`,
    passed in when the caller prices several node orders of one layout."""
    groups = groups or rank_groups(layout, ranks_per_node)
    return price_reached(reach(ranks_per_node, sites, groups), volume, bw)


def reach(
    ranks_per_node: int, sites: Sequence[Site], groups: Mapping[str, list[list[int]]]
) -> dict[str, list[LinkLevel]]:
    """The link level each group of each kind spans, with node rank i on sites[i]. It depends on the layout
    and the node order only, not on the bytes, so the layout search prices many batch splits from one."""
    return {
        kind: [span_level([sites[r // ranks_per_node] for r in members]) for members in groups[kind]]
        for kind in ("tensor", "pipeline", "data")
    }


def price_reached(
    reached: Mapping[str, list[LinkLevel]], volume: estimates.CommBytes, bw: Mapping[LinkLevel, float]
) -> CommCost:
    """A kind of group costs what its slowest link level costs. Above the leaf, links are oversubscribed and
    shared: when a fraction f of a kind's groups reach a level, each gets min(1, factor / f) of the leaf
    bandwidth there (factor = bw[level] / bw[LEAF]), so fewer crossing groups cost less.
    """
    found: dict[str, tuple[float, LinkLevel]] = {}
    total, count = 0.0, 0
    for kind, nbytes in (("tensor", volume.tensor), ("pipeline", volume.pipeline), ("data", volume.data)):
        levels_reached = reached[kind]
        found[kind] = _kind_seconds(levels_reached, nbytes, bw)
        total += sum(nbytes / bw[lv] for lv in levels_reached)
        count += len(levels_reached)
    return CommCost(
        found["tensor"][0],
        found["pipeline"][0],
        found["data"][0],
        total / max(count, 1),
        found["tensor"][1],
        found["pipeline"][1],
        found["data"][1],
    )


def _kind_seconds(reached: list[LinkLevel], nbytes: float, bw: Mapping[LinkLevel, float]) -> tuple[float, LinkLevel]:
    """Seconds of the slowest group of one kind, with shared oversubscribed links; and the level it reaches."""
    if not reached:
        return 0.0, LinkLevel.NODE
    worst = 0.0
    for level in set(reached):
        effective = bw[level]
        if level > LinkLevel.LEAF:
            share = sum(1 for lv in reached if lv >= level) / len(reached)
            effective = bw[LinkLevel.LEAF] * min(1.0, bw[level] / bw[LinkLevel.LEAF] / share)
        worst = max(worst, nbytes / effective)
    return worst, max(reached)


def rank_groups(layout: Layout, ranks_per_node: int) -> dict[str, list[list[int]]]:
    """Representative rank groups: one per tensor group, per pipeline neighbour pair and per data group.

    Ranks of one tensor group that share a node see the same partners, so only the first rank of each
    node-sized slice of a tensor group (model index 0, G, 2G, ...) is priced.
    """
    p, t, d = layout.pipeline, layout.tensor, layout.data
    offsets = range(0, t, ranks_per_node) if t > ranks_per_node else range(1)
    rank = layout.rank
    step = min(ranks_per_node, t)
    tensor = [[rank(Coord(s, r, m)) for m in (*range(0, t, step), t - 1)] for s in range(p) for r in range(d)]
    pipeline = [
        [rank(Coord(s, r, m)), rank(Coord(s + 1, r, m))] for s in range(p - 1) for r in range(d) for m in offsets
    ]
    data = [[rank(Coord(s, r, m)) for r in range(d)] for s in range(p) for m in offsets]
    return {"tensor": tensor if t > 1 else [], "pipeline": pipeline, "data": data if d > 1 else []}
