"""The data-parallel shrink (spec.failurePolicy.allowDataShrink): the smaller jobs a restarting gang that lost a
node may resume as when no spare is left and its own size no longer fits.

A shrunk job keeps pipeline, tensor, the micro-batch and the global batch (train_batch_size); only DP falls and
gradient accumulation grows to make up the batch (train_batch_size = micro x accumulation x DP), so its loss
curve continues through the trainer's DP-change resume (tests/trainer/test_checkpoints.py). The sizes are
tried largest first, down to spec.failurePolicy.minData (1 by default), skipping those the global batch or
gpusPerNode does not divide; the first that places wins, so a job loses no more replicas than the free nodes
require. The operator grows the job back at its next checkpoint once the full size fits again. Called by the
operator's admission; pure.

The re-plan (spec.failurePolicy.allowRelayout) goes further for a job whose size is a budget: `relayout_budgets`
gives the smaller budgets to search a layout for (whole nodes fewer, largest first), and the layout search
(`planning.layout_search`) picks pipeline, tensor and data for each on the nodes left, keeping the global batch.
"""

from __future__ import annotations

from collections.abc import Iterator

from paralleljob.api import ResolvedJob
from paralleljob.api.sections.deepspeed import zero_stage
from paralleljob.api.sections.recovery import min_data_of
from paralleljob.planning.layout_space import Budget, Variant, variant_job


def shrunk_sizes(job: ResolvedJob) -> list[int]:
    """The DPs below the job's own, largest first and at least minData, that split its global batch evenly."""
    batch = job.batch
    per_replica = batch.micro_batch
    sizes = range(job.data - 1, min_data_of(job.spec) - 1, -1)
    return [data for data in sizes if batch.train_batch_size % (per_replica * data) == 0]


def shrunk_jobs(job: ResolvedJob) -> Iterator[ResolvedJob]:
    """The job at each shrunk DP that validates (gpusPerNode must still divide the world), largest first."""
    for data in shrunk_sizes(job):
        shrunk = shrunk_job(job, data)
        if shrunk is not None:
            yield shrunk


def shrunk_job(job: ResolvedJob, data: int) -> ResolvedJob | None:
    """The job at DP `data` with the same pipeline, tensor, micro-batch and global batch; None when invalid."""
    batch = job.batch
    accumulation = batch.train_batch_size // (batch.micro_batch * data)
    recompute = bool(job.spec.model.activation_checkpoint_interval)
    variant = Variant(job.pipeline, job.tensor, data, batch.micro_batch, accumulation, recompute, zero_stage(job.spec))
    shrunk, problems = variant_job(job, variant)
    return None if problems else shrunk


def relayout_budgets(full: Budget, gpus_per_node: int) -> list[Budget]:
    """The budgets a job of budget `full` on nodes of `gpus_per_node` GPUs may resume at after losing nodes:
    one node fewer, two fewer, ... down to one node, largest first. The sizes the user fixed stay, except data,
    which a smaller budget cannot keep."""
    if gpus_per_node < 1:
        return []
    fixed = {axis: size for axis, size in full.fixed.items() if axis != "data"}
    nodes = (full.gpus - 1) // gpus_per_node  # whole nodes strictly below the full budget
    return [Budget(count * gpus_per_node, fixed) for count in range(nodes, 0, -1)]
