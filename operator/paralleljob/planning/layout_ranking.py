"""The layout search's ranking: a branch and bound that plans the screened variants in order of their bound,
keeps the best variant of each shape, and stops when no bound left could enter the top `TOP` (or after
`MAX_PLANS` planner calls). Ties go to fewer nodes, then less inter-node traffic, then less memory.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from paralleljob.api.validation import ResolvedJob
from paralleljob.planning import estimates
from paralleljob.planning.estimates import GIB, StepTime
from paralleljob.planning.inventory import Cluster
from paralleljob.planning.layout_bounds import (
    Screened,
    fits_memory,
)
from paralleljob.planning.layout_space import (
    Variant,
    variant_job,
)
from paralleljob.planning.plan import Plan, Unschedulable
from paralleljob.planning.planner import PlanningOptions, plan_job

# Distinct layouts kept, ranked, for the table; the search plans until none of the rest could enter it.
TOP = 8


# A bound on planner calls per search, so that a loose bound cannot make the search slow.
MAX_PLANS = 96


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


def branch_and_bound(
    job: ResolvedJob, cluster: Cluster, screened: list[Screened], options: PlanningOptions
) -> tuple[list[Candidate], int, list[tuple[Screened, str]]]:
    """Plan candidates in order of their bound; keep the best variant of each shape; stop when no bound left
    could enter the top `TOP` shapes (or after `MAX_PLANS` planner calls)."""
    best: dict[tuple[int, int, int], Candidate] = {}
    misses: list[tuple[Screened, str]] = []
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


def _place(job: ResolvedJob, cluster: Cluster, item: Screened, options: PlanningOptions) -> Candidate | str:
    resolved, problems = variant_job(job, item.variant)
    assert resolved is not None, problems  # screened variants are valid
    outcome = plan_job(resolved, cluster, options)
    if isinstance(outcome, Unschedulable):
        return outcome.message
    figures = outcome.estimates
    if not fits_memory(figures.memory["total"], figures.gpu_memory):
        return f"needs {figures.memory['total'] / GIB:.1f} GiB per GPU, over the margin of the placed nodes' GPUs"
    model = options.cost_model
    peak = model.peak_flops(outcome.gpu_product)
    by_group = outcome.cost.by_group
    step = estimates.step_time(
        item.work, peak, model.kernel_efficiency, by_group["tensor"], by_group["pipeline"], by_group["data"]
    )
    return Candidate(item.variant, resolved, outcome, step, item.bound)
