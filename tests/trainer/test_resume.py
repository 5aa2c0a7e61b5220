"""Proof 3: a gang killed mid-run and restarted resumes from its last checkpoint on the same loss curve."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paralleljob_contract.layout import Layout
from tests.trainer import harness

LAYOUT = Layout(pipeline=2, tensor=2, data=2)
ADAMW = {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}}
STEPS, CHECKPOINT_EVERY, KILL_AT = 12, 6, 8


def _run(tmp_path: Path, name: str, job: Path, hook: str, extra: dict[str, str] | None = None) -> harness.Result:
    gang = harness.Gang()
    env = {"PARALLELJOB_PROGRESS_HOOK": f"tests.trainer.progress_hooks:{hook}"}
    env["TEST_HOOK_LOG"] = str(tmp_path / f"{name}-hook.jsonl")
    gang.start(
        job, tmp_path / "out", nproc=LAYOUT.world_size, checkpoint_dir=tmp_path / name, extra_env=env | (extra or {})
    )
    return gang.wait(timeout=180)


def _hook_calls(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


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
    straight = harness.write_job(tmp_path / "straight", document)
    result = _run(tmp_path / "straight", "ckpt", straight, "recording")
    assert result.returncodes == [0], result.logs[0][-3000:]
    uninterrupted = harness.steps_by_number(tmp_path / "straight" / "out")

    interrupted = harness.write_job(tmp_path / "killed", document)
    killed = _run(tmp_path / "killed", "ckpt", interrupted, "kill_gang", {"TEST_KILL_AT_STEP": str(KILL_AT)})
    assert killed.returncodes[0] != 0
    assert max(harness.steps_by_number(tmp_path / "killed" / "out")) == KILL_AT
    assert (tmp_path / "killed" / "ckpt" / "latest").read_text().strip() == f"global_step{CHECKPOINT_EVERY}"

    restarted = _run(tmp_path / "killed", "ckpt", interrupted, "recording")
    assert restarted.returncodes == [0], restarted.logs[0][-3000:]
    resumed = harness.steps_by_number(tmp_path / "killed" / "out")
    worst = max(abs(resumed[s]["loss"] - uninterrupted[s]["loss"]) for s in range(CHECKPOINT_EVERY + 1, STEPS + 1))
    assert worst <= 1e-5, f"resumed losses differ by {worst:.2e}"
    summary = harness.records(tmp_path / "killed" / "out", "summary")[-1]
    assert summary["resumed_from"] == CHECKPOINT_EVERY

    calls = _hook_calls(tmp_path / "straight" / "ckpt-hook.jsonl")
    assert [c for c in calls if c["method"] == "created"] == [{"method": "created", "rank": 0}], "rank 0 only"
    assert [c["step"] for c in calls if c["method"] == "on_step"] == list(range(1, STEPS + 1))
    assert [c["step"] for c in calls if c["method"] == "on_checkpoint"] == [6, 12]
    assert [c["method"] for c in calls][-1] == "on_finish"
