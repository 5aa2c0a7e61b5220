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
from tests.trainer import harness
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
    job = harness.write_job(folder, document(layout, stage))
    gang = harness.Gang()
    gang.start(job, folder / "out", nproc=layout.world_size, checkpoint_dir=folder / "ckpt", extra_env=extra_env)
    return gang.wait(timeout=600)


@pytest.fixture(scope="module", params=sorted(ZERO))
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """(ZeRO stage, the 2x2x2 run's checkpoint folder holding step 10), killed in step 11."""
    stage = request.param
    folder = tmp_path_factory.mktemp(f"saved-{stage}")
    hook = {"PARALLELJOB_PROGRESS_HOOK": "tests.trainer.progress_hooks:kill_gang"}
    killed = _run(folder, SAVED, stage, hook | {"TEST_KILL_AT_STEP": str(SAVE_AT + 1), "TEST_HOOK_LOG": "/dev/null"})
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
