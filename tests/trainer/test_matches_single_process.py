"""Proofs 1 and 2: the 3D-parallel trainer computes what one plain-PyTorch process computes.

fp32, 10 steps, the same global batch: each layout's per-step loss, gradient norm (before clipping) and
learning rate must equal the single-process reference's. SGD shows gradient-scale mistakes that Adam's
normalisation hides; AdamW with clipping shows that the clipping norm counts every parameter exactly once.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from paralleljob_contract.jobfile import parse_job_config
from paralleljob_contract.layout import Layout
from testcluster import trainer_harness as harness
from tests.trainer.reference import ReferenceStep, train_reference

TOLERANCE = 1e-5
STEPS = 10
SGD = {"type": "SGD", "params": {"lr": 0.3}}
ADAMW = {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}}
# A clip threshold below the natural gradient norm (~1.3 at the start), so clipping changes every step.
CLIP = 0.5
# 0.05 before the vocab-parallel head and per-shard initialisation (issue 25), which move the bf16 run to other
# weights and another order of the head's sums: the CI rehearsal measured 5.27%. The bug this guards against
# (replicated parameters counted on every TP rank) is 41% off.
BF16_NORM_TOLERANCE = 0.10

LAYOUTS = [
    Layout(pipeline=2, tensor=2, data=2),
    Layout(pipeline=2, tensor=1, data=2),
    Layout(pipeline=1, tensor=2, data=2),
    Layout(pipeline=2, tensor=2, data=1),
]
# ZeRO-1 with the optimizer offloaded: DeepSpeed, not the trainer, builds the optimizer (torch's AdamW, so
# nothing is compiled), wraps it in its ZeRO optimizer, and the warmup-cosine schedule must still apply.
ZERO1_OFFLOAD = {"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}}
OPTIMIZERS = {
    "sgd": (SGD, 0.0, {}),
    "adamw-clip": (ADAMW, CLIP, {}),
    "adamw-zero1-offload": ({**ADAMW, "params": {**ADAMW["params"], "torch_adam": True}}, 0.0, ZERO1_OFFLOAD),
}
# Every layout with either optimizer, each run once: two of the pairs run as the tests further down, which
# check them with one more thing changed that must not change the losses (gang starts are CI's main cost).
RUN_BELOW = {
    (LAYOUTS[0], "adamw-clip"): "test_two_nodes_in_data_pipe_model_order_reproduce_single_process_losses",
    (LAYOUTS[3], "sgd"): "test_activation_checkpointing_does_not_change_the_losses",
}
CASES = [
    *((layout, optimizer) for optimizer in ("sgd", "adamw-clip") for layout in LAYOUTS),
    (Layout(pipeline=2, tensor=1, data=2), "adamw-zero1-offload"),
]
CASES = [case for case in CASES if case not in RUN_BELOW]


def _document(layout: Layout, optimizer: str, **overrides: Any) -> dict[str, Any]:
    section, clip, extra = OPTIMIZERS[optimizer]
    data = {"source": "text", "path": str(harness.text_corpus())}
    return harness.job_document(
        layout, optimizer=section, gradient_clipping=clip, steps=STEPS, data=data, deepspeed_extra=extra, **overrides
    )


@functools.cache
def _reference(optimizer: str) -> dict[int, ReferenceStep]:
    # The reference does not depend on the layout; any layout's job file describes the same experiment.
    return train_reference(parse_job_config(_document(LAYOUTS[0], optimizer)))


def _assert_matches_reference(output: Path, optimizer: str) -> None:
    reference = _reference(optimizer)
    logged = harness.steps_by_number(output)
    assert sorted(logged) == list(range(1, STEPS + 1))
    loss_diff = max(abs(logged[s]["loss"] - reference[s].loss) for s in reference)
    norm_diff = max(
        abs(logged[s]["grad_norm"] - reference[s].grad_norm) / max(1.0, reference[s].grad_norm) for s in reference
    )
    lr_diff = max(abs(logged[s]["lr"] - reference[s].lr) for s in reference)
    assert loss_diff <= TOLERANCE, f"loss differs by {loss_diff:.2e}"
    assert norm_diff <= TOLERANCE, f"grad norm differs by {norm_diff:.2e} (relative)"
    assert lr_diff <= 1e-12
    # The run must have trained, or matching the reference would prove little.
    assert reference[STEPS].loss < reference[1].loss - 0.05


@pytest.mark.slow
@pytest.mark.parametrize(
    ("layout", "optimizer"), CASES, ids=[f"{layout.name}-{optimizer}" for layout, optimizer in CASES]
)
def test_layout_reproduces_single_process_losses(tmp_path: Path, layout: Layout, optimizer: str) -> None:
    job = harness.write_job(tmp_path, _document(layout, optimizer))
    gang = harness.Gang()
    gang.start(job, tmp_path / "out", nproc=layout.world_size)
    result = gang.wait(timeout=180)
    assert result.returncodes == [0], result.logs[0][-3000:]
    _assert_matches_reference(tmp_path / "out", optimizer)


@pytest.mark.slow
def test_two_nodes_in_data_pipe_model_order_reproduce_single_process_losses(tmp_path: Path) -> None:
    # Axis order data, pipe, model (a planner choice): each node of 4 holds both stages of one replica.
    layout = Layout(pipeline=2, tensor=2, data=2)
    document = _document(layout, "adamw-clip", ranks_per_node=4, axis_order=("data", "pipe", "model"))
    # The job file carries the layout; node 0's rank 2 (of ranks 0-3) is stage 1 of replica 0.
    planned = parse_job_config(document).plan.layout
    assert planned.coord(2)._asdict() == {"pipe": 1, "data": 0, "model": 0}
    gang = harness.Gang()
    gang.start(harness.write_job(tmp_path, document), tmp_path / "out", nproc=4, nnodes=2)
    result = gang.wait(timeout=180)
    assert result.returncodes == [0, 0], "\n".join(log[-2000:] for log in result.logs)
    _assert_matches_reference(tmp_path / "out", "adamw-clip")


@pytest.mark.slow
def test_activation_checkpointing_does_not_change_the_losses(tmp_path: Path) -> None:
    layout = Layout(pipeline=2, tensor=2, data=1)
    document = _document(layout, "sgd", model={"activationCheckpointInterval": 1})
    gang = harness.Gang()
    gang.start(harness.write_job(tmp_path, document), tmp_path / "out", nproc=layout.world_size)
    result = gang.wait(timeout=180)
    assert result.returncodes == [0], result.logs[0][-3000:]
    _assert_matches_reference(tmp_path / "out", "sgd")


@pytest.mark.slow
def test_bf16_follows_the_fp32_reference_within_bf16_precision(tmp_path: Path) -> None:
    layout = Layout(pipeline=2, tensor=2, data=1)
    document = _document(layout, "adamw-clip", model={"precision": "bf16"})
    gang = harness.Gang()
    gang.start(harness.write_job(tmp_path, document), tmp_path / "out", nproc=layout.world_size)
    result = gang.wait(timeout=180)
    assert result.returncodes == [0], result.logs[0][-3000:]
    reference, logged = _reference("adamw-clip"), harness.steps_by_number(tmp_path / "out")
    # bf16 keeps 8 bits of mantissa: a few 1e-3 of loss is its noise, a layout or scale bug is far more.
    assert max(abs(logged[s]["loss"] - reference[s].loss) for s in reference) < 3e-2
    # The norm (before clipping) of bf16 gradients: measured within 2.5% of the reference before issue 25's
    # per-shard initialisation, 5.27% since, all of it at step 5 (every other step within 1.8%); the same job at
    # PP2 x TP1 x DP2, which has no vocab-parallel head, is 4.11% off at that step, so the rest is bf16 rounding
    # on the new weights, not the layout. With the replicated parameters counted on both TP ranks it is 41% off.
    norm_diff = max(abs(logged[s]["grad_norm"] - reference[s].grad_norm) / reference[s].grad_norm for s in reference)
    assert norm_diff < BF16_NORM_TOLERANCE, f"grad norm differs by {norm_diff:.2%}"
