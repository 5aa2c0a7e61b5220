"""Proof 4: a bad job stops every rank with a one-line message naming the problem, and nothing hangs.

Ranks are started directly (as torchrun would start them) so that each rank's own exit code and message can
be checked; torchrun would tear down the others as soon as the first one failed. The wall-time bound is far
below the process-group timeout (60 s here), so a rank that waited for a dead peer would fail the test.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.trainer import harness

SGD = {"type": "SGD", "params": {"lr": 0.1}}
NO_HANG_S = 45


def _run_ranks(tmp_path: Path, document: dict[str, Any], checkpoint_dir: Path | None = None) -> harness.Result:
    job = harness.write_job(tmp_path, document)
    gang = harness.Gang()
    started = time.monotonic()
    gang.start_ranks(job, tmp_path / "out", world=int(document["plan"]["worldSize"]), checkpoint_dir=checkpoint_dir)
    result = gang.wait(timeout=120)
    assert time.monotonic() - started < NO_HANG_S, "a rank waited for a dead peer"
    return result


def _error_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("paralleljob-trainer: error")]


def _bad_layers() -> dict[str, Any]:
    return harness.job_document(harness.Layout(2, 1, 1), optimizer=SGD, model={"layers": 1})


def _bad_heads() -> dict[str, Any]:
    return harness.job_document(harness.Layout(1, 2, 1), optimizer=SGD, model={"hiddenSize": 48, "attentionHeads": 3})


def _missing_data() -> dict[str, Any]:
    data = {"source": "tokens", "path": "/nonexistent/train.bin", "tokenDtype": "uint16"}
    return harness.job_document(harness.Layout(2, 1, 1), optimizer=SGD, data=data)


def _wrong_plan() -> dict[str, Any]:
    document = harness.job_document(harness.Layout(1, 2, 1), optimizer=SGD)
    coords = document["plan"]["nodes"][0]["coords"]
    coords[0], coords[1] = coords[1], coords[0]
    return document


BAD_JOBS = {
    "layers-below-pipeline": (_bad_layers, "spec.model.layers (1) is smaller than parallelism.pipeline (2)"),
    "heads-not-divisible-by-tensor": (_bad_heads, "attentionHeads (3) is not divisible by parallelism.tensor (2)"),
    "missing-data-file": (_missing_data, "/nonexistent/train.bin does not exist"),
    "plan-disagrees-with-topology": (_wrong_plan, "rank layout mismatch: plan puts rank 0"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(BAD_JOBS))
def test_bad_job_stops_every_rank_with_one_line(tmp_path: Path, case: str) -> None:
    build, message = BAD_JOBS[case]
    result = _run_ranks(tmp_path, build())
    assert result.returncodes == [2] * len(result.returncodes)
    for rank, log in enumerate(result.logs):
        errors = _error_lines(log)
        assert len(errors) == 1 and message in errors[0], f"rank {rank}: {log[-1500:]}"
        assert "Traceback" not in log


@pytest.mark.slow
def test_corrupted_checkpoint_stops_every_rank_with_one_line(tmp_path: Path) -> None:
    layout = harness.Layout(2, 1, 1)
    checkpoints = tmp_path / "ckpt"
    first = harness.job_document(layout, optimizer=SGD, steps=2, checkpoint_interval=2)
    assert _run_ranks(tmp_path / "first", first, checkpoints).returncodes == [0] * layout.world
    victim = sorted((checkpoints / "global_step2").glob("layer_03-*.pt"))[0]
    victim.write_bytes(b"not a checkpoint" * 64)

    again = harness.job_document(layout, optimizer=SGD, steps=4, checkpoint_interval=2)
    result = _run_ranks(tmp_path / "again", again, checkpoints)
    assert result.returncodes == [3] * layout.world
    for log in result.logs:
        errors = _error_lines(log)
        assert len(errors) == 1 and f"corrupted checkpoint: {victim} is unreadable" in errors[0], log[-1500:]
