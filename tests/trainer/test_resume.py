"""Proof 3: a gang killed mid-run and restarted resumes from its last checkpoint on the same loss curve.

The curve it must stay on is the single-process reference's (tests/trainer/reference.py), which an uninterrupted
run of this layout reproduces (test_matches_single_process.py): a resume that loses optimizer state, data
position or learning-rate schedule leaves it by far more than the tolerance.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paralleljob_contract.jobfile import parse_job_config
from paralleljob_contract.layout import Layout
from testcluster import trainer_harness as harness
from tests.trainer.reference import train_reference

LAYOUT = Layout(pipeline=2, tensor=2, data=2)
ADAMW = {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}}
STEPS, CHECKPOINT_EVERY, KILL_AT = 12, 6, 8


def _run(folder: Path, job: Path, hook: str, extra: dict[str, str] | None = None) -> harness.Result:
    """One gang of `job` writing to folder/out and folder/ckpt; its progress hook logs to folder/HOOK-hook.jsonl."""
    gang = harness.Gang()
    env = {"PARALLELJOB_PROGRESS_HOOK": f"tests.trainer.progress_hooks:{hook}"}
    env["TEST_HOOK_LOG"] = str(folder / f"{hook}-hook.jsonl")
    gang.start(
        job, folder / "out", nproc=LAYOUT.world_size, checkpoint_dir=folder / "ckpt", extra_env=env | (extra or {})
    )
    return gang.wait(timeout=180)


def _hook_calls(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _assert_hook_saw(calls: list[dict[str, object]], steps: range, checkpoints: list[tuple[str, int]]) -> None:
    """Built on rank 0 only; every step of `steps`; `checkpoints` as (event, step): saves, and the resume's load."""
    assert [c for c in calls if c["method"] == "created"] == [{"method": "created", "rank": 0}], "rank 0 only"
    assert [c["step"] for c in calls if c["method"] == "on_step"] == list(steps)
    assert [(c["event"], c["step"]) for c in calls if c["method"] == "on_checkpoint"] == checkpoints


@pytest.mark.slow
def test_killed_run_resumes_from_checkpoint_on_the_same_loss_curve(tmp_path: Path) -> None:
    document = harness.job_document(
        LAYOUT,
        optimizer=ADAMW,
        gradient_clipping=1.0,
        steps=STEPS,
        checkpoint_interval=CHECKPOINT_EVERY,
        data={"source": "text", "path": str(harness.text_corpus())},
    )
    job = harness.write_job(tmp_path, document)
    killed = _run(tmp_path, job, "kill_gang", {"TEST_KILL_AT_STEP": str(KILL_AT)})
    assert killed.returncodes[0] != 0
    assert max(harness.steps_by_number(tmp_path / "out")) == KILL_AT
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == f"global_step{CHECKPOINT_EVERY}"

    restarted = _run(tmp_path, job, "recording")
    assert restarted.returncodes == [0], restarted.logs[0][-3000:]
    # Steps 1-6 as the killed gang logged them, 7-12 as the restarted one did (it logs 7 and 8 again).
    logged = harness.steps_by_number(tmp_path / "out")
    assert sorted(logged) == list(range(1, STEPS + 1))
    reference = train_reference(parse_job_config(document))
    worst = max(abs(logged[s]["loss"] - reference[s].loss) for s in reference)
    assert worst <= 1e-5, f"losses differ from the uninterrupted reference by {worst:.2e}"
    summary = harness.records(tmp_path / "out", "summary")[-1]
    assert summary["resumed_from"] == CHECKPOINT_EVERY

    _assert_hook_saw(
        _hook_calls(tmp_path / "kill_gang-hook.jsonl"), range(1, KILL_AT + 1), [("checkpoint", CHECKPOINT_EVERY)]
    )
    resumed_calls = _hook_calls(tmp_path / "recording-hook.jsonl")
    _assert_hook_saw(
        resumed_calls, range(CHECKPOINT_EVERY + 1, STEPS + 1), [("resume", CHECKPOINT_EVERY), ("checkpoint", STEPS)]
    )
    assert [c["method"] for c in resumed_calls][-1] == "on_finish"
