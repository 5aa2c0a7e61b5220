"""The checkpoint folder as storage: start-up checks, durable writes, and one line for a full or read-only disk.

`check_folder` runs on every rank before any process group exists: the folder must be creatable and
writable, fsync must work there, and the free space must hold one more checkpoint of the estimated size with
a margin. Found later, the same problems cost the training since the last save, on every restart.

`GuardedWrites` takes DeepSpeed's checkpoint engine's place on a rank for one save. It writes each file,
fsyncs it and records its size and sha256; a write that fails (ENOSPC, EROFS, ...) is recorded instead of
raised and the partial file is removed, so the rank still reaches DeepSpeed's closing barrier and every rank
can learn of the failure together (a raise on one rank would leave the others waiting in that barrier).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from paralleljob_contract.jobfile import JobConfig
from paralleljob_contract.model import stage_parameters

# Free space wanted at start-up, as a multiple of one checkpoint's estimated size.
FREE_SPACE_MARGIN = 1.2
_PROBE_BYTES = 4096
# Bytes of optimizer state per parameter, by optimizer type (lower case): Adam-like keep two fp32 moments.
_OPTIMIZER_STATE_BYTES = {"sgd": 4, "adagrad": 4, "adam": 8, "adamw": 8, "lamb": 8, "lion": 4}
_DEFAULT_OPTIMIZER_STATE_BYTES = 8
_PRECISION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


class StorageError(RuntimeError):
    """The checkpoint folder cannot take a checkpoint; the message says which folder, why, and what to do."""


@dataclasses.dataclass(frozen=True)
class WrittenFile:
    """One checkpoint file as its writer left it on disk."""

    path: str
    size: int
    sha256: str


def sha256_of(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def fsync_path(path: Path) -> None:
    """fsync a file or a folder (a folder's fsync makes the names in it durable: renames, new files)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def saved_parameters(job: JobConfig) -> int:
    """Parameters a checkpoint of `job` holds: every TP rank saves its slices and its own copy of what TP
    replicates (LayerNorms, some biases, the embeddings and the LM head); the pipeline split adds nothing."""
    tensor = job.plan.layout.tensor
    return int(tensor * stage_parameters(job.model.shape, 1, tensor, "only"))


def estimated_checkpoint_bytes(job: JobConfig) -> int:
    """Bytes of one checkpoint of `job`: weights in the model's precision, fp32 master weights when the model
    is not fp32, and the optimizer's state (DP does not change it: ZeRO shards it, ZeRO 0 stores one copy)."""
    parameters = saved_parameters(job)
    precision = job.model.precision
    optimizer = str((job.deepspeed.get("optimizer") or {}).get("type", "")).lower()
    per_parameter = _PRECISION_BYTES.get(precision, 4) + (0 if precision == "fp32" else 4)
    per_parameter += _OPTIMIZER_STATE_BYTES.get(optimizer, _DEFAULT_OPTIMIZER_STATE_BYTES)
    return parameters * per_parameter


def problem_with(error: OSError, folder: Path) -> str:
    """One line for a failed checkpoint write: what the disk said and what to do about it."""
    where = error.filename or folder
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            f"checkpoint folder {folder} is full ({os.strerror(error.errno)} writing {where}); free space on the "
            "volume or lower spec.checkpoint.keep"
        )
    if error.errno == errno.EROFS:
        return f"checkpoint folder {folder} is on a read-only file system; mount the checkpoint volume read-write"
    if error.errno in (errno.EACCES, errno.EPERM):
        return (
            f"checkpoint folder {folder} is not writable by this process (uid {os.getuid()}) writing {where}; "
            "make the volume's root writable by that uid"
        )
    return f"checkpoint folder {folder}: {error.strerror or error} writing {where}"


def check_folder(folder: Path, needed_bytes: int, rank: int) -> None:
    """Create `folder` if needed and prove it can take a checkpoint of `needed_bytes`; StorageError if not."""
    probe = folder / f".probe-rank{rank}-{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with probe.open("wb") as handle:
            handle.write(b"\0" * _PROBE_BYTES)
            handle.flush()
            os.fsync(handle.fileno())
        fsync_path(folder)
        probe.unlink()
        free = shutil.disk_usage(folder).free
    except OSError as error:
        with contextlib.suppress(OSError):
            probe.unlink()
        raise StorageError(problem_with(error, folder)) from error
    wanted = int(needed_bytes * FREE_SPACE_MARGIN)
    if free < wanted:
        raise StorageError(
            f"checkpoint folder {folder} has {_human(free)} free but one checkpoint needs about "
            f"{_human(needed_bytes)} (+{FREE_SPACE_MARGIN - 1:.0%} margin); free space on the volume or use a "
            "larger one"
        )


def check_readable(folder: Path) -> None:
    """spec.checkpoint.resumeFrom's folder must exist; it is only ever read."""
    if not folder.is_dir():
        raise StorageError(f"spec.checkpoint.resumeFrom: {folder} does not exist on this node")


def _human(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


class GuardedWrites:
    """DeepSpeed's checkpoint engine for one save on this rank: durable, checksummed, never raising OSError."""

    def __init__(self, inner: Any, folder: Path) -> None:
        self.inner = inner
        self.folder = folder
        self.written: list[WrittenFile] = []
        self.failure: str | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        if self.failure is None:
            try:
                os.makedirs(path, exist_ok=exist_ok)
            except OSError as error:
                self.failure = problem_with(error, self.folder)

    def save(self, state_dict: Any, path: str) -> None:
        if self.failure is not None:
            return
        target = Path(path)
        try:
            with target.open("wb") as handle:
                torch.save(state_dict, handle, _use_new_zipfile_serialization=self._zipfile())
                handle.flush()
                os.fsync(handle.fileno())
            self.written.append(WrittenFile(str(target), target.stat().st_size, sha256_of(target)))
        except OSError as error:
            self.failure = problem_with(error, self.folder)
            with contextlib.suppress(OSError):
                target.unlink()

    def guard(self, write: Any) -> Any:
        """`write` (another of DeepSpeed's own file writes) with its OSError recorded instead of raised."""

        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return write(*args, **kwargs)
            except OSError as error:
                self.failure = self.failure or problem_with(error, self.folder)
                return None

        return guarded

    def _zipfile(self) -> bool:
        return bool(getattr(self.inner, "zipfile_serialization", False))
