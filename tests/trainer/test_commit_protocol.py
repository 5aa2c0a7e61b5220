"""The commit protocol's order of durable steps, and retention, on real files in one process.

A node crash cannot be staged in a test; what makes a checkpoint survive one can be observed: every file
is fsynced as it is written, the manifest and the folder before the rename, the parent after it, and
`latest` only then, itself written to a temporary name, fsynced and renamed. `os.fsync`, `os.rename` and
`os.replace` are wrapped to record each call (the real call still happens) with the path it concerns.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from paralleljob_contract.jobfile import parse_job_config
from paralleljob_contract.layout import Layout
from paralleljob_trainer import checkpoint, storage
from testcluster import trainer_harness as harness


@pytest.fixture
def durable_steps(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(operation, path) of every fsync, rename and replace, in order."""
    steps: list[tuple[str, str]] = []
    real_fsync, real_rename, real_replace = os.fsync, os.rename, os.replace

    def fsync(descriptor: int) -> None:
        steps.append(("fsync", os.readlink(f"/proc/self/fd/{descriptor}")))
        real_fsync(descriptor)

    def rename(source: str | Path, target: str | Path) -> None:
        steps.append(("rename", f"{source} -> {target}"))
        real_rename(source, target)

    def replace(source: str | Path, target: str | Path) -> None:
        steps.append(("replace", f"{source} -> {target}"))
        real_replace(source, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(os, "replace", replace)
    return steps


def _job():
    return parse_job_config(harness.job_document(Layout(1, 1, 1), optimizer={"type": "SGD", "params": {"lr": 0.1}}))


def test_a_checkpoint_file_is_fsynced_and_checksummed_as_it_is_written(
    tmp_path: Path, durable_steps: list[tuple[str, str]]
) -> None:
    writes = storage.GuardedWrites(object(), tmp_path)
    path = tmp_path / "layer_00-model_00-model_states.pt"

    writes.save({"weight": torch.arange(6.0)}, str(path))

    assert durable_steps == [("fsync", str(path))]
    assert writes.written == [storage.WrittenFile(str(path), path.stat().st_size, storage.sha256_of(path))]
    assert torch.load(path)["weight"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_a_failed_write_is_recorded_not_raised_and_leaves_no_partial_file(tmp_path: Path) -> None:
    writes = storage.GuardedWrites(object(), tmp_path)

    writes.save({"weight": torch.zeros(2)}, str(tmp_path / "missing-folder" / "file.pt"))
    writes.save({"weight": torch.zeros(2)}, str(tmp_path / "after-a-failure.pt"))

    assert writes.failure is not None and "missing-folder" in writes.failure
    assert writes.written == [] and not (tmp_path / "after-a-failure.pt").exists(), "no write after a failure"


def test_the_manifest_and_folder_are_durable_before_the_rename_and_latest_only_after(
    tmp_path: Path, durable_steps: list[tuple[str, str]]
) -> None:
    staging = tmp_path / ".tmp-global_step4"
    staging.mkdir()
    states = staging / "mp_rank_00_model_states.pt"
    states.write_bytes(b"weights")
    written = [storage.WrittenFile(str(states), states.stat().st_size, storage.sha256_of(states))]

    assert checkpoint._commit(_job(), tmp_path, 4, staging, [(written, None)]) is None

    final, latest = tmp_path / "global_step4", tmp_path / "latest"
    assert durable_steps == [
        ("fsync", str(staging / "manifest.json")),
        ("fsync", str(staging)),
        ("rename", f"{staging} -> {final}"),
        ("fsync", str(tmp_path)),
        ("fsync", str(tmp_path / ".latest.tmp")),
        ("replace", f"{tmp_path / '.latest.tmp'} -> {latest}"),
        ("fsync", str(tmp_path)),
    ]
    assert latest.read_text() == "global_step4\n"
    manifest = json.loads((final / "manifest.json").read_text())
    assert manifest["files"] == {states.name: {"bytes": 7, "sha256": storage.sha256_of(final / states.name)}}


def test_a_rank_that_failed_to_write_makes_the_commit_remove_the_partial_folder_and_keep_latest(tmp_path: Path) -> None:
    (tmp_path / "global_step2").mkdir()
    (tmp_path / "latest").write_text("global_step2\n")
    staging = tmp_path / ".tmp-global_step4"
    staging.mkdir()
    (staging / "half-written.pt").write_bytes(b"half")

    problem = checkpoint._commit(_job(), tmp_path, 4, staging, [([], None), ([], "checkpoint folder X is full")])

    assert (
        problem
        == "checkpoint folder X is full; the partial checkpoint of step 4 was removed and earlier ones are intact"
    )
    assert sorted(path.name for path in tmp_path.iterdir()) == ["global_step2", "latest"]
    assert (tmp_path / "latest").read_text() == "global_step2\n"


def test_retention_keeps_the_newest_checkpoints_and_clears_what_earlier_saves_and_resumes_set_aside(
    tmp_path: Path,
) -> None:
    for name in (
        "global_step2",
        "global_step10",
        "global_step4",
        "global_step8",
        ".damaged-global_step12",
        ".tmp-global_step14",
    ):
        (tmp_path / name).mkdir()
    (tmp_path / "latest").write_text("global_step10\n")

    checkpoint._apply_retention(tmp_path, keep=2)

    assert sorted(path.name for path in tmp_path.iterdir()) == ["global_step10", "global_step8", "latest"]
