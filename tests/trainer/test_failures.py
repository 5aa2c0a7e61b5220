"""Proof 4: a bad job stops every rank with a one-line message naming the problem, and nothing hangs.

Ranks are started directly (as torchrun would start them) so that each rank's own exit code and message can
be checked; torchrun would tear down the others as soon as the first one failed. The process-group timeout is
an hour there, far beyond the gang's wait, so a rank that waited for a dead peer would fail the test; how long
the ranks take is measured in bench/failure_detection.py, not asserted here.
Those failures are all found before any process group exists; a rank frozen in the middle of training shows
that its peers, blocked in collectives and pipeline transfers, give up within the process-group timeout. (A
frozen rank rather than a killed one: gloo notices a killed peer's closed sockets within seconds, while a
frozen peer, like a hung GPU, keeps them open and only the timeout of every group it belongs to helps.)
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from paralleljob_contract.layout import Layout
from testcluster import trainer_harness as harness

SGD = {"type": "SGD", "params": {"lr": 0.1}}
PG_TIMEOUT_S = 20
# A rank that waits for a dead peer waits for its process-group timeout: an hour here, past any wait below.
HANG_PG_TIMEOUT = {"PARALLELJOB_PG_TIMEOUT_SECONDS": "3600"}
# How long a frozen peer's survivors may take before the test calls it a hang: many process-group timeouts.
HANG_AFTER_S = 10 * PG_TIMEOUT_S


def _run_ranks(tmp_path: Path, document: dict[str, Any], checkpoint_dir: Path | None = None) -> harness.Result:
    job = harness.write_job(tmp_path, document)
    gang = harness.Gang()
    world = int(document["plan"]["worldSize"])
    gang.start_ranks(job, tmp_path / "out", world=world, checkpoint_dir=checkpoint_dir, extra_env=HANG_PG_TIMEOUT)
    return gang.wait(timeout=300)


def _error_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("paralleljob-trainer: error")]


def _bad_layers() -> dict[str, Any]:
    return harness.job_document(Layout(2, 1, 1), optimizer=SGD, model={"layers": 1})


def _bad_heads() -> dict[str, Any]:
    return harness.job_document(Layout(1, 2, 1), optimizer=SGD, model={"hiddenSize": 48, "attentionHeads": 3})


def _missing_data() -> dict[str, Any]:
    data = {"source": "tokens", "path": "/nonexistent/train.bin", "tokenDtype": "uint16"}
    return harness.job_document(Layout(2, 1, 1), optimizer=SGD, data=data)


def _token_outside_vocabulary(tmp_path: Path) -> dict[str, Any]:
    # At PP3 only the first and last stages read tokens: the middle one must stop as well, at once.
    tokens = tmp_path / "train.bin"
    ids = np.arange(5000, dtype=np.uint16) % 256
    ids[-1] = 4000
    ids.tofile(tokens)
    data = {"source": "tokens", "path": str(tokens), "tokenDtype": "uint16"}
    return harness.job_document(Layout(3, 1, 1), optimizer=SGD, model={"layers": 3}, data=data)


def _fewer_ranks_per_node_than_launched() -> dict[str, Any]:
    # The plan puts one rank on each of two nodes; the launcher runs both on one (LOCAL_WORLD_SIZE 2).
    return harness.job_document(Layout(1, 2, 1), optimizer=SGD, ranks_per_node=1)


BAD_JOBS = {
    "layers-below-pipeline": (_bad_layers, "spec.model.layers (1) is smaller than parallelism.pipeline (2)"),
    "heads-not-divisible-by-tensor": (_bad_heads, "attentionHeads (3) is not divisible by parallelism.tensor (2)"),
    "missing-data-file": (_missing_data, "/nonexistent/train.bin does not exist"),
    "token-outside-vocabulary": (_token_outside_vocabulary, "holds token id 4000, outside spec.model.vocabSize"),
    "plan-disagrees-with-launcher": (
        _fewer_ranks_per_node_than_launched,
        "LOCAL_WORLD_SIZE is 2 but plan.ranksPerNode is 1",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(BAD_JOBS))
def test_bad_job_stops_every_rank_with_one_line(tmp_path: Path, case: str) -> None:
    build, message = BAD_JOBS[case]
    document = build(tmp_path) if case == "token-outside-vocabulary" else build()
    result = _run_ranks(tmp_path, document)
    assert result.returncodes == [2] * len(result.returncodes)
    for rank, log in enumerate(result.logs):
        errors = _error_lines(log)
        assert len(errors) == 1 and message in errors[0], f"rank {rank}: {log[-1500:]}"
        assert "Traceback" not in log


@pytest.mark.slow
def test_a_checkpoint_folder_whose_only_checkpoint_is_corrupted_stops_every_rank_with_one_line(tmp_path: Path) -> None:
    layout = Layout(2, 1, 1)
    checkpoints = tmp_path / "ckpt"
    first = harness.job_document(layout, optimizer=SGD, steps=2, checkpoint_interval=2)
    assert _run_ranks(tmp_path / "first", first, checkpoints).returncodes == [0] * layout.world_size
    victim = sorted((checkpoints / "global_step2").glob("layer_03-*.pt"))[0]
    victim.write_bytes(b"not a checkpoint" * 64)

    again = harness.job_document(layout, optimizer=SGD, steps=4, checkpoint_interval=2)
    result = _run_ranks(tmp_path / "again", again, checkpoints)
    assert result.returncodes == [3] * layout.world_size
    # Starting from step 0 instead would silently drop the training the damaged checkpoint held.
    expected = f"no checkpoint in {checkpoints} can be resumed from: global_step2 ({victim} has 1024 bytes"
    for log in result.logs:
        errors = _error_lines(log)
        assert len(errors) == 1 and expected in errors[0], log[-1500:]


def _wait_for_step(output: Path, step: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while max(harness.steps_by_number(output), default=0) < step:
        assert time.monotonic() < deadline, f"no step {step} within {timeout} s"
        time.sleep(0.2)


@pytest.mark.slow
def test_every_peer_of_a_rank_frozen_during_training_exits_within_the_timeout(tmp_path: Path) -> None:
    layout = Layout(2, 1, 2)
    job = harness.write_job(tmp_path, harness.job_document(layout, optimizer=SGD, steps=100_000))
    gang = harness.Gang()
    timeout_env = {"PARALLELJOB_PG_TIMEOUT_SECONDS": str(PG_TIMEOUT_S)}
    gang.start_ranks(job, tmp_path / "out", world=layout.world_size, extra_env=timeout_env)
    peers, victim = gang.processes[:-1], gang.processes[-1]  # the victim: last stage of replica 1
    try:
        _wait_for_step(tmp_path / "out", 2, timeout=120)
        victim.send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        while any(p.poll() is None for p in peers) and time.monotonic() < frozen + HANG_AFTER_S:
            time.sleep(0.2)
        still_running = [rank for rank, p in enumerate(peers) if p.poll() is None]
    finally:
        victim.send_signal(signal.SIGCONT)
        gang.stop()
    logs = "\n".join(f"rank {rank}: {path.read_text()[-600:]}" for rank, path in enumerate(gang.log_paths))
    assert not still_running, f"ranks {still_running} outlived a frozen peer by {HANG_AFTER_S} s\n{logs}"
    assert all(p.returncode != 0 for p in peers), logs
    # Each peer says in one line that it lost a peer (exit 4); none dies with a traceback.
    peer_logs = [path.read_text() for path in gang.log_paths[:-1]]
    assert [p.returncode for p in peers] == [4] * len(peers), logs
    assert all("a peer rank failed or stopped answering" in log and "Traceback" not in log for log in peer_logs), logs
