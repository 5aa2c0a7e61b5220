"""The layout search's screen and bound: a variant passes when it validates and fits the reported GPU memory
within `MEMORY_MARGIN`, and gets an optimistic step time (every group that crosses nodes priced at leaf-switch
bandwidth, the fastest a real placement can give it), which orders the planning and stops it early. The tally
keeps what was rejected and why, for the one-line error when nothing is left.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping, Sequence

from paralleljob.api.validation import ResolvedJob
from paralleljob.planning import costmodel, eligibility, estimates
from paralleljob.planning.costmodel import Site
from paralleljob.planning.eligibility import MIB
from paralleljob.planning.estimates import Workload
from paralleljob.planning.inventory import Cluster, NodeInfo
from paralleljob.planning.layout_space import (
    Budget,
    Variant,
    max_tensor_size,
    shapes,
    variant_job,
    variants,
)
from paralleljob.planning.levels import LinkLevel, detect_nvlink_label, label_keys
from paralleljob.planning.planner import ranks_per_node_candidates
from paralleljob_contract.layout import AXIS_ORDERS, AxisOrder, Layout

# Estimates are models: keep a tenth of the GPU's memory free for what they leave out (allocator
# fragmentation, NCCL and DeepSpeed buffers beyond the 2 GiB reserve).
MEMORY_MARGIN = 0.10


@dataclasses.dataclass(frozen=True)
class Hardware:
    """What the bound and the memory filter read from the qualifying nodes of one GPU product."""

    product: str
    gpu_memory: float | None  # bytes, the largest GPU of the product; None when unlabelled
    bandwidth: Mapping[LinkLevel, float]
    peak: float  # FLOP/s
    efficiency: float  # kernel efficiency


@dataclasses.dataclass(frozen=True)
class Screened:
    """A variant with its estimates, before placement."""

    variant: Variant
    work: Workload
    memory: float
    bound: float


@dataclasses.dataclass
class Tally:
    """What the enumeration rejected, for the one-line error when nothing is left."""

    searched: int = 0
    valid: int = 0
    fitting: int = 0
    invalid: dict[str, str] = dataclasses.field(default_factory=dict)  # why a layout is out -> the first such
    smallest: Screened | None = None  # the valid variant that needs the least memory

    def reject(self, layout: str, reason: str) -> None:
        self.invalid.setdefault(
            reason.split(":", 1)[0] if reason.startswith("spec.") else reason, f"{layout}: {reason}"
        )

    def note_valid(self, screened: Screened) -> None:
        self.valid += 1
        if self.smallest is None or screened.memory < self.smallest.memory:
            self.smallest = screened


def screen(
    job: ResolvedJob, cluster: Cluster, budget: Budget, hardware: Sequence[Hardware], tally: Tally
) -> Iterator[Screened]:
    """Valid variants that fit the GPU memory within the margin, with their optimistic step time."""
    per_pod = job.spec.gpus_per_node
    if per_pod and budget.gpus % per_pod:
        tally.reject(f"{budget.gpus} GPUs", f"do not split into pods of spec.gpusPerNode {per_pod}")
        return
    bounds = Bounds(job, cluster, hardware)
    train_batch = job.batch.train_batch_size
    for shape in shapes(budget):
        layout = "x".join(str(size) for size in shape)
        if shape[1] > bounds.max_tensor:
            tally.reject(layout, f"TP {shape[1]} would span NVLink domains (the largest has {bounds.max_tensor} GPUs)")
            continue
        shape_variants = list(variants(job, shape))
        tally.searched += len(shape_variants)
        if not shape_variants:
            tally.reject(layout, f"the train batch {train_batch} does not split over DP {shape[2]}")
        for variant in shape_variants:
            resolved, problems = variant_job(job, variant)
            if resolved is None:
                for problem in problems:
                    tally.reject(layout, problem.render())
                if any(problem.path in SHAPE_RULE_PATHS for problem in problems):
                    break  # a rule on the sizes alone: no other variant of this shape passes
                continue
            work = workload(job, variant)
            screened = Screened(variant, work, estimates.memory_per_gpu(work).total, math.inf)
            tally.note_valid(screened)
            fits = [h for h in hardware if fits_memory(screened.memory, h.gpu_memory)]
            if not fits:
                continue
            bound = bounds.step(resolved, work, fits)
            if bound == math.inf:
                continue  # no pod size divides the world: the planner could not place it
            tally.fitting += 1
            yield dataclasses.replace(screened, bound=bound)


# Rules that read only the parallel sizes and the model's shape: when one fails, every variant of the
# shape fails it.
SHAPE_RULE_PATHS = frozenset(
    {"spec.parallelism.tensor", "spec.model.attentionHeads", "spec.model.ffnHiddenSize", "spec.model.layers"}
)


class Bounds:
    """Optimistic step times: the planner's model on an ideal cluster with the most ranks per node it may use,
    every node under one leaf switch (in one NVLink domain when the cluster has multi-node NVLink). A real
    placement's groups reach the same or slower links, so no placement is faster than the bound."""

    def __init__(self, job: ResolvedJob, cluster: Cluster, hardware: Sequence[Hardware]) -> None:
        self.cluster = cluster
        self.nvlink_label = job.spec.topology.nvlink_domain_label or detect_nvlink_label(label_keys(cluster.nodes))
        self.max_tensor = max_tensor_size(job, cluster, self.nvlink_label)
        self.efficiency = hardware[0].efficiency if hardware else 1.0
        order = job.spec.topology.axis_order
        self.axis_orders = tuple(AXIS_ORDERS.values()) if order == "auto" else (AXIS_ORDERS[order],)
        self._reached: dict[tuple[tuple[int, int, int], int, AxisOrder], Mapping[str, list[LinkLevel]]] = {}

    def step(self, job: ResolvedJob, work: Workload, hardware: Sequence[Hardware]) -> float:
        """The bound; infinite when no ranks-per-node size divides the world (spec.gpusPerNode does not)."""
        volume = estimates.comm_bytes(work)
        best = math.inf
        shape = (work.pipeline, work.tensor, work.data)
        for gpus in self._sizes(job):
            for order in self.axis_orders:
                reached = self._reach(shape, gpus, order)
                for h in hardware:
                    cost = costmodel.price_reached(reached, volume, h.bandwidth)
                    step = estimates.step_time(work, h.peak, h.efficiency, cost.tensor, cost.pipeline, cost.data)
                    best = min(best, step.total)
        return best

    def _sizes(self, job: ResolvedJob) -> list[int]:
        """Ranks-per-node sizes the planner may use, less those that divide the largest: with g' dividing g,
        every node-sized block of g' ranks lies inside one of g ranks, so g' is never faster."""
        world = job.world_size
        sizes = [g for g in ranks_per_node_candidates(job, self.cluster.nodes, self.nvlink_label) if world % g == 0]
        return [g for g in sizes if g == sizes[0] or sizes[0] % g]

    def _reach(self, shape: tuple[int, int, int], gpus: int, order: AxisOrder) -> Mapping[str, list[LinkLevel]]:
        key = (shape, gpus, order)
        if key not in self._reached:
            layout = Layout(shape[0], shape[1], shape[2], order)
            clique = "ideal" if self.nvlink_label else ""
            sites = [Site(str(index), clique, ()) for index in range(max(1, layout.world_size // gpus))]
            self._reached[key] = costmodel.reach(gpus, sites, costmodel.rank_groups(layout, gpus))
        return self._reached[key]


def fits_memory(memory: float, gpu_memory: float | None) -> bool:
    return gpu_memory is None or memory <= gpu_memory * (1 - MEMORY_MARGIN)


def workload(job: ResolvedJob, variant: Variant) -> Workload:
    base = Workload.from_job(job).with_sizes(variant.pipeline, variant.tensor, variant.data)
    return dataclasses.replace(
        base,
        micro_batch=variant.micro_batch,
        micro_batches=variant.accumulation,
        recompute=variant.recompute,
        zero_stage=variant.zero_stage,
    )


def hardware_of(job: ResolvedJob, cluster: Cluster, model: costmodel.CostModel) -> list[Hardware]:
    """One entry per GPU product among the nodes the job may use (one product, unlabelled, when none qualify)."""
    spec = job.spec
    screened, _ = eligibility.screen(cluster.nodes, spec.template.node_selector, spec.template.tolerations)
    groups = eligibility.by_product(screened, spec.topology.allow_mixed_gpu_products) or {"": []}
    found = []
    for product, members in groups.items():
        named = product or _slowest(members, model)
        memory = [node.gpu_memory_mib for node in members if node.gpu_memory_mib is not None]
        gpu_memory = max(memory) * MIB if memory and len(memory) == len(members) else None
        found.append(
            Hardware(named, gpu_memory, model.link_bandwidths(named), model.peak_flops(named), model.kernel_efficiency)
        )
    return found


def _slowest(nodes: Sequence[NodeInfo], model: costmodel.CostModel) -> str:
    products = {node.product for node in nodes} or {""}
    return min(products, key=lambda p: (model.profile(p).peak_tflops, p))
