"""The data-parallel shrink (spec.failurePolicy.allowDataShrink): smaller DPs keep pipeline, tensor, the
micro-batch and the global batch, never go below minData, and only where the batch and the nodes divide."""

from __future__ import annotations

import pytest

from paralleljob.planning import shrink
from tests.planning import clusters


def job(data: int = 4, gas: int = 4, min_data: int | None = None, gpus_per_node: int | None = None):  # type: ignore[no-untyped-def]
    floor = f", minData: {min_data}" if min_data else ""
    return clusters.small_job(2, 4, data, gpus_per_node, extra=f"  failurePolicy: {{allowDataShrink: true{floor}}}")


@pytest.mark.parametrize(
    ("data", "gas", "min_data", "sizes"),
    [
        (4, 16, None, [2, 1]),  # global batch 64 over micro 1: DP 3 would need 21.3 micro-batches
        (6, 16, None, [4, 3, 2, 1]),  # 96: DP 5 does not divide
        (4, 16, 2, [2]),
        (1, 16, None, []),
    ],
    ids=["batch-divides-2-and-1", "skips-5", "never-below-min-data", "nothing-below-1"],
)
def test_shrunk_sizes_split_the_global_batch_evenly_down_to_min_data(data, gas, min_data, sizes) -> None:
    assert shrink.shrunk_sizes(job(data, gas, min_data)) == sizes


def test_a_shrunk_job_keeps_tensor_pipeline_and_the_global_batch_with_more_accumulation() -> None:
    full = job(4)
    smaller = shrink.shrunk_job(full, 2)
    assert smaller is not None
    assert (smaller.pipeline, smaller.tensor, smaller.data) == (2, 4, 2)
    assert smaller.batch.train_batch_size == full.batch.train_batch_size == 64
    assert smaller.batch.micro_batch == full.batch.micro_batch
    assert smaller.batch.gradient_accumulation_steps == 2 * full.batch.gradient_accumulation_steps
    assert smaller.spec.model == full.spec.model and smaller.spec.failure_policy == full.spec.failure_policy


def test_a_size_whose_world_gpus_per_node_does_not_divide_is_skipped() -> None:
    # PP 2 x TP 4 is 8 GPUs per replica: on 16-GPU pods only an even DP fills whole pods.
    assert [smaller.data for smaller in shrink.shrunk_jobs(job(6, 16, gpus_per_node=16))] == [4, 2]
