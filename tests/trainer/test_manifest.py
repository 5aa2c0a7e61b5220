"""Which checkpoints a job may resume from: the manifest of a saved job against the job about to resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from paralleljob_contract.jobfile import JobConfig, parse_job_config
from paralleljob_contract.layout import Layout
from paralleljob_trainer import manifest
from testcluster import trainer_harness as harness

ADAMW = {"type": "AdamW", "params": {"lr": 3e-3}}
FOLDER = Path("/checkpoints/default/trainer-test/global_step6")


def _job(
    data: int,
    *,
    precision: str = "fp32",
    zero: int = 0,
    uid: str = "uid-1",
    pipeline: int = 2,
    tensor: int = 1,
    **extra: Any,
) -> JobConfig:
    deepspeed = {"zero_optimization": {"stage": zero}} if zero else None
    document = harness.job_document(
        Layout(pipeline, tensor, data),
        optimizer=ADAMW,
        model={"precision": precision},
        deepspeed_extra=deepspeed,
        **extra,
    )
    document["metadata"]["uid"] = uid
    return parse_job_config(document)


def _saved(job: JobConfig) -> dict[str, Any]:
    return manifest.build(job, 6, FOLDER, [])


COMPATIBLE = {
    "unchanged": (_job(2), _job(2)),
    "recreated-under-the-same-name": (_job(2, uid="uid-1"), _job(2, uid="uid-2")),
    "dp-fp32-zero0": (_job(2), _job(1)),
    "dp-bf16-zero1": (_job(2, precision="bf16", zero=1), _job(1, precision="bf16", zero=1)),
    "pp-and-tp-fp32-zero0": (_job(2), _job(2, pipeline=1, tensor=2)),
    "pp-tp-and-dp-bf16-zero1": (_job(2, precision="bf16", zero=1), _job(4, precision="bf16", zero=1, pipeline=1)),
}


@pytest.mark.parametrize("case", list(COMPATIBLE))
def test_a_job_resumes_a_checkpoint_of_the_same_model_at_any_layout(case: str) -> None:
    saved, resuming = COMPATIBLE[case]
    assert manifest.incompatibility(_saved(saved), resuming, FOLDER, foreign_ok=False) is None


INCOMPATIBLE = {
    "dp-bf16-zero0": (
        _job(2, precision="bf16"),
        _job(1, precision="bf16"),
        "saved at PP2xTP1xDP2 with bf16 and ZeRO 0, whose optimizer state only that layout can read",
    ),
    "tp-bf16-zero0": (
        _job(2, precision="bf16"),
        _job(2, precision="bf16", tensor=2),
        "and this job is PP2xTP2xDP2; resume with the saved layout, or train with zero_optimization.stage 1",
    ),
    "zero-stage": (_job(2), _job(2, zero=1), "holds ZeRO stage 0 optimizer state and this job uses stage 1"),
    "train-batch": (_job(2), _job(2, train_batch_size=16), "train_batch_size 8 and this job uses 16"),
    "precision": (_job(2), _job(2, precision="bf16"), "is of another model (precision fp32 -> bf16)"),
}


@pytest.mark.parametrize("case", list(INCOMPATIBLE))
def test_an_incompatible_checkpoint_is_refused_with_one_line_naming_the_difference(case: str) -> None:
    saved, resuming, message = INCOMPATIBLE[case]
    problem = manifest.incompatibility(_saved(saved), resuming, FOLDER, foreign_ok=False)
    assert problem is not None and message in problem and "\n" not in problem


def test_resume_from_accepts_another_jobs_checkpoint_of_the_same_model() -> None:
    other = _saved(_job(2))
    other["job"]["name"] = "gpt-base"
    assert manifest.incompatibility(other, _job(2), FOLDER, foreign_ok=True) is None
    assert "belongs to job default/gpt-base" in (
        manifest.incompatibility(other, _job(2), FOLDER, foreign_ok=False) or ""
    )
