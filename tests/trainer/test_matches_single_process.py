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

from paralleljob_trainer.config import parse_job_config
from tests.trainer import harness
from tests.trainer.reference import ReferenceStep, train_reference

TOLERANCE = 1e-5
STEPS = 10
SGD = {"type": "SGD", "params": {"lr": 0.3}}
ADAMW = {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}}
# A clip threshold below the natural gradient norm (~1.3 at the start), so clipping changes every step.
CLIP = 0.5

LAYOUTS = [
    harness.Layout(pipeline=2, tensor=2, data=2),
    harness.Layout(pipeline=2, tensor=1, data=2),
    harness.Layout(pipeline=1, tensor=2, data=2),
    harness.Layout(pipeline=2, tensor=2, data=1),
]
OPTIMIZERS = {"sgd": (SGD, 0.0), "adamw-clip": (ADAMW, CLIP)}


def _document(layout: harness.Layout, optimizer: str, **overrides: Any) -> dict[str, Any]:
    section, clip = OPTIMIZERS[optimizer]
    data = {"source": "text", "path": str(harness.text_corpus())}
    return harness.job_document(layout, optimizer=section, gradient_clipping=clip, steps=STEPS, data=data, **overrides)


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
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: layout.name)
def test_layout_reproduces_single_process_losses(tmp_path: Path, layout: harness.Layout, optimizer: str) -> None:
    job = harness.write_job(tmp_path, _document(layout, optimizer))
    gang = harness.Gang()
    gang.start(job, tmp_path / "out", nproc=layout.world)
    result = gang.wait(timeout=180)
    assert result.returncodes == [0], result.logs[0][-3000:]
    _assert_matches_reference(tmp_path / "out", optimizer)


@pytest.mark.slow
def test_two_nodes_of_four_ranks_reproduce_single_process_losses(tmp_path: Path) -> None:
    layout = harness.Layout(pipeline=2, tensor=2, data=2)
    job = harness.write_job(tmp_path, _document(layout, "adamw-clip", ranks_per_node=4))
    gang = harness.Gang()
    gang.start(job, tmp_path / "out", nproc=4, nnodes=2)
    result = gang.wait(timeout=180)
    assert result.returncodes == [0, 0], "\n".join(log[-2000:] for log in result.logs)
    _assert_matches_reference(tmp_path / "out", "adamw-clip")


@pytest.mark.slow
def test_activation_checkpointing_does_not_change_the_losses(tmp_path: Path) -> None:
    layout = harness.Layout(pipeline=2, tensor=2, data=1)
    document = _document(layout, "sgd", model={"activationCheckpointInterval": 1})
    gang = harness.Gang()
    gang.start(harness.write_job(tmp_path, document), tmp_path / "out", nproc=layout.world)
    result = gang.wait(timeout=180)
    assert result.returncodes == [0], result.logs[0][-3000:]
    _assert_matches_reference(tmp_path / "out", "sgd")


@pytest.mark.slow
def test_bf16_follows_the_fp32_reference_within_bf16_precision(tmp_path: Path) -> None:
    layout = harness.Layout(pipeline=2, tensor=2, data=1)
    document = _document(layout, "adamw-clip", model={"precision": "bf16"})
    gang = harness.Gang()
    gang.start(harness.write_job(tmp_path, document), tmp_path / "out", nproc=layout.world)
    result = gang.wait(timeout=180)
    assert result.returncodes == [0], result.logs[0][-3000:]
    reference, logged = _reference("adamw-clip"), harness.steps_by_number(tmp_path / "out")
    # bf16 keeps 8 bits of mantissa: a few 1e-3 of loss is its noise, a layout or scale bug is far more.
    assert max(abs(logged[s]["loss"] - reference[s].loss) for s in reference) < 3e-2
    assert all(record["grad_norm"] > 0 for record in logged.values())
