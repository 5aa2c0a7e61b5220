"""What a checkpoint is: `manifest.json` in its folder, written last, naming the job, the run and every file.

The manifest records the job (namespace, name, uid), what the weights and optimizer state depend on (model
shape and precision, pipeline and tensor sizes, ZeRO stage, train batch), where training stands (step,
samples seen and the data position: the seed and the next step, since a batch is a pure function of both,
see `paralleljob_trainer.data`), the data-parallel size it was saved with, and each file with its size and
sha256. A folder without a manifest is not a checkpoint (an interrupted save).

`incompatibility` compares a manifest with the job about to resume and names the first difference in one line.
A change of layout is compatible (DP: `paralleljob_trainer.checkpoint`; PP or TP: `paralleljob_trainer.recut`,
which merges the saved slices and cuts them again) except at ZeRO 0 in bf16/fp16, where DeepSpeed's
mixed-precision optimizer keeps its fp32 state flat and sharded over DP, in a form nothing can re-cut.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from paralleljob_contract.jobfile import JobConfig
from paralleljob_contract.layout import Layout
from paralleljob_trainer.storage import WrittenFile, fsync_path

MANIFEST = "manifest.json"
FORMAT = 1
_FIELDS_ADDED_LATER: dict[str, Any] = {
    "architecture": "gpt",
    "kv_heads": None,
    "rope_theta": 10000.0,
    "tie_embeddings": False,
    "norm_eps": 1e-5,
    "rope_scaling": None,
    "activation": "gelu",
}


def _model_shape(job: JobConfig) -> dict[str, Any]:
    return {
        key: value for key, value in dataclasses.asdict(job.model).items() if key != "activation_checkpoint_interval"
    }


def _layout(layout: Layout) -> dict[str, int]:
    return {"pipeline": layout.pipeline, "tensor": layout.tensor, "data": layout.data}


def build(job: JobConfig, step: int, root: Path, files: Sequence[WrittenFile]) -> dict[str, Any]:
    """The manifest of `job`'s checkpoint at `step`, whose files (absolute paths) lie under `root`."""
    return {
        "format": FORMAT,
        "job": {"namespace": job.namespace, "name": job.name, "uid": job.uid},
        "model": _model_shape(job),
        "layout": _layout(job.plan.layout),
        "zeroStage": job.zero_stage,
        "trainBatchSize": job.train_batch_size,
        "step": step,
        "samples": step * job.train_batch_size,
        "data": {"source": job.training.data.source, "seed": job.training.seed, "nextStep": step + 1},
        "files": {
            os.path.relpath(item.path, root): {"bytes": item.size, "sha256": item.sha256}
            for item in sorted(files, key=lambda written: written.path)
        },
    }


def write(folder: Path, manifest: Mapping[str, Any]) -> None:
    """Write the manifest durably (the last file of a checkpoint, before its folder is renamed into place)."""
    path = folder / MANIFEST
    with path.open("w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=1, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    fsync_path(folder)


def read(folder: Path) -> dict[str, Any] | None:
    """The manifest in `folder`, or None when there is none or it is unreadable (an incomplete checkpoint)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and isinstance(manifest.get("files"), dict) else None


def layout_name(layout: Mapping[str, int]) -> str:
    return f"PP{layout['pipeline']}xTP{layout['tensor']}xDP{layout['data']}"


def incompatibility(manifest: Mapping[str, Any], job: JobConfig, folder: Path, *, foreign_ok: bool) -> str | None:
    """Why `job` cannot resume from the checkpoint in `folder`, in one line; None when it can.

    `foreign_ok` (spec.checkpoint.resumeFrom) accepts another job's checkpoint; without it a checkpoint of
    another namespace/name is foreign. A job recreated under the same name (a new uid) resumes its folder.
    """
    saved_job = manifest.get("job") or {}
    if not foreign_ok and (saved_job.get("namespace"), saved_job.get("name")) != (job.namespace, job.name):
        return (
            f"checkpoint {folder} belongs to job {saved_job.get('namespace')}/{saved_job.get('name')}, not "
            f"{job.namespace}/{job.name}; give this job its own folder or name it in spec.checkpoint.resumeFrom"
        )
    if manifest.get("format") != FORMAT:
        return f"checkpoint {folder} has manifest format {manifest.get('format')}, this trainer reads {FORMAT}"
    # Checkpoints saved before the architecture fields existed hold a GPT with their defaults.
    saved_model, model = {**_FIELDS_ADDED_LATER, **(manifest.get("model") or {})}, _model_shape(job)
    changed = [key for key in model if saved_model.get(key) != model[key]]
    if changed:
        differences = ", ".join(f"{key} {saved_model.get(key)} -> {model[key]}" for key in changed)
        return f"checkpoint {folder} is of another model ({differences}); spec.model must match the checkpoint's"
    saved_layout, layout = manifest.get("layout") or {}, _layout(job.plan.layout)
    if saved_layout != layout and not job.zero_stage and job.model.precision != "fp32":
        # DeepSpeed's bf16/fp16 optimizer at ZeRO 0 shards its fp32 state over DP, with no elastic form to re-cut.
        return (
            f"checkpoint {folder} was saved at {layout_name(saved_layout)} with {job.model.precision} and ZeRO 0, "
            f"whose optimizer state only that layout can read and this job is {layout_name(layout)}; resume with "
            "the saved layout, or train with zero_optimization.stage 1 to change the layout later"
        )
    if manifest.get("zeroStage") != job.zero_stage:
        return (
            f"checkpoint {folder} holds ZeRO stage {manifest.get('zeroStage')} optimizer state and this job "
            f"uses stage {job.zero_stage}; keep zero_optimization.stage {manifest.get('zeroStage')}"
        )
    if manifest.get("trainBatchSize") != job.train_batch_size:
        return (
            f"checkpoint {folder} was trained with train_batch_size {manifest.get('trainBatchSize')} and this "
            f"job uses {job.train_batch_size}; keep the train batch (change micro batch or gradient "
            "accumulation with DP instead)"
        )
    return None
