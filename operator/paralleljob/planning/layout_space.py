"""The layout search's candidate space: the budget and the sizes the user fixed, every (pipeline, tensor, data)
that multiplies to it, and every variant of a shape (micro-batch x accumulation that makes the job's train batch,
recomputation on or off, each ZeRO stage the job's DeepSpeed config allows), each turned into a job and
validated as `paralleljob validate` would (`variant_job`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping

from paralleljob.api import batch as batch_math
from paralleljob.api import rules
from paralleljob.api import types as api_types
from paralleljob.api.problems import Problem, errors_of
from paralleljob.api.validation import ResolvedJob, validate_job
from paralleljob.planning.inventory import Cluster

# Micro-batches larger than this are not tried: published runs use 1-8, and activations grow with b.
MAX_MICRO_BATCH = 32


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


def budget_of(job: ResolvedJob) -> Budget | None:
    """The budget a job gives (spec.parallelism.gpus, or nodes x gpusPerNode) with the sizes it fixes."""
    if job.budget is None:
        return None
    par = job.spec.parallelism
    given = zip(SIZES, (par.pipeline, par.tensor, par.data), strict=True)
    return Budget(job.budget, {axis: size for axis, size in given if size is not None})


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
    for tensor in divisors(budget.gpus):
        for pipeline in divisors(budget.gpus // tensor):
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
    for micro in divisors(train_batch // data):
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


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})
