"""spec.checkpoint: where checkpoints go and what a job resumes from, and the rule that saving needs a volume."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

from paralleljob.api.fields import RawObject, api_field
from paralleljob.api.problems import Problem, error
from paralleljob.api.rule import Rule
from paralleljob.api.sections.template import VOLUME_SOURCE_PROPERTIES

if TYPE_CHECKING:
    from paralleljob.api import types as t

ExportFormat = Literal["hf"]

# spec.checkpoint.resumeFrom: a job name, or a folder relative to the volume's root; no segment starts with ".".
RESUME_FROM_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*$"


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """Where and how often the trainer saves DeepSpeed checkpoints; restarts resume from the newest complete one."""

    volume: RawObject | None = api_field(
        "The Kubernetes volume source mounted at path in every pod: required on a cluster, typically "
        "{persistentVolumeClaim: {claimName: ...}} on a ReadWriteMany volume shared by all nodes. Any number "
        "of jobs may share one claim. An explicit {emptyDir: {}} is accepted with a warning: it is deleted "
        "with its pod, so a gang restart starts from step 0. `paralleljob run` ignores it (DIR/checkpoints).",
        default=None,
        schema_properties=VOLUME_SOURCE_PROPERTIES,
    )
    path: str = api_field(
        "Where the volume is mounted in every pod. The job keeps its checkpoints in its own folder on it, "
        "<path>/<namespace>/<name> (global_stepN folders, each with a manifest.json, and `latest`), and "
        "rank 0's metrics.jsonl in <path>/<namespace>/<name>/metrics.",
        default="/checkpoints",
    )
    interval_steps: int = api_field(
        "Save a checkpoint every this many steps, and always at the last step. A gang restart loses at most "
        "this many steps.",
        default=100,
        minimum=1,
    )
    keep: int = api_field(
        "Complete checkpoints kept, newest first; older ones are deleted once a newer one is complete, so the "
        "one a restart resumes from is never deleted before its successor exists.",
        default=3,
        minimum=1,
    )
    resume_from: str | None = api_field(
        "Start from another job's checkpoint (fine-tuning, branching a sweep) while this job has none of its "
        "own: a job name in this namespace (its folder on the same volume), or a folder relative to the "
        "volume's root that holds global_stepN checkpoints. Mounted read-only and never written. The model, "
        "pipeline and tensor sizes, ZeRO stage and train batch must match the checkpoint's; DP may differ. "
        "Training continues from the checkpoint's step.",
        default=None,
        pattern=RESUME_FROM_PATTERN,
        pattern_fix="write a job name, or a folder relative to the volume's root with no leading / and no .. segment",
        max_length=253,
    )
    export: ExportFormat | None = api_field(
        "After the last step's checkpoint, also write the model in this format to <path>/<namespace>/<name>/"
        "export: hf is a Hugging Face folder (config.json, model.safetensors, generation_config.json) that "
        "transformers loads as LlamaForCausalLM or GPT2LMHeadModel. `paralleljob export` does the same for any "
        "checkpoint.",
        default=None,
    )


def _checkpoint_volume(spec: t.ParallelJobSpec) -> Problem | None:
    if spec.checkpoint is None or spec.checkpoint.volume:
        return None
    return error(
        "spec.checkpoint.volume",
        "is required on a cluster: without it the checkpoints are written inside the container and lost with "
        "it; set {persistentVolumeClaim: {claimName: ...}} on a ReadWriteMany claim, or {emptyDir: {}} for "
        "checkpoints that need not survive a restart.",
    )


RULES: tuple[Rule, ...] = (
    Rule(
        "checkpoint-needs-volume",
        ".checkpoint.volume",
        "!has(self.checkpoint) || has(self.checkpoint.volume)",
        "checkpoint.volume is required: set {persistentVolumeClaim: {claimName: ...}} on a ReadWriteMany claim, "
        "or {emptyDir: {}} for checkpoints that need not survive a restart",
        _checkpoint_volume,
        cluster_only=True,
    ),
)
