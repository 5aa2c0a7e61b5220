"""Checkpoints: a commit protocol for DeepSpeed's save, a verified choice on resume, retention, DP changes.

One job's folder (`PARALLELJOB_CHECKPOINT_DIR`) holds `global_stepN/` folders, each a complete checkpoint
with its `manifest.json` (`paralleljob_trainer.manifest`), and `latest` naming the newest.

Save (every rank): DeepSpeed writes into `.tmp-global_stepN/` through `storage.GuardedWrites` (each file
fsynced and checksummed; a failed write recorded, not raised). The ranks then gather what they wrote and
whether any write failed. Rank 0 removes the folder on a failure (every rank raises the same one-line
StorageError), else writes the manifest, fsyncs the folder, renames it to `global_stepN`, fsyncs the parent,
replaces `latest` atomically (write, fsync, rename, fsync the parent) and deletes all but the newest
`spec.checkpoint.keep` checkpoints. A kill at any point leaves the previous checkpoints intact and at most a
`.tmp-` folder that is never read and is removed by the next save.

Resume (every rank, before the engine is built): rank 0 lists the folder and broadcasts the checkpoints
newest first with their manifests, so every rank takes the same decision even when its own view of the
folder differs. The newest compatible checkpoint whose files verify on every rank (each rank checks a share
of the files' sizes and sha256, and its own view of the manifest) is taken; the ones skipped are named.
A checkpoint of another job or an incompatible one stops every rank with one line. With
`spec.checkpoint.resumeFrom`, a job whose own folder holds no checkpoint starts from that folder's, which it
only reads.

A change of DP resumes: ZeRO 0 keeps one optimizer state per (stage, TP rank), which any DP reads; ZeRO 1
state is saved in DeepSpeed's elastic form (`elastic_checkpoint`, set by the trainer), and loading merges the
saved DP shards and cuts them for this DP, the saved one included (DeepSpeed's engine refuses a different DP
itself, and its own elastic load asserts a step in the param groups, which torch's optimizers keep per
parameter), so this module hands the saved shards to the optimizer directly. A change of PP or TP is `paralleljob_trainer.recut`'s,
which reuses `load_zero_shards` for ZeRO 1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch.distributed as dist

from paralleljob_contract.jobfile import JobConfig
from paralleljob_trainer import manifest, storage
from paralleljob_trainer.storage import StorageError

LATEST = "latest"
STAGING_PREFIX = ".tmp-"
DAMAGED_PREFIX = ".damaged-"
_TAG = re.compile(r"global_step(\d+)")
# Keys of DeepSpeed's ZeRO 1/2 optimizer state_dict (deepspeed.checkpoint.constants).
OPTIMIZER_STATE_DICT = "optimizer_state_dict"
BASE_OPTIMIZER_STATE = "base_optimizer_state"
FP32_PARTITIONS = "single_partition_of_fp32_groups"
BASE_OPTIMIZER_STATE_STEP = "base_optimizer_state_step"


class CheckpointError(RuntimeError):
    """The checkpoint to resume from is missing, damaged, foreign or incompatible."""


@dataclasses.dataclass(frozen=True)
class Saved:
    """A committed checkpoint: its folder and the bytes of its files (every rank's)."""

    folder: Path
    size: int


@dataclasses.dataclass(frozen=True)
class Chosen:
    """The checkpoint a run resumes from, agreed by every rank."""

    root: Path
    tag: str
    manifest: dict[str, Any]
    skipped: tuple[str, ...]
    read_only: bool

    @property
    def step(self) -> int:
        return int(self.manifest["step"])

    @property
    def folder(self) -> Path:
        return self.root / self.tag


def tag_for(step: int) -> str:
    return f"global_step{step}"


def committed_tags(root: Path) -> list[str]:
    """`global_stepN` folders in `root`, newest first."""
    if not root.is_dir():
        return []
    found = [(int(match.group(1)), path.name) for path in root.iterdir() if (match := _TAG.fullmatch(path.name))]
    return [name for _, name in sorted(found, reverse=True) if (root / name).is_dir()]


def _broadcast(value: Any) -> Any:
    """Rank 0's `value`, on every rank."""
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _gathered(value: Any) -> list[Any]:
    found: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(found, value)
    return found


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


# -- save ----------------------------------------------------------------------------------------------------


def save(engine: Any, job: JobConfig, root: Path, step: int) -> Saved:
    """Save `step` on every rank and commit it (see the module docstring)."""
    tag = tag_for(step)
    staging = root / f"{STAGING_PREFIX}{tag}"
    stale = None
    if dist.get_rank() == 0:
        try:
            _remove(staging)  # left by an attempt killed mid-save
        except OSError as error:
            stale = storage.problem_with(error, root)
    if problem := _broadcast(stale):
        raise StorageError(problem)
    guard = storage.GuardedWrites(engine.checkpoint_engine, root)
    engine.checkpoint_engine = guard
    engine._copy_recovery_script = guard.guard(engine._copy_recovery_script)
    try:
        # The parameter names let a resume at another PP or TP find each tensor's optimizer state (`recut`).
        names = [name for name, _ in engine.module.named_parameters()]
        client_state = {"step": step, "param_names": names}
        engine.save_checkpoint(str(root), tag=staging.name, client_state=client_state, save_latest=False)
    finally:
        engine.checkpoint_engine = guard.inner
        del engine._copy_recovery_script
    outcomes = _gathered((guard.written, guard.failure))
    problem = None
    if dist.get_rank() == 0:
        problem = _commit(job, root, step, staging, outcomes)
    if problem := _broadcast(problem):
        raise StorageError(problem)
    if _first_rank_of_its_node() and staging.exists():
        # Only when the folder is not shared (an emptyDir per pod): rank 0 committed its own copy, not this one.
        with contextlib.suppress(OSError):
            _remove(staging)
    return Saved(root / tag, sum(written.size for files, _ in outcomes for written in files))


def _first_rank_of_its_node() -> bool:
    return dist.get_rank() != 0 and os.environ.get("LOCAL_RANK", "0") == "0"


def _commit(job: JobConfig, root: Path, step: int, staging: Path, outcomes: list[Any]) -> str | None:
    """Rank 0: the manifest, the rename and `latest`, then retention; the one-line problem or None."""
    failures = [failure for _, failure in outcomes if failure]
    try:
        if failures:
            raise _AlreadyReported(failures[0])
        files = [written for files, _ in outcomes for written in files]
        manifest.write(staging, manifest.build(job, step, staging, files))
        final = root / tag_for(step)
        if final.exists():
            _remove(final)  # an older save of this step that verified nowhere (resume sets those aside)
        os.rename(staging, final)
        storage.fsync_path(root)
        _write_latest(root, final.name)
    except (OSError, _AlreadyReported) as error:
        with contextlib.suppress(OSError):
            _remove(staging)
        reason = str(error) if isinstance(error, _AlreadyReported) else storage.problem_with(error, root)
        return f"{reason}; the partial checkpoint of step {step} was removed and earlier ones are intact"
    _apply_retention(root, job.checkpoint_keep)
    return None


class _AlreadyReported(Exception):
    """A rank's write failed; its one-line reason travels as the message."""


def _write_latest(root: Path, tag: str) -> None:
    temporary = root / f".{LATEST}.tmp"
    with temporary.open("w", encoding="utf-8") as handle:
        handle.write(tag + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, root / LATEST)
    storage.fsync_path(root)


def _apply_retention(root: Path, keep: int) -> None:
    """Delete all but the newest `keep` checkpoints, and what earlier saves and resumes set aside."""
    doomed = committed_tags(root)[keep:]
    doomed += [path.name for path in root.iterdir() if path.name.startswith((DAMAGED_PREFIX, STAGING_PREFIX))]
    for name in doomed:
        try:
            _remove(root / name)
        except OSError as error:
            print(f"paralleljob-trainer: cannot delete old checkpoint {root / name}: {error}", flush=True)


# -- resume --------------------------------------------------------------------------------------------------


def choose(job: JobConfig, root: Path | None, resume_from: Path | None) -> Chosen | None:
    """The checkpoint to resume from, agreed by every rank: the job's own newest verifying one, else (when the
    job's folder holds none) spec.checkpoint.resumeFrom's; None to start from step 0."""
    for folder, foreign_ok in ((root, False), (resume_from, True)):
        if folder is not None and (chosen := _choose_in(job, folder, foreign_ok)) is not None:
            if chosen.skipped and not chosen.read_only and dist.get_rank() == 0:
                _set_aside_skipped(chosen)
            return chosen
    if resume_from is not None:
        raise CheckpointError(f"spec.checkpoint.resumeFrom: {resume_from} holds no checkpoint (global_stepN)")
    return None


def _choose_in(job: JobConfig, folder: Path, foreign_ok: bool) -> Chosen | None:
    listing = None
    if dist.get_rank() == 0:
        listing = [(tag, manifest.read(folder / tag)) for tag in committed_tags(folder)]
    candidates = _broadcast(listing)
    skipped: list[str] = []
    for tag, saved in candidates:
        if saved is None:
            skipped.append(f"{tag} (no readable {manifest.MANIFEST}: an interrupted or foreign save)")
            continue
        if incompatible := manifest.incompatibility(saved, job, folder / tag, foreign_ok=foreign_ok):
            raise CheckpointError(incompatible)
        if problem := _agreed_problem(folder / tag, saved):
            skipped.append(f"{tag} ({problem})")
            continue
        return Chosen(folder, tag, saved, tuple(skipped), read_only=foreign_ok)
    if skipped:
        raise CheckpointError(f"no checkpoint in {folder} can be resumed from: {'; '.join(skipped)}")
    return None


def _agreed_problem(folder: Path, saved: dict[str, Any]) -> str | None:
    """Every rank checks its own view of the manifest and a share of the files; the first problem any found."""
    rank, world = dist.get_rank(), dist.get_world_size()
    local = None
    if manifest.read(folder) != saved:
        local = f"{folder / manifest.MANIFEST} differs or is missing on rank {rank}"
    else:
        names = sorted(saved["files"])
        local = next((p for name in names[rank::world] if (p := _file_problem(folder, name, saved))), None)
    return next((problem for problem in _gathered(local) if problem), None)


def _file_problem(folder: Path, name: str, saved: dict[str, Any]) -> str | None:
    expected, path = saved["files"][name], folder / name
    try:
        size = path.stat().st_size
        if size != expected["bytes"]:
            return f"{path} has {size} bytes, the manifest says {expected['bytes']}"
        if storage.sha256_of(path) != expected["sha256"]:
            return f"{path} does not match its checksum"
    except OSError as error:
        return f"{path} is unreadable ({error.strerror or error})"
    return None


def _set_aside_skipped(chosen: Chosen) -> None:
    """Rank 0: rename the skipped checkpoints (all newer than the chosen one) out of the way of the next saves
    and of retention; the next complete save deletes them."""
    for entry in chosen.skipped:
        tag = entry.split(" ", 1)[0]
        with contextlib.suppress(OSError):
            os.rename(chosen.root / tag, chosen.root / f"{DAMAGED_PREFIX}{tag}")
    with contextlib.suppress(OSError):
        storage.fsync_path(chosen.root)


def load(engine: Any, job: JobConfig, chosen: Chosen) -> int:
    """Load the agreed checkpoint into `engine`; returns its step."""
    try:
        if job.zero_stage:
            # Also at the same DP: DeepSpeed's own load of elastic ZeRO state asserts a step in the param groups,
            # which torch's optimizers keep per parameter (`load_zero_shards` supplies it).
            engine.load_checkpoint(str(chosen.root), tag=chosen.tag, load_optimizer_states=False)
            _load_saved_zero_shards(engine, chosen)
        else:
            engine.load_checkpoint(str(chosen.root), tag=chosen.tag)
    except Exception as error:
        first = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        raise CheckpointError(f"cannot load checkpoint {chosen.folder}: {first}") from error
    return chosen.step


def _load_saved_zero_shards(engine: Any, chosen: Chosen) -> None:
    """Every saved DP shard of this rank's (stage, TP rank), merged and cut for this DP by the optimizer."""
    names = engine._get_all_zero_checkpoint_names(str(chosen.root), chosen.tag, engine.bfloat16_enabled())
    shards = [engine.checkpoint_engine.load(name, map_location="cpu")[OPTIMIZER_STATE_DICT] for name in names]
    if isinstance(shards[0][BASE_OPTIMIZER_STATE], dict):
        raise CheckpointError(
            f"checkpoint {chosen.folder} holds ZeRO optimizer state for DP {len(shards)} only (not saved in elastic "
            f"form); resume it with data parallel {len(shards)}"
        )
    load_zero_shards(engine, shards)


def load_zero_shards(engine: Any, shards: list[dict[str, Any]]) -> None:
    """Elastic ZeRO shards of this rank's (stage, TP rank), merged and cut for this DP by the optimizer."""
    for shard in shards:
        # DeepSpeed records the step of the elastic state only when the optimizer keeps it in its param
        # groups (its own Adam); torch's optimizers keep it per parameter, in the state that is restored anyway.
        shard.setdefault(BASE_OPTIMIZER_STATE_STEP, _per_parameter_step(shard))
    # The optimizer reads the shard at this rank's DP index: a larger DP appends empty shards, which the merge
    # (a concatenation of the unpadded shards) ignores.
    data_parallel = dist.get_world_size(group=engine.optimizer.dp_process_group)
    shards += [_empty_shard(shards[0]) for _ in range(data_parallel - len(shards))]
    engine.optimizer.load_state_dict(
        state_dict_list=shards, load_optimizer_states=True, load_from_fp32_weights=engine.zero_load_from_fp32_weights()
    )
    learning_rate_from_scheduler(engine)


def learning_rate_from_scheduler(engine: Any) -> None:
    """The optimizer's learning rate as the restored schedule has it: the elastic state holds no param groups,
    so the optimizer would keep the rate of step 1 until the schedule next steps."""
    scheduler = getattr(engine, "lr_scheduler", None)
    if scheduler is not None and hasattr(scheduler, "get_last_lr"):
        for group, rate in zip(engine.optimizer.param_groups, scheduler.get_last_lr(), strict=True):
            group["lr"] = rate


def _per_parameter_step(shard: dict[str, Any]) -> Any:
    step = (shard[BASE_OPTIMIZER_STATE][0] or {}).get("step")
    return float(step) if step is not None else None


def _empty_shard(shard: dict[str, Any]) -> dict[str, Any]:
    """`shard` with every partitioned tensor (fp32 weights and per-element optimizer state) empty."""
    partitions = shard[FP32_PARTITIONS]
    empty = dict(shard)
    empty[FP32_PARTITIONS] = [partition.new_empty(0) for partition in partitions]
    empty[BASE_OPTIMIZER_STATE] = [
        {
            key: value.new_empty(0) if hasattr(value, "shape") and value.shape == partitions[group].shape else value
            for key, value in state.items()
        }
        for group, state in enumerate(shard[BASE_OPTIMIZER_STATE])
    ]
    return empty
