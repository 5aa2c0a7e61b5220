"""A checkpoint saved at PP2 x TP2 x DP2 resumes at another pipeline x tensor x data layout on the same curve.

One 2x2x2 run per ZeRO stage (0 and 1) saves step 10 of a 20-step job (fp32, AdamW, clipping at 1.0, text
data) and is killed in step 11; each other layout resumes from that one checkpoint (spec.checkpoint.resumeFrom,
read-only) and trains steps 11 to 20. The weights and AdamW's moments are merged and cut again
(`paralleljob_trainer.recut`), the step, schedule and data position carried over. The yardstick is the
single-process reference of the uninterrupted 20 steps: step 11 to 1e-5, steps 12 to 20 to 1e-4 relative
(reduction order drifts). The reference's own faulty resumes (optimizer state or data position lost) show
that the tolerance would catch either.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from paralleljob_contract.jobfile import parse_job_config
from paralleljob_contract.layout import Layout
from testcluster import trainer_harness as harness
from tests.trainer.reference import ReferenceStep, train_reference

SAVED = Layout(pipeline=2, tensor=2, data=2)
TARGETS = [Layout(1, 4, 2), Layout(4, 1, 2), Layout(2, 1, 4), Layout(1, 1, 1)]
ADAMW = {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}}
STEPS, SAVE_AT = 20, 10
ZERO = {"zero0": None, "zero1": {"zero_optimization": {"stage": 1}}}
FIRST_STEP_TOLERANCE, LATER_TOLERANCE = 1e-5, 1e-4


def document(layout: Layout, stage: str) -> dict[str, Any]:
    return harness.job_document(
        layout,
        optimizer=ADAMW,
        gradient_clipping=1.0,
        steps=STEPS,
        checkpoint_interval=SAVE_AT,
        data={"source": "text", "path": str(harness.text_corpus())},
        deepspeed_extra=ZERO[stage],
    )


def _run(folder: Path, layout: Layout, stage: str, extra_env: dict[str, str]) -> harness.Result:
    return _run_document(folder, document(layout, stage), layout, extra_env)


def _run_document(
    folder: Path, job_document: dict[str, Any], layout: Layout, extra_env: dict[str, str]
) -> harness.Result:
    job = harness.write_job(folder, job_document)
    gang = harness.Gang()
    gang.start(job, folder / "out", nproc=layout.world_size, checkpoint_dir=folder / "ckpt", extra_env=extra_env)
    return gang.wait(timeout=600)


def _killed_after(checkpoint_step: int) -> dict[str, str]:
    """The progress hook that kills the gang in the step after `checkpoint_step`, once that one is saved."""
    return {
        "PARALLELJOB_PROGRESS_HOOK": "tests.trainer.progress_hooks:kill_gang",
        "TEST_KILL_AT_STEP": str(checkpoint_step + 1),
        "TEST_HOOK_LOG": "/dev/null",
    }


@pytest.fixture(scope="module", params=sorted(ZERO))
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """(ZeRO stage, the 2x2x2 run's checkpoint folder holding step 10), killed in step 11."""
    stage = request.param
    folder = tmp_path_factory.mktemp(f"saved-{stage}")
    killed = _run(folder, SAVED, stage, _killed_after(SAVE_AT))
    assert killed.returncodes[0] != 0
    assert (folder / "ckpt" / "latest").read_text().strip() == f"global_step{SAVE_AT}", killed.logs[0][-3000:]
    return stage, folder / "ckpt"


@pytest.fixture(scope="module")
def reference() -> dict[int, ReferenceStep]:
    return train_reference(parse_job_config(document(Layout(1, 1, 1), "zero0")))


def _worst_relative(losses: dict[int, float], reference: dict[int, ReferenceStep], steps: range) -> float:
    return max(abs(losses[step] - reference[step].loss) / abs(reference[step].loss) for step in steps)


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS, ids=lambda layout: f"{layout.pipeline}x{layout.tensor}x{layout.data}")
def test_a_checkpoint_resumes_at_another_layout_on_the_single_process_curve(
    saved: tuple[str, Path], target: Layout, reference: dict[int, ReferenceStep], tmp_path: Path
) -> None:
    stage, checkpoints = saved
    result = _run(tmp_path, target, stage, {"PARALLELJOB_RESUME_FROM": str(checkpoints)})
    assert result.returncodes == [0], result.logs[0][-3000:]
    resume = harness.records(tmp_path / "out", "resume")[-1]
    name = f"PP{target.pipeline}xTP{target.tensor}xDP{target.data}"
    assert (resume["step"], resume["saved_layout"], resume["layout"]) == (SAVE_AT, "PP2xTP2xDP2", name)
    losses = {step: record["loss"] for step, record in harness.steps_by_number(tmp_path / "out").items()}
    assert sorted(losses) == list(range(SAVE_AT + 1, STEPS + 1))
    first = abs(losses[SAVE_AT + 1] - reference[SAVE_AT + 1].loss)
    assert first <= FIRST_STEP_TOLERANCE, f"step {SAVE_AT + 1} differs from the reference by {first:.2e}"
    later = _worst_relative(losses, reference, range(SAVE_AT + 2, STEPS + 1))
    assert later <= LATER_TOLERANCE, f"steps {SAVE_AT + 2}-{STEPS} differ from the reference by {later:.2e} relative"


@pytest.mark.parametrize("lost", ["optimizer", "data"])
def test_a_resume_that_loses_the_optimizer_state_or_the_data_position_leaves_the_curve_by_far_more(
    reference: dict[int, ReferenceStep], lost: str
) -> None:
    job = parse_job_config(document(Layout(1, 1, 1), "zero0"))
    faulty = train_reference(job, faulty_resume=(SAVE_AT, lost))
    losses = {step: faulty[step].loss for step in faulty}
    assert losses[SAVE_AT] == reference[SAVE_AT].loss  # the same run up to the checkpoint
    assert _worst_relative(losses, reference, range(SAVE_AT + 1, STEPS + 1)) > 100 * LATER_TOLERANCE


# A tied llama with two KV heads: at TP 2 each rank holds one KV head (K and V cut by rows), at TP 4 every rank
# holds both (whole); the tied embedding lives on the first and the last stage at PP 2, once at PP 1; the
# 300-token vocabulary is padded to 512 rows at TP 2 and 4.
LLAMA = {"architecture": "llama", "kvHeads": 2, "vocabSize": 300, "ropeTheta": 500000.0, "tieEmbeddings": True}
LLAMA_STEPS, LLAMA_SAVE_AT = 8, 4


def llama_document(layout: Layout) -> dict[str, Any]:
    return harness.job_document(
        layout,
        optimizer=ADAMW,
        gradient_clipping=0.5,
        steps=LLAMA_STEPS,
        checkpoint_interval=LLAMA_SAVE_AT,
        model=LLAMA,
        data={"source": "text", "path": str(harness.text_corpus())},
        deepspeed_extra=ZERO["zero1"],
    )


@pytest.mark.slow
def test_a_tied_grouped_query_llama_resumes_from_pp2_tp2_at_tp4(tmp_path: Path) -> None:
    saved, resumed = Layout(2, 2, 1), Layout(1, 4, 1)
    killed = _run_document(tmp_path / "saved", llama_document(saved), saved, _killed_after(LLAMA_SAVE_AT))
    assert killed.returncodes[0] != 0
    checkpoints = tmp_path / "saved" / "ckpt"
    assert (checkpoints / "latest").read_text().strip() == f"global_step{LLAMA_SAVE_AT}", killed.logs[0][-3000:]
    result = _run_document(
        tmp_path / "resumed", llama_document(resumed), resumed, {"PARALLELJOB_RESUME_FROM": str(checkpoints)}
    )
    assert result.returncodes == [0], result.logs[0][-3000:]
    logged = harness.steps_by_number(tmp_path / "resumed" / "out")
    assert sorted(logged) == list(range(LLAMA_SAVE_AT + 1, LLAMA_STEPS + 1))
    reference = train_reference(parse_job_config(llama_document(Layout(1, 1, 1))))
    losses = {step: record["loss"] for step, record in logged.items()}
    assert abs(losses[LLAMA_SAVE_AT + 1] - reference[LLAMA_SAVE_AT + 1].loss) <= FIRST_STEP_TOLERANCE
    assert _worst_relative(losses, reference, range(LLAMA_SAVE_AT + 2, LLAMA_STEPS + 1)) <= LATER_TOLERANCE
