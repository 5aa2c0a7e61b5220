"""Checkpoints: DeepSpeed save/load with a `latest` marker that is only written once every rank is done.

DeepSpeed's own `save_latest` lets rank 0 write `latest` as soon as rank 0 has saved, while other ranks may
still be writing; a kill in that window leaves `latest` naming a half-written checkpoint. Here every rank
saves with `save_latest=False`, all ranks meet at a barrier, and rank 0 then replaces `latest` atomically
(write a temporary file, rename). On resume rank 0 alone reads `latest` and broadcasts the tag, so every rank
takes the same path even when one of them sees a different folder (storage not mounted on its node). Before
loading, the ranks check the tag's files together and agree on one error, so a corrupted checkpoint stops
every rank with the same message instead of leaving some waiting.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

LATEST = "latest"


class CheckpointError(RuntimeError):
    """The checkpoint to resume from is missing or unreadable."""


def tag_for(step: int) -> str:
    return f"global_step{step}"


def read_latest(checkpoint_dir: Path) -> str | None:
    """The tag `latest` names, or None when there is no complete checkpoint yet."""
    marker = checkpoint_dir / LATEST
    if not marker.is_file():
        return None
    tag = marker.read_text(encoding="utf-8").strip()
    if not tag:
        raise CheckpointError(f"checkpoint marker {marker} is empty")
    return tag


def _write_latest(checkpoint_dir: Path, tag: str) -> None:
    temporary = checkpoint_dir / f".{LATEST}.tmp"
    temporary.write_text(tag + "\n", encoding="utf-8")
    with temporary.open("rb") as handle:
        os.fsync(handle.fileno())
    os.replace(temporary, checkpoint_dir / LATEST)


def save(engine: Any, checkpoint_dir: Path, step: int) -> Path:
    """Save `step` on every rank, then mark it latest; returns the checkpoint's folder."""
    tag = tag_for(step)
    engine.save_checkpoint(str(checkpoint_dir), tag=tag, client_state={"step": step}, save_latest=False)
    dist.barrier()
    if dist.get_rank() == 0:
        _write_latest(checkpoint_dir, tag)
    dist.barrier()
    return checkpoint_dir / tag


def _problem_with(files: list[Path]) -> str | None:
    for path in files:
        try:
            torch.load(path, map_location="cpu", mmap=True, weights_only=False)
        except Exception as error:
            return f"{path} is unreadable ({type(error).__name__}: {str(error).splitlines()[0][:120]})"
    return None


def _agreed_problem(checkpoint_dir: Path, tag: str) -> str | None:
    """Every rank checks a share of the tag's files; all ranks return the first problem any rank found."""
    folder = checkpoint_dir / tag
    if not folder.is_dir():
        local: str | None = (
            f"{checkpoint_dir / LATEST} names {tag} but {folder} does not exist on rank {dist.get_rank()}"
        )
    else:
        files = sorted(folder.glob("*.pt"))
        local = f"{folder} holds no checkpoint files" if not files else None
        rank, world = dist.get_rank(), dist.get_world_size()
        local = local or _problem_with(files[rank::world])
    found: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(found, local)
    return next((problem for problem in found if problem), None)


def agreed_latest(checkpoint_dir: Path) -> str | None:
    """The tag rank 0 finds in `latest`, on every rank (None everywhere when rank 0 finds no checkpoint).

    Each rank reading the marker itself could let one rank start from scratch while the others wait in the
    collective check of the files: a hang until the process-group timeout.
    """
    answer: list[tuple[str | None, str | None]] = [(None, None)]
    if dist.get_rank() == 0:
        try:
            answer[0] = (read_latest(checkpoint_dir), None)
        except CheckpointError as error:
            answer[0] = (None, str(error))
    dist.broadcast_object_list(answer, src=0)
    tag, problem = answer[0]
    if problem:
        raise CheckpointError(problem)
    return tag


def resume(engine: Any, checkpoint_dir: Path) -> int:
    """Load the latest checkpoint into `engine`; returns the step it holds (0 when there is none)."""
    tag = agreed_latest(checkpoint_dir)
    if tag is None:
        return 0
    problem = _agreed_problem(checkpoint_dir, tag)
    if problem:
        raise CheckpointError(f"corrupted checkpoint: {problem}")
    try:
        _, client_state = engine.load_checkpoint(str(checkpoint_dir), tag=tag)
    except Exception as error:
        raise CheckpointError(f"cannot load checkpoint {checkpoint_dir / tag}: {error}") from error
    if not client_state or "step" not in client_state:
        raise CheckpointError(f"checkpoint {checkpoint_dir / tag} does not record its step")
    return int(client_state["step"])
