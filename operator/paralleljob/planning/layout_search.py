"""Choosing the 3D layout for a GPU budget: `choose_layout()` searches pipeline x tensor x data, micro-batch
and accumulation, activation recomputation and ZeRO stage, and places the best candidates on the cluster.

Candidates are every variant of the job whose sizes multiply to the budget (keeping the sizes the user fixed),
whose micro-batch x accumulation x DP is the job's train batch, with recomputation on or off and each ZeRO
stage the job's DeepSpeed config allows. A candidate must pass every validation rule (`validate_job`, the
same check as `paralleljob validate`) and fit the reported GPU memory within `MEMORY_MARGIN`.

The objective is the planner's modeled step time on the actual free nodes, placement included. Planning
costs a pass over the nodes, so the search is a branch and bound: each candidate first gets an optimistic
step time (every group that crosses nodes priced at leaf-switch bandwidth, the fastest a real placement
can give it), candidates are planned in that order, and the search stops when the next bound cannot beat
the kept results. Ties go to fewer nodes, then less inter-node traffic, then less memory.

Callers: `paralleljob plan --auto`, the operator at first admission of a job that gives a budget, and
`paralleljob run` on its local shape. docs/planning.md ("Choosing the layout") documents the rules.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from paralleljob.api import batch as batch_math
from paralleljob.api import rules
from paralleljob.api import types as api_types
from paralleljob.api.problems import Problem, error, errors_of
from paralleljob.api.validation import ResolvedJob, validate_job
from paralleljob.planning import costmodel, eligibility, estimates
from paralleljob.planning.costmodel import Site
from paralleljob.planning.eligibility import MIB
from paralleljob.planning.estimates import GIB, StepTime, Workload
from paralleljob.planning.inventory import Cluster, NodeInfo
from paralleljob.planning.levels import LinkLevel, detect_nvlink_label, label_keys
from paralleljob.planning.plan import Plan, Unschedulable
from paralleljob.planning.planner import PlanningOptions, plan_job, ranks_per_node_candidates
from paralleljob_contract.layout import AXIS_ORDERS, AxisOrder, Layout

# Estimates are models: keep a tenth of the GPU's memory free for what they leave out (allocator
# fragmentation, NCCL and DeepSpeed buffers beyond the 2 GiB reserve).
MEMORY_MARGIN = 0.10
# Micro-batches larger than this are not tried: published runs use 1-8, and activations grow with b.
MAX_MICRO_BATCH = 32
# Distinct layouts kept, ranked, for the table; the search plans until none of the rest could enter it.
TOP = 8
# A bound on planner calls per search, so that a loose bound cannot make the search slow.
MAX_PLANS = 96
SIZES = ("pipeline", "tensor", "data")


@dataclasses.dataclass(frozen=True)
class Budget:
    """GPUs the layout must use exactly, and the sizes the user fixed (pipeline, tensor or data)."""

    gpus: int
    fixed: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def describe(self) -> str:
        fixed = ", ".join(f"{axis} {size}" for axis, size in self.fixed.items())
        return f"{self.gpus} GPUs" + (f" with {fixed} fixed" if fixed else "")


@dataclasses.dataclass(frozen=True, order=True)
class Variant:
    """One point of the search space."""

    pipeline: int
    tensor: int
    data: int
    micro_batch: int
    accumulation: int  # gradient accumulation steps: micro-batches per step through the pipeline
    recompute: bool
    zero_stage: int

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.pipeline, self.tensor, self.data)

    @property
    def layout(self) -> str:
        return f"{self.pipeline}x{self.tensor}x{self.data}"

    def describe(self) -> str:
        recompute = "recomputation" if self.recompute else "no recomputation"
        return (
            f"{self.layout} (PP x TP x DP), micro-batch {self.micro_batch} x {self.accumulation} accumulation, "
            f"{recompute}, ZeRO-{self.zero_stage}"
        )


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A placed variant: the job with its layout (valid), its plan, and the modeled step split by use."""

    variant: Variant
    job: ResolvedJob
    plan: Plan
    step: StepTime
    bound: float  # the optimistic step time the search ordered it by (<= plan's step time)

    @property
    def step_seconds(self) -> float:
        return self.plan.estimates.step_seconds

    @property
    def tokens_per_second(self) -> float:
        return self.job.batch.train_batch_size * self.job.spec.model.sequence_length / self.step_seconds

    @property
    def inter_node_bytes(self) -> float:
        """Bytes per GPU per step in groups that leave their node (tie-breaker: less is better)."""
        levels, volume = self.plan.cost.levels, self.plan.estimates.bytes_per_step
        return sum(volume[kind] for kind in volume if levels.get(kind, "node") != "node")

    def rank_key(self) -> tuple[float, int, float, float]:
        return (round(self.step_seconds, 9), len(self.plan.nodes), self.inter_node_bytes, self.memory)

    @property
    def memory(self) -> float:
        return self.plan.estimates.memory["total"]

    def to_dict(self) -> dict[str, Any]:
        v, e = self.variant, self.plan.estimates
        return {
            "layout": {"pipeline": v.pipeline, "tensor": v.tensor, "data": v.data},
            "microBatch": v.micro_batch,
            "gradientAccumulationSteps": v.accumulation,
            "activationRecomputation": v.recompute,
            "zeroStage": v.zero_stage,
            "axisOrder": list(self.plan.axis_order),
            "nodes": len(self.plan.nodes),
            "gpusPerNode": self.plan.ranks_per_node,
            "memoryPerGPU": e.memory["total"],
            "bubbleFraction": e.bubble_fraction,
            "bytesPerStep": dict(e.bytes_per_step),
            "communicationSeconds": self.plan.cost.seconds,
            "stepSeconds": self.step_seconds,
            "stepBreakdown": dataclasses.asdict(self.step),
            "tokensPerSecond": self.tokens_per_second,
            "mfu": e.mfu,
        }


@dataclasses.dataclass(frozen=True)
class LayoutChoice:
    """The search's outcome: the winner, the ranked best layouts (winner first) and why, in the rule's order."""

    budget: Budget
    ranked: tuple[Candidate, ...]
    explanation: tuple[str, ...]
    searched: int  # variants enumerated
    valid: int  # variants that passed validation
    fitting: int  # valid variants that fit the GPU memory
    planned: int  # variants the planner placed or tried

    @property
    def winner(self) -> Candidate:
        return self.ranked[0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget": {"gpus": self.budget.gpus, "fixed": dict(self.budget.fixed)},
            "winner": self.winner.to_dict(),
            "candidates": [candidate.to_dict() for candidate in self.ranked],
            "explanation": list(self.explanation),
            "search": {
                "variants": self.searched,
                "valid": self.valid,
                "fitMemory": self.fitting,
                "planned": self.planned,
            },
            "plan": self.winner.plan.to_dict(),
        }


@dataclasses.dataclass(frozen=True)
class NoLayout:
    """No layout of the budget is valid, fits, or places; `message` is one line naming what to change."""

    budget: Budget
    message: str

    def problem(self) -> Problem:
        return error("spec.parallelism", self.message)

    def to_dict(self) -> dict[str, Any]:
        return {"budget": {"gpus": self.budget.gpus, "fixed": dict(self.budget.fixed)}, "error": self.message}


@dataclasses.dataclass(frozen=True)
class _Hardware:
    """What the bound and the memory filter read from the qualifying nodes of one GPU product."""

    product: str
    gpu_memory: float | None  # bytes, the largest GPU of the product; None when unlabelled
    bandwidth: Mapping[LinkLevel, float]
    peak: float  # FLOP/s
    efficiency: float  # kernel efficiency


@dataclasses.dataclass(frozen=True)
class _Screened:
    """A variant with its estimates, before placement."""

    variant: Variant
    work: Workload
    memory: float
    bound: float


@dataclasses.dataclass
class _Tally:
    """What the enumeration rejected, for the one-line error when nothing is left."""

    searched: int = 0
    valid: int = 0
    fitting: int = 0
    invalid: dict[str, str] = dataclasses.field(default_factory=dict)  # why a layout is out -> the first such
    smallest: _Screened | None = None  # the valid variant that needs the least memory

    def reject(self, layout: str, reason: str) -> None:
        self.invalid.setdefault(
            reason.split(":", 1)[0] if reason.startswith("spec.") else reason, f"{layout}: {reason}"
        )

    def note_valid(self, screened: _Screened) -> None:
        self.valid += 1
        if self.smallest is None or screened.memory < self.smallest.memory:
            self.smallest = screened


def choose_layout(
    job: ResolvedJob, cluster: Cluster, budget: Budget, options: PlanningOptions | None = None
) -> LayoutChoice | NoLayout:
    """The best layout of `job` for `budget` GPUs on `cluster`, or one line saying what to change."""
    options = options or PlanningOptions()
    hardware = _hardware(job, cluster, options.cost_model)
    tally = _Tally()
    screened = list(_screen(job, cluster, budget, hardware, tally))
    if not screened:
        return NoLayout(budget, _nothing_fits(job, cluster, budget, hardware, tally))
    ranked, planned, misses = _branch_and_bound(job, cluster, screened, options)
    if not ranked:
        return NoLayout(budget, _nothing_places(screened, misses))
    label = job.spec.topology.nvlink_domain_label or detect_nvlink_label(label_keys(cluster.nodes))
    explanation = explain(job, budget, hardware, max_tensor_size(job, cluster, label), ranked)
    return LayoutChoice(budget, tuple(ranked), tuple(explanation), tally.searched, tally.valid, tally.fitting, planned)


def budget_of(job: ResolvedJob) -> Budget | None:
    """The budget a job gives (spec.parallelism.gpus, or nodes x gpusPerNode) with the sizes it fixes."""
    if job.budget is None:
        return None
    par = job.spec.parallelism
    given = zip(SIZES, (par.pipeline, par.tensor, par.data), strict=True)
    return Budget(job.budget, {axis: size for axis, size in given if size is not None})


def record(choice: LayoutChoice) -> dict[str, Any]:
    """What the operator keeps in status.layoutChoice: enough to rebuild the chosen job without searching."""
    v = choice.winner.variant
    return {
        "pipeline": v.pipeline,
        "tensor": v.tensor,
        "data": v.data,
        "microBatch": v.micro_batch,
        "gradientAccumulationSteps": v.accumulation,
        "activationRecomputation": v.recompute,
        "zeroStage": v.zero_stage,
        "gpus": choice.budget.gpus,
        "stepSeconds": choice.winner.step_seconds,
        "explanation": " ".join(choice.explanation),
    }


def chosen_job(job: ResolvedJob, recorded: Mapping[str, Any]) -> tuple[ResolvedJob | None, list[Problem]]:
    """The job with the layout `record()` kept: what a restart runs, never searching again."""
    try:
        variant = Variant(
            int(recorded["pipeline"]),
            int(recorded["tensor"]),
            int(recorded["data"]),
            int(recorded["microBatch"]),
            int(recorded["gradientAccumulationSteps"]),
            bool(recorded["activationRecomputation"]),
            int(recorded["zeroStage"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        return None, [error("status.layoutChoice", f"is malformed ({exc}); remove it to choose the layout again.")]
    return variant_job(job, variant)


def variant_job(job: ResolvedJob, variant: Variant) -> tuple[ResolvedJob | None, list[Problem]]:
    """The job with the variant's layout, batch split, recomputation and ZeRO stage, validated as YAML would be."""
    spec = job.spec
    deepspeed = dict(spec.deepspeed or {})
    deepspeed[batch_math.TBS] = job.batch.train_batch_size
    deepspeed[batch_math.MICRO] = variant.micro_batch
    deepspeed[batch_math.GAS] = variant.accumulation
    if variant.zero_stage or "zero_optimization" in deepspeed:
        zero = deepspeed.get("zero_optimization")
        deepspeed["zero_optimization"] = {**(zero if isinstance(zero, dict) else {}), "stage": variant.zero_stage}
    interval = spec.model.activation_checkpoint_interval or 1
    model = dataclasses.replace(spec.model, activation_checkpoint_interval=interval if variant.recompute else 0)
    # sequenceParallel is the user's choice and stays: layouts whose tensor size cannot carry it are invalid.
    sequence_parallel = spec.parallelism.sequence_parallel
    parallelism = api_types.Parallelism(
        variant.pipeline, variant.tensor, variant.data, sequence_parallel=sequence_parallel
    )
    # The budget fields go: the variant is a sized job, validated as the YAML with these sizes would be.
    new_spec = dataclasses.replace(spec, parallelism=parallelism, model=model, deepspeed=deepspeed)
    result = validate_job(dataclasses.replace(job.job, spec=new_spec))
    return result.resolved, errors_of(result.problems)


def shapes(budget: Budget) -> Iterator[tuple[int, int, int]]:
    """(pipeline, tensor, data) with product = budget and the fixed sizes kept."""
    fixed = budget.fixed
    for tensor in _divisors(budget.gpus):
        for pipeline in _divisors(budget.gpus // tensor):
            data = budget.gpus // (tensor * pipeline)
            if all(fixed.get(axis, size) == size for axis, size in zip(SIZES, (pipeline, tensor, data), strict=True)):
                yield pipeline, tensor, data


def variants(job: ResolvedJob, shape: tuple[int, int, int]) -> Iterator[Variant]:
    """Every micro-batch split of the train batch (only the micro-batch a budget job's config pins, if it
    does), recomputation on and off, and each allowed ZeRO stage."""
    pipeline, tensor, data = shape
    train_batch = job.batch.train_batch_size
    if train_batch % data:
        return
    pinned = (job.spec.deepspeed or {}).get(batch_math.MICRO) if job.needs_layout else None
    for micro in _divisors(train_batch // data):
        if micro > MAX_MICRO_BATCH or (isinstance(pinned, int) and micro != pinned):
            continue
        for recompute in (False, True):
            for stage in zero_stages(job, pipeline):
                yield Variant(pipeline, tensor, data, micro, train_batch // (data * micro), recompute, stage)


def zero_stages(job: ResolvedJob, pipeline: int) -> tuple[int, ...]:
    """The ZeRO stage the config pins, else 0 and 1: the bundled trainer runs DeepSpeed's pipeline engine,
    which refuses stages 2 and 3 whatever the pipeline size. A pinned stage 2 or 3 allows only pipeline 1."""
    zero = (job.spec.deepspeed or {}).get("zero_optimization")
    if isinstance(zero, dict) and isinstance(zero.get("stage"), int):
        stage = rules.zero_stage(job.spec)
        return (stage,) if stage < 2 or pipeline == 1 else ()
    return (0, 1)


def max_tensor_size(job: ResolvedJob, cluster: Cluster, label: str | None) -> int:
    """GPUs of the largest NVLink domain: a node (or spec.gpusPerNode), or a labelled multi-node clique."""
    node_gpus = max((node.allocatable_gpus for node in cluster.nodes), default=0)
    if job.spec.gpus_per_node and not label:
        return job.spec.gpus_per_node
    if not label:
        return node_gpus
    cliques: dict[str, int] = {}
    for node in cluster.nodes:
        clique = node.labels.get(label)
        if clique:
            cliques[clique] = cliques.get(clique, 0) + node.allocatable_gpus
    return max([node_gpus, *cliques.values()])


def _screen(
    job: ResolvedJob, cluster: Cluster, budget: Budget, hardware: Sequence[_Hardware], tally: _Tally
) -> Iterator[_Screened]:
    """Valid variants that fit the GPU memory within the margin, with their optimistic step time."""
    per_pod = job.spec.gpus_per_node
    if per_pod and budget.gpus % per_pod:
        tally.reject(f"{budget.gpus} GPUs", f"do not split into pods of spec.gpusPerNode {per_pod}")
        return
    bounds = _Bounds(job, cluster, hardware)
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
            work = _workload(job, variant)
            screened = _Screened(variant, work, estimates.memory_per_gpu(work).total, math.inf)
            tally.note_valid(screened)
            fits = [h for h in hardware if _fits(screened.memory, h.gpu_memory)]
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


class _Bounds:
    """Optimistic step times: the planner's model on an ideal cluster with the most ranks per node it may use,
    every node under one leaf switch (in one NVLink domain when the cluster has multi-node NVLink). A real
    placement's groups reach the same or slower links, so no placement is faster than the bound."""

    def __init__(self, job: ResolvedJob, cluster: Cluster, hardware: Sequence[_Hardware]) -> None:
        self.cluster = cluster
        self.nvlink_label = job.spec.topology.nvlink_domain_label or detect_nvlink_label(label_keys(cluster.nodes))
        self.max_tensor = max_tensor_size(job, cluster, self.nvlink_label)
        self.efficiency = hardware[0].efficiency if hardware else 1.0
        order = job.spec.topology.axis_order
        self.axis_orders = tuple(AXIS_ORDERS.values()) if order == "auto" else (AXIS_ORDERS[order],)
        self._reached: dict[tuple[tuple[int, int, int], int, AxisOrder], Mapping[str, list[LinkLevel]]] = {}

    def step(self, job: ResolvedJob, work: Workload, hardware: Sequence[_Hardware]) -> float:
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


def _fits(memory: float, gpu_memory: float | None) -> bool:
    return gpu_memory is None or memory <= gpu_memory * (1 - MEMORY_MARGIN)


def _workload(job: ResolvedJob, variant: Variant) -> Workload:
    base = Workload.from_job(job)
    return dataclasses.replace(
        base,
        pipeline=variant.pipeline,
        tensor=variant.tensor,
        data=variant.data,
        micro_batch=variant.micro_batch,
        micro_batches=variant.accumulation,
        recompute=variant.recompute,
        zero_stage=variant.zero_stage,
    )


def _hardware(job: ResolvedJob, cluster: Cluster, model: costmodel.CostModel) -> list[_Hardware]:
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
            _Hardware(named, gpu_memory, model.link_bandwidths(named), model.peak_flops(named), model.kernel_efficiency)
        )
    return found


def _slowest(nodes: Sequence[NodeInfo], model: costmodel.CostModel) -> str:
    products = {node.product for node in nodes} or {""}
    return min(products, key=lambda p: (model.profile(p).peak_tflops, p))


def _branch_and_bound(
    job: ResolvedJob, cluster: Cluster, screened: list[_Screened], options: PlanningOptions
) -> tuple[list[Candidate], int, list[tuple[_Screened, str]]]:
    """Plan candidates in order of their bound; keep the best variant of each shape; stop when no bound left
    could enter the top `TOP` shapes (or after `MAX_PLANS` planner calls)."""
    best: dict[tuple[int, int, int], Candidate] = {}
    misses: list[tuple[_Screened, str]] = []
    planned = 0
    for item in sorted(screened, key=lambda s: (s.bound, s.memory, s.variant)):
        kept = sorted(best.values(), key=Candidate.rank_key)
        if len(kept) >= TOP and item.bound >= kept[TOP - 1].step_seconds:
            break
        incumbent = best.get(item.variant.shape)
        if incumbent is not None and item.bound >= incumbent.step_seconds:
            continue
        if planned >= MAX_PLANS:
            break
        planned += 1
        outcome = _place(job, cluster, item, options)
        if isinstance(outcome, str):
            misses.append((item, outcome))
        elif incumbent is None or outcome.rank_key() < incumbent.rank_key():
            best[item.variant.shape] = outcome
    return sorted(best.values(), key=Candidate.rank_key)[:TOP], planned, misses


def _place(job: ResolvedJob, cluster: Cluster, item: _Screened, options: PlanningOptions) -> Candidate | str:
    resolved, problems = variant_job(job, item.variant)
    assert resolved is not None, problems  # screened variants are valid
    outcome = plan_job(resolved, cluster, options)
    if isinstance(outcome, Unschedulable):
        return outcome.message
    figures = outcome.estimates
    if not _fits(figures.memory["total"], figures.gpu_memory):
        return f"needs {figures.memory['total'] / GIB:.1f} GiB per GPU, over the margin of the placed nodes' GPUs"
    model = options.cost_model
    peak = model.peak_flops(outcome.gpu_product)
    by_group = outcome.cost.by_group
    step = estimates.step_time(
        item.work, peak, model.kernel_efficiency, by_group["tensor"], by_group["pipeline"], by_group["data"]
    )
    return Candidate(item.variant, resolved, outcome, step, item.bound)


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


# --- explanations and errors ---------------------------------------------------------------------------


def explain(
    job: ResolvedJob, budget: Budget, hardware: Sequence[_Hardware], max_tensor: int, ranked: Sequence[Candidate]
) -> list[str]:
    """The decision rule in its own order (one GPU, one NVLink domain, pipeline), then winner vs runner-up."""
    winner = ranked[0]
    lines = [_regime(job, budget, _gpu_memory(hardware), max_tensor, winner)]
    lines.append(
        f"winner {winner.variant.describe()}: modeled step {winner.step_seconds:.3g} s, "
        f"{winner.tokens_per_second:,.0f} tokens/s, MFU {winner.plan.estimates.mfu:.0%}, "
        f"{winner.memory / GIB:.1f} GiB per GPU, {len(winner.plan.nodes)} nodes x {winner.plan.ranks_per_node} GPUs."
    )
    if len(ranked) > 1:
        lines.append(_versus(winner, ranked[1]))
    return lines


def _gpu_memory(hardware: Sequence[_Hardware]) -> float | None:
    return max((h.gpu_memory or 0.0 for h in hardware), default=0.0) or None


def _regime(job: ResolvedJob, budget: Budget, gpu_memory: float | None, max_tensor: int, winner: Candidate) -> str:
    """Whether one replica fits one GPU, one NVLink domain (TP), or needs pipeline stages across nodes."""
    if gpu_memory is None:
        return (
            "GPU memory is unknown (no nvidia.com/gpu.memory label), so memory was not checked: the fastest "
            "modeled layout wins."
        )
    usable = gpu_memory * (1 - MEMORY_MARGIN)
    room = f"{usable / GIB:.0f} GiB usable of {gpu_memory / GIB:.0f} GiB"
    one_gpu = _least_memory(job, budget, 1, 1)
    if one_gpu is not None and one_gpu <= usable:
        return (
            f"1. the model fits one GPU ({one_gpu / GIB:.1f} GiB at best with TP 1 x PP 1; {room}), so DP alone "
            "works; TP or PP is added only where the model says it is faster."
        )
    start = f"1. one replica does not fit one GPU ({(one_gpu or math.inf) / GIB:.1f} GiB at best; {room})"
    tensors = [t for t in _divisors(budget.gpus) if 1 < t <= max_tensor and _splits(job, t)]
    in_domain = [(t, m) for t in tensors if (m := _least_memory(job, budget, t, 1)) is not None and m <= usable]
    if in_domain:
        t, m = in_domain[0]
        then = (
            "so no pipeline is needed"
            if winner.variant.pipeline == 1
            else f"but PP {winner.variant.pipeline} is faster in the model (below)"
        )
        return f"{start}; 2. TP {t} inside one NVLink domain fits ({m / GIB:.1f} GiB), {then}."
    widest = max(tensors, default=1)
    return (
        f"{start}; 2. nor one NVLink domain (TP up to {widest}); 3. so it needs PP across nodes: "
        f"PP {winner.variant.pipeline} x TP {winner.variant.tensor}, TP inside the domain."
    )


def _splits(job: ResolvedJob, tensor: int) -> bool:
    model = job.spec.model
    kv = model.kv_heads or model.attention_heads
    kv_fits = kv % tensor == 0 or tensor % kv == 0  # whole key/value groups per rank, or all of them
    return model.attention_heads % tensor == 0 and job.ffn_hidden_size % tensor == 0 and kv_fits


def _least_memory(job: ResolvedJob, budget: Budget, tensor: int, pipeline: int) -> float | None:
    """The least memory per GPU over micro-batch, recomputation and ZeRO for a TP x PP with the rest DP."""
    if budget.gpus % (tensor * pipeline):
        return None
    data = budget.gpus // (tensor * pipeline)
    found = [estimates.memory_per_gpu(_workload(job, v)).total for v in variants(job, (pipeline, tensor, data))]
    return min(found, default=None)


def _versus(winner: Candidate, runner_up: Candidate) -> str:
    """Why the winner beats the runner-up: the two parts of the step that differ most."""
    a, b = winner.step, runner_up.step
    parts = {
        "compute": b.compute - a.compute,
        "TP all-reduces": b.tensor - a.tensor,
        "PP transfers": b.pipeline - a.pipeline,
        "pipeline bubble": b.bubble - a.bubble,
        "DP all-reduce": b.data - a.data,
    }
    biggest = sorted(parts.items(), key=lambda item: -abs(item[1]))[:2]
    reasons = " and ".join(f"{abs(d):.3g} s {'more' if d >= 0 else 'less'} in {name}" for name, d in biggest if d)
    gain = runner_up.step_seconds / winner.step_seconds - 1
    if gain < 1e-9:
        return (
            f"the runner-up {runner_up.variant.describe()} ties in modeled step time; the winner uses fewer nodes, "
            "less inter-node traffic or less memory."
        )
    return (
        f"the runner-up {runner_up.variant.describe()} is {gain:.1%} slower ({runner_up.step_seconds:.3g} s per "
        f"step): it spends {reasons}."
    )


def _nothing_fits(
    job: ResolvedJob, cluster: Cluster, budget: Budget, hardware: Sequence[_Hardware], tally: _Tally
) -> str:
    """One line: no valid layout (name a rule and a budget that works), or none fits (what to change)."""
    if tally.smallest is None:
        usable = _nearest_usable_budgets(job, cluster, budget)
        why = "; ".join(list(tally.invalid.values())[:2]) or "no sizes multiply to it"
        near = f"; try {' or '.join(str(n) for n in usable)} GPUs" if usable else ""
        return f"no valid layout uses exactly {budget.describe()} (e.g. {why}){near}"
    closest = tally.smallest
    gpu_memory = _gpu_memory(hardware) or 0.0
    return (
        f"no layout of {budget.describe()} fits in memory: the closest, {closest.variant.describe()}, needs "
        f"{closest.memory / GIB:.1f} GiB per GPU of {gpu_memory * (1 - MEMORY_MARGIN) / GIB:.0f} GiB usable "
        f"({gpu_memory / GIB:.0f} GiB less a {MEMORY_MARGIN:.0%} margin); "
        f"{_memory_changes(job, cluster, budget, closest, hardware)}"
    )


def _memory_changes(
    job: ResolvedJob, cluster: Cluster, budget: Budget, closest: _Screened, hardware: Sequence[_Hardware]
) -> str:
    """What would make it fit: ZeRO-1 when the config pins 0, free fixed sizes, more GPUs (the smallest
    power-of-two multiple of the budget that fits)."""
    advice = []
    if zero_stages(job, closest.variant.pipeline) == (0,):
        advice.append("allow ZeRO-1 (spec.deepspeed.zero_optimization.stage: 1 shards the optimizer over DP)")
    if budget.fixed:
        advice.append(f"leave {' and '.join(budget.fixed)} to the search")
    bigger = next(
        (gpus for gpus in _larger_budgets(budget, cluster) if _any_fits(job, cluster, budget, gpus, hardware)), None
    )
    if bigger is not None:
        advice.append(f"use {bigger} GPUs, the smallest larger budget tried where a layout fits")
    else:
        advice.append("shrink the model: not even 64x the GPUs fit it with micro-batch 1, recomputation and ZeRO-1")
    return "; or ".join(advice)


def _larger_budgets(budget: Budget, cluster: Cluster) -> Iterator[int]:
    """The next 16 multiples of a node's GPUs above the budget, then doublings up to 64x."""
    per_node = max((node.allocatable_gpus for node in cluster.nodes), default=1) or 1
    start = budget.gpus // per_node + 1
    yield from (per_node * count for count in range(start, start + 16))
    yield from (budget.gpus * factor for factor in (4, 8, 16, 32, 64) if budget.gpus * factor > per_node * (start + 15))


def _any_fits(job: ResolvedJob, cluster: Cluster, budget: Budget, gpus: int, hardware: Sequence[_Hardware]) -> bool:
    return next(_screen(job, cluster, Budget(gpus, budget.fixed), hardware, _Tally()), None) is not None


def _nearest_usable_budgets(job: ResolvedJob, cluster: Cluster, budget: Budget) -> list[int]:
    """The nearest GPU counts below and above the budget that have a valid layout (memory not considered)."""
    label = job.spec.topology.nvlink_domain_label or detect_nvlink_label(label_keys(cluster.nodes))
    max_tensor = max_tensor_size(job, cluster, label)

    def usable(gpus: int) -> bool:
        if job.spec.gpus_per_node and gpus % job.spec.gpus_per_node:
            return False
        return any(
            variant_job(job, variant)[0] is not None
            for shape in shapes(Budget(gpus, budget.fixed))
            if shape[1] <= max_tensor
            for variant in itertools.islice(variants(job, shape), 1)
        )

    below = next((n for n in range(budget.gpus - 1, 0, -1) if usable(n)), None)
    above = next((n for n in range(budget.gpus + 1, 2 * budget.gpus + 9) if usable(n)), None)
    return [n for n in (below, above) if n is not None]


def _nothing_places(screened: Sequence[_Screened], misses: Sequence[tuple[_Screened, str]]) -> str:
    item, reason = min(misses, key=lambda miss: (miss[0].bound, miss[0].memory)) if misses else (screened[0], "")
    return f"no candidate layout places on the cluster now: the best modeled one, {item.variant.describe()}, {reason}"
