"""The data-parallel shrink (spec.failurePolicy.allowDataShrink): smaller DPs keep pipeline, tensor, the
micro-batch and the global batch, never go below minData, and only where the batch and the nodes divide."""

from __future__ import annotations

import pytest

from paralleljob.manifests import trainer_config
from paralleljob.planning import shrink
from paralleljob.planning.layout_space import Budget
from tests.manifests.helpers import make_plan
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


def test_the_shrunk_job_file_carries_the_batch_the_trainer_s_dp_change_test_resumes_with() -> None:
    # tests/trainer/test_checkpoints.py::test_a_resume_with_another_data_parallel_size_continues_the_same_loss_curve
    # resumes a DP 2 checkpoint (train batch 8, micro-batch 2, accumulation 2) at DP 1 with accumulation 4 and
    # finds the loss curve within 1e-5 of the unbroken run (fp32): the shrink must hand the trainer that job file.
    full = clusters.job(
        """
apiVersion: paralleljob.io/v1alpha1
kind: ParallelJob
metadata: {name: tiny}
spec:
  parallelism: {pipeline: 1, tensor: 1, data: 2}
  model: {layers: 4, hiddenSize: 64, attentionHeads: 4, sequenceLength: 32, vocabSize: 256, precision: fp32}
  deepspeed: {train_batch_size: 8, train_micro_batch_size_per_gpu: 2}
  training: {steps: 8}
  checkpoint: {intervalSteps: 3, volume: {persistentVolumeClaim: {claimName: checkpoints}}}
  failurePolicy: {allowDataShrink: true}
"""
    )
    smaller = shrink.shrunk_job(full, 1)
    assert smaller is not None
    plan = make_plan(nodes=1, gpus=1, layout=(1, 1, 1))
    job_file = trainer_config.build_trainer_config(smaller, plan)
    deepspeed = job_file["deepspeed"]
    batch = [
        deepspeed[key] for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    ]
    assert batch == [8, 2, 4]
    assert job_file["spec"]["parallelism"] == {"pipeline": 1, "tensor": 1, "data": 1}
    assert job_file["spec"]["model"] == full.resolved_spec()["model"]


@pytest.mark.parametrize(
    ("gpus", "fixed", "gpus_per_node", "budgets"),
    [
        (8, {}, 2, [6, 4, 2]),  # four 2-GPU nodes: three, two, one left
        (8, {}, 4, [4]),
        (4, {}, 4, []),  # one node: nothing smaller
        (12, {}, 8, [8]),  # a budget that is no whole number of nodes: the whole nodes below it
        (8, {"tensor": 2, "data": 2}, 2, [6, 4, 2]),  # tensor stays fixed, data cannot
        (8, {}, 0, []),
    ],
    ids=["four-nodes", "two-nodes", "one-node", "partial-node", "fixed-tensor-kept-data-dropped", "no-node-size"],
)
def test_relayout_budgets_are_whole_nodes_fewer_largest_first_keeping_fixed_sizes_but_data(
    gpus, fixed, gpus_per_node, budgets
) -> None:
    found = shrink.relayout_budgets(Budget(gpus, fixed), gpus_per_node)
    assert [budget.gpus for budget in found] == budgets
    assert all(dict(budget.fixed) == {k: v for k, v in fixed.items() if k != "data"} for budget in found)
