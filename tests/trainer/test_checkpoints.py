"""Checkpoints never lose, mix or half-write training: the final save, the manifest and its checks, fallback
past a damaged checkpoint, early storage checks, a disk that fills during a save, and resume with another DP.

Ranks are started directly (`Gang.start_ranks`) so that each rank's exit code and message can be checked.
Storage failures run the ranks in a mount namespace of their own with a small tmpfs (`PrivateTmpfs`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from paralleljob_contract.layout import Layout
from testcluster import trainer_harness as harness

SGD = {"type": "SGD", "params": {"lr": 0.1}}
ADAMW = {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}}
PP2 = Layout(pipeline=2, tensor=1, data=1)


def _run(
    folder: Path,
    document: dict[str, Any],
    checkpoints: Path,
    *,
    env: dict[str, str] | None = None,
    prefix: tuple[str, ...] = (),
) -> harness.Result:
    job = harness.write_job(folder, document)
    gang = harness.Gang()
    world = int(document["plan"]["worldSize"])
    gang.start_ranks(job, folder / "out", world=world, checkpoint_dir=checkpoints, extra_env=env, prefix=prefix)
    return gang.wait(timeout=240)


def _error_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("paralleljob-trainer: error")]


def _assert_every_rank_stops_with(result: harness.Result, code: int, message: str) -> None:
    assert result.returncodes == [code] * len(result.returncodes), [log[-1500:] for log in result.logs]
    for rank, log in enumerate(result.logs):
        errors = _error_lines(log)
        assert len(errors) == 1 and message in errors[0], f"rank {rank}: {log[-1500:]}"
        assert "Traceback" not in log, f"rank {rank}: {log[-1500:]}"


def _committed(checkpoints: Path) -> list[str]:
    return sorted(path.name for path in checkpoints.iterdir() if path.is_dir())


def _losses(folder: Path) -> dict[int, float]:
    return {step: record["loss"] for step, record in harness.steps_by_number(folder / "out").items()}


def _pp2_job(steps: int) -> dict[str, Any]:
    """PP2, saving every 2 steps and keeping 2 checkpoints."""
    document = harness.job_document(PP2, optimizer=SGD, steps=steps, checkpoint_interval=2)
    document["spec"]["checkpoint"]["keep"] = 2
    return document


@pytest.fixture(scope="module")
def finished_pp2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A PP2 run of 5 steps saving every 2 and keeping 2: its folder holds out/ and ckpt/."""
    folder = tmp_path_factory.mktemp("finished-pp2")
    result = _run(folder, _pp2_job(5), folder / "ckpt")
    assert result.returncodes == [0, 0], result.logs[0][-3000:]
    return folder


@pytest.mark.slow
def test_the_last_step_is_saved_and_marked_latest_whatever_the_interval(finished_pp2: Path) -> None:
    checkpoints = finished_pp2 / "ckpt"
    assert (checkpoints / "latest").read_text().strip() == "global_step5"
    summary = harness.records(finished_pp2 / "out", "summary")[-1]
    assert summary["last_checkpoint_step"] == 5
    assert [record["step"] for record in harness.records(finished_pp2 / "out", "checkpoint")] == [2, 4, 5]


@pytest.mark.slow
def test_only_the_newest_keep_checkpoints_stay_on_the_volume(finished_pp2: Path) -> None:
    assert _committed(finished_pp2 / "ckpt") == ["global_step4", "global_step5"], "keep 2: step 2 is deleted"


@pytest.mark.slow
def test_each_checkpoint_records_its_job_run_and_every_file_with_its_checksum(finished_pp2: Path) -> None:
    folder = finished_pp2 / "ckpt" / "global_step5"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["job"] == {"namespace": "default", "name": "trainer-test", "uid": None}
    assert manifest["layout"] == {"pipeline": 2, "tensor": 1, "data": 1}
    assert (manifest["step"], manifest["samples"], manifest["zeroStage"], manifest["trainBatchSize"]) == (5, 40, 0, 8)
    assert manifest["data"] == {"source": "synthetic", "seed": 7, "nextStep": 6}
    assert manifest["model"]["hidden_size"] == 64
    on_disk = sorted(path.name for path in folder.iterdir() if path.name != "manifest.json")
    assert sorted(manifest["files"]) == on_disk
    for name, entry in manifest["files"].items():
        assert entry["bytes"] == (folder / name).stat().st_size
        assert len(entry["sha256"]) == 64


@pytest.mark.slow
def test_a_damaged_newest_checkpoint_is_skipped_and_training_resumes_from_the_one_before(
    finished_pp2: Path, tmp_path: Path
) -> None:
    checkpoints = tmp_path / "ckpt"
    shutil.copytree(finished_pp2 / "ckpt", checkpoints)
    victim = checkpoints / "global_step5" / "layer_03-model_00-model_states.pt"
    damaged = bytearray(victim.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF  # same size, one flipped byte: only the checksum can tell
    victim.write_bytes(bytes(damaged))

    result = _run(tmp_path, _pp2_job(5), checkpoints)

    assert result.returncodes == [0, 0], result.logs[0][-3000:]
    assert f"skipped checkpoints global_step5 ({victim} does not match its checksum)" in result.logs[0]
    resume = harness.records(tmp_path / "out", "resume")[-1]
    assert (resume["step"], len(resume["skipped"])) == (4, 1)
    assert _losses(tmp_path) == {5: _losses(finished_pp2)[5]}
    assert _committed(checkpoints) == ["global_step4", "global_step5"], "the damaged one was replaced"


def _another_job(document: dict[str, Any]) -> dict[str, Any]:
    document["metadata"]["name"] = "another-job"
    return document


FOREIGN_OR_INCOMPATIBLE = {
    "another-job": (
        lambda: _another_job(harness.job_document(PP2, optimizer=SGD, steps=8)),
        "belongs to job default/trainer-test, not default/another-job",
    ),
    "zero-stage-0-to-1": (
        lambda: harness.job_document(
            Layout(1, 1, 2), optimizer=SGD, steps=8, deepspeed_extra={"zero_optimization": {"stage": 1}}
        ),
        "holds ZeRO stage 0 optimizer state and this job uses stage 1; keep zero_optimization.stage 0",
    ),
    "another-model": (
        lambda: harness.job_document(PP2, optimizer=SGD, steps=8, model={"hiddenSize": 128}),
        "is of another model (hidden_size 64 -> 128, ffn_hidden_size 256 -> 512)",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(FOREIGN_OR_INCOMPATIBLE))
def test_a_foreign_or_incompatible_checkpoint_stops_every_rank_with_one_line_naming_the_difference(
    finished_pp2: Path, tmp_path: Path, case: str
) -> None:
    build, message = FOREIGN_OR_INCOMPATIBLE[case]
    checkpoints = tmp_path / "ckpt"
    shutil.copytree(finished_pp2 / "ckpt", checkpoints)

    result = _run(tmp_path, build(), checkpoints)

    _assert_every_rank_stops_with(result, 3, message)
    assert not harness.steps_by_number(tmp_path / "out"), "no step may run"


UNUSABLE_FOLDERS = {
    "read-only": ({"size": "64m", "read_only": True}, "is on a read-only file system"),
    "too-small": ({"size": "1m"}, "free but one checkpoint needs about"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(UNUSABLE_FOLDERS))
def test_an_unusable_checkpoint_folder_stops_every_rank_before_any_process_group(tmp_path: Path, case: str) -> None:
    mount, message = UNUSABLE_FOLDERS[case]
    document = harness.job_document(PP2, optimizer=SGD, steps=4, checkpoint_interval=2)
    with harness.PrivateTmpfs(tmp_path / "volume", **mount) as volume:
        result = _run(tmp_path, document, tmp_path / "volume" / "ckpt", prefix=volume.enter)

    _assert_every_rank_stops_with(result, 5, message)
    assert all("Initializing TorchBackend" not in log for log in result.logs), "a process group was formed"


@pytest.mark.slow
def test_a_disk_that_fills_during_a_save_stops_every_rank_and_keeps_the_earlier_checkpoint(tmp_path: Path) -> None:
    document = harness.job_document(PP2, optimizer=SGD, steps=4, checkpoint_interval=2)
    volume_path = tmp_path / "volume"
    env = {
        "PARALLELJOB_PROGRESS_HOOK": "tests.trainer.progress_hooks:fill_disk",
        "TEST_HOOK_LOG": str(tmp_path / "hook.jsonl"),
        "TEST_FILL_AT_STEP": "3",
        "TEST_FILL_PATH": str(volume_path / "filler"),
    }
    with harness.PrivateTmpfs(volume_path, "8m") as volume:
        result = _run(tmp_path, document, volume_path / "ckpt", env=env, prefix=volume.enter)
        left = tmp_path / "left"
        subprocess.run([*volume.enter, "cp", "-a", str(volume_path / "ckpt"), str(left)], check=True)

    _assert_every_rank_stops_with(result, 5, f"checkpoint folder {volume_path / 'ckpt'} is full")
    assert "the partial checkpoint of step 4 was removed and earlier ones are intact" in _error_lines(result.logs[0])[0]
    assert _committed(left) == ["global_step2"]
    assert (left / "latest").read_text().strip() == "global_step2"
    manifest = json.loads((left / "global_step2" / "manifest.json").read_text())
    assert all(
        (left / "global_step2" / name).stat().st_size == entry["bytes"] for name, entry in manifest["files"].items()
    )


ZERO_STAGES = {"zero0": {}, "zero1": {"zero_optimization": {"stage": 1}}}


@pytest.mark.slow
@pytest.mark.parametrize("stage", list(ZERO_STAGES))
def test_a_resume_with_another_data_parallel_size_continues_the_same_loss_curve(tmp_path: Path, stage: str) -> None:
    def document(data: int) -> dict[str, Any]:
        return harness.job_document(
            Layout(1, 1, data),
            optimizer=ADAMW,
            gradient_clipping=1.0,
            steps=8,
            checkpoint_interval=3,
            data={"source": "text", "path": str(harness.text_corpus())},
            deepspeed_extra=ZERO_STAGES[stage],
        )

    straight = _run(tmp_path / "dp2", document(2), tmp_path / "dp2" / "ckpt")
    assert straight.returncodes == [0, 0], straight.logs[0][-3000:]
    shrunk_ckpt = tmp_path / "dp1" / "ckpt"
    shutil.copytree(tmp_path / "dp2" / "ckpt" / "global_step3", shrunk_ckpt / "global_step3")
    shrunk = _run(tmp_path / "dp1", document(1), shrunk_ckpt)
    assert shrunk.returncodes == [0], shrunk.logs[0][-3000:]
    resumed = _losses(tmp_path / "dp1")
    if stage == "zero1":
        # ZeRO 1 shards the optimizer state over DP: growing DP back re-cuts the shards the other way.
        grown_ckpt = tmp_path / "dp2-again" / "ckpt"
        shutil.copytree(shrunk_ckpt / "global_step6", grown_ckpt / "global_step6")
        grown = _run(tmp_path / "dp2-again", document(2), grown_ckpt)
        assert grown.returncodes == [0, 0], grown.logs[0][-3000:]
        assert harness.records(tmp_path / "dp2-again" / "out", "resume")[-1]["step"] == 6
        resumed |= _losses(tmp_path / "dp2-again")

    reference = _losses(tmp_path / "dp2")
    assert sorted(resumed) == list(range(4, 9))
    worst = max(abs(resumed[step] - reference[step]) for step in resumed)
    assert worst <= 1e-5, f"losses after the DP change differ by {worst:.2e}"


@pytest.mark.slow
def test_a_zero1_run_with_torchs_adamw_resumes_at_the_same_layout_on_the_same_loss_curve(tmp_path: Path) -> None:
    # torch's AdamW keeps its step per parameter, where DeepSpeed's own elastic ZeRO load looks for it in the
    # param groups and stops (bench/trainer_relayout.py --zero 1 found it).
    document = harness.job_document(
        Layout(1, 1, 2),
        optimizer=ADAMW,
        gradient_clipping=1.0,
        steps=6,
        checkpoint_interval=3,
        data={"source": "text", "path": str(harness.text_corpus())},
        deepspeed_extra=ZERO_STAGES["zero1"],
    )
    straight = _run(tmp_path / "straight", document, tmp_path / "straight" / "ckpt")
    assert straight.returncodes == [0, 0], straight.logs[0][-3000:]
    resumed_ckpt = tmp_path / "resumed" / "ckpt"
    shutil.copytree(tmp_path / "straight" / "ckpt" / "global_step3", resumed_ckpt / "global_step3")
    resumed = _run(tmp_path / "resumed", document, resumed_ckpt)
    assert resumed.returncodes == [0, 0], resumed.logs[0][-3000:]
    losses, reference = _losses(tmp_path / "resumed"), _losses(tmp_path / "straight")
    assert sorted(losses) == [4, 5, 6]
    worst = max(abs(losses[step] - reference[step]) for step in losses)
    assert worst <= 1e-5, f"losses after the resume differ by {worst:.2e}"
