"""Validation of ParallelJob documents: the single source of truth for what a valid job is.

`validate_document()` parses, runs every rule, derives DP and the batch, and returns all problems at once.
The CLI (`paralleljob validate`), the operator (condition Valid=False) and the local runner all call it.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from paralleljob.api import batch as batch_math
from paralleljob.api import parsing, rules
from paralleljob.api import types as t
from paralleljob.api.problems import Problem, error, errors_of, warning
from paralleljob_contract.jobfile import default_warmup_steps
from paralleljob_contract.model import default_ffn_hidden_size

# Above this share of idle pipeline time per step, the layout wastes GPUs (1F1B bubble (p-1)/(m+p-1)).
BUBBLE_WARNING_FRACTION = 0.25


@dataclasses.dataclass(frozen=True)
class ResolvedJob:
    """A valid job with every derived number filled in."""

    job: t.ParallelJob
    batch: batch_math.Batch

    @property
    def name(self) -> str:
        return self.job.metadata.name

    @property
    def namespace(self) -> str:
        return self.job.metadata.namespace or "default"

    @property
    def spec(self) -> t.ParallelJobSpec:
        return self.job.spec

    @property
    def budget(self) -> int | None:
        """GPUs to choose a layout for (spec.parallelism.gpus, or nodes x gpusPerNode); None when sized."""
        return rules.budget_gpus(self.spec)

    @property
    def needs_layout(self) -> bool:
        """A job that gives a GPU budget: its sizes and batch split are placeholders until a layout search
        (`planning.layout_search`) chooses them; only the train batch and the model are final."""
        return self.budget is not None

    @property
    def pipeline(self) -> int:
        return self.spec.parallelism.pipeline or 1

    @property
    def tensor(self) -> int:
        return self.spec.parallelism.tensor or 1

    @property
    def data(self) -> int:
        return self.batch.data_parallel

    @property
    def world_size(self) -> int:
        return self.budget or self.pipeline * self.tensor * self.data

    @property
    def layout(self) -> str:
        """pipeline x tensor x data, as in `kubectl get pj`."""
        return f"{self.pipeline}x{self.tensor}x{self.data}"

    @property
    def ffn_hidden_size(self) -> int:
        model = self.spec.model
        return model.ffn_hidden_size or default_ffn_hidden_size(model.hidden_size, model.architecture)

    @property
    def warmup_steps(self) -> int:
        training = self.spec.training
        return default_warmup_steps(training.steps) if training.warmup_steps is None else training.warmup_steps

    def deepspeed_config(self) -> dict[str, Any]:
        """The DeepSpeed config the trainer passes to deepspeed.initialize."""
        config = copy.deepcopy(self.spec.deepspeed or {})
        config[batch_math.TBS] = self.batch.train_batch_size
        config[batch_math.MICRO] = self.batch.micro_batch
        config[batch_math.GAS] = self.batch.gradient_accumulation_steps
        precision = self.spec.model.precision
        for key in ("bf16", "fp16"):
            section = dict(config.get(key) or {})
            section["enabled"] = precision == key
            config[key] = section
        return config

    def resolved_spec(self) -> dict[str, Any]:
        """The spec in YAML form with defaults filled (the contract's, for the computed ones: ffnHiddenSize,
        warmupSteps) and parallelism.data derived."""
        spec = t.spec_to_dict(self.spec)
        spec["parallelism"]["data"] = self.data
        spec["model"]["ffnHiddenSize"] = self.ffn_hidden_size
        spec["training"]["warmupSteps"] = self.warmup_steps
        return dict(spec)


@dataclasses.dataclass(frozen=True)
class ValidationResult:
    """What validation found in one document."""

    problems: list[Problem]
    resolved: ResolvedJob | None = None
    name: str | None = None
    # The batch arithmetic, reported even when other rules fail (so a rejected job still learns its DP).
    batch: batch_math.Batch | None = None

    @property
    def ok(self) -> bool:
        return self.resolved is not None and not errors_of(self.problems)


def validate_document(doc: Any, *, cluster: bool = True) -> ValidationResult:
    """Parse and validate one ParallelJob document, reporting every problem.

    `cluster=False` validates for `paralleljob run`, which skips the rules about pods (a checkpoint volume)."""
    name = _name_of(doc)
    job, problems = parsing.parse_job(doc)
    if job is None:
        return ValidationResult(problems, None, name)
    return validate_job(job, problems, cluster=cluster)


def validate_job(
    job: t.ParallelJob, problems: list[Problem] | None = None, *, cluster: bool = True
) -> ValidationResult:
    """Run every rule on a parsed job (after `problems` the parser found): what `validate_document` does once
    the YAML is parsed. The layout search calls it on each candidate, so a candidate is valid exactly when
    the same job written as YAML would be. `cluster=False` (paralleljob run) leaves out the cluster-only rules."""
    name = job.metadata.name
    problems = list(problems or []) + rules.check_rules(job.spec, cluster=cluster) + claim_problems(job.spec)
    if rules.budget_gpus(job.spec) is not None:
        return _budget_job(job, problems)
    resolved_batch, batch_problems = batch_math.resolve_batch(job.spec.deepspeed, job.spec.parallelism.data)
    problems += [p for p in batch_problems if p.path not in {q.path for q in problems}]
    if resolved_batch is not None:
        problems += advisories(job.spec, resolved_batch, cluster=cluster)
    if errors_of(problems) or resolved_batch is None:
        return ValidationResult(problems, None, name, resolved_batch)
    return ValidationResult(problems, ResolvedJob(job, resolved_batch), name, resolved_batch)


def _budget_job(job: t.ParallelJob, problems: list[Problem]) -> ValidationResult:
    """A job with a GPU budget: valid when its rules pass; its layout and batch split are chosen later, so the
    batch here holds only the train batch (micro-batch 1, no DP) as a placeholder."""
    train_batch = (job.spec.deepspeed or {}).get(batch_math.TBS)
    if errors_of(problems) or not isinstance(train_batch, int) or train_batch < 1:
        return ValidationResult(problems, None, job.metadata.name)
    placeholder = batch_math.Batch(train_batch, 1, train_batch, 1)
    return ValidationResult(problems, ResolvedJob(job, placeholder), job.metadata.name)


def claim_problems(spec: t.ParallelJobSpec) -> list[Problem]:
    """spec.template.resourceClaims name one source each, and spec.network.imexChannelClaim names one of them.

    Checked here rather than in CEL: a rule iterating an unbounded list has an estimated cost a real API
    server may refuse when the CRD is created.
    """
    found: list[Problem] = []
    claims = spec.template.resource_claims or []
    for index, claim in enumerate(claims):
        if (claim.resource_claim_template_name is None) == (claim.resource_claim_name is None):
            found.append(
                error(
                    f"spec.template.resourceClaims[{index}]",
                    "set exactly one of resourceClaimTemplateName (a claim per pod) and resourceClaimName "
                    "(one claim shared by every pod).",
                )
            )
    wanted = spec.network.imex_channel_claim
    names = [claim.name for claim in claims]
    if wanted is not None and wanted not in names:
        listed = ", ".join(names) if names else "none"
        found.append(
            error(
                "spec.network.imexChannelClaim",
                f"{wanted!r} is not the name of a spec.template.resourceClaims entry ({listed}); add the "
                "ComputeDomain's channel claim there under this name.",
            )
        )
    return found


def _name_of(doc: Any) -> str | None:
    if isinstance(doc, dict) and isinstance(doc.get("metadata"), dict):
        name = doc["metadata"].get("name")
        return name if isinstance(name, str) else None
    return None


def bubble_fraction(pipeline: int, micro_batches: int) -> float:
    """Idle share of a 1F1B pipeline step: (p-1)/(m+p-1)."""
    return (pipeline - 1) / (micro_batches + pipeline - 1)


def advisories(spec: t.ParallelJobSpec, batch: batch_math.Batch, *, cluster: bool = True) -> list[Problem]:
    """Warnings: valid, but probably not what the user wants."""
    found: list[Problem] = []
    layers, pp = spec.model.layers, spec.parallelism.pipeline or 1  # sized jobs always have it
    if layers >= pp and layers % pp:
        found.append(
            warning(
                "spec.model.layers",
                f"{layers} layers over {pp} stages are uneven ({layers // pp}-{layers // pp + 1} per stage), so the "
                f"slowest stage paces the pipeline; use a multiple of {pp}.",
            )
        )
    bubble = bubble_fraction(pp, batch.gradient_accumulation_steps)
    if bubble > BUBBLE_WARNING_FRACTION:
        wanted = 3 * (pp - 1) + 1  # smallest m with (p-1)/(m+p-1) <= 25%
        found.append(
            warning(
                "spec.deepspeed.gradient_accumulation_steps",
                f"{batch.gradient_accumulation_steps} micro-batches through {pp} stages leave the pipeline idle "
                f"{bubble:.0%} of each step; use at least {wanted} micro-batches or fewer stages.",
            )
        )
    if spec.checkpoint is None and spec.failure_policy.backoff_limit > 0:
        found.append(
            warning(
                "spec.checkpoint",
                "is not set, so a gang restart starts training from step 0; set spec.checkpoint with a shared volume.",
            )
        )
    elif spec.checkpoint is not None and spec.checkpoint.interval_steps > spec.training.steps:
        found.append(
            warning(
                "spec.checkpoint.intervalSteps",
                f"{spec.checkpoint.interval_steps} is more than the {spec.training.steps} training steps, so only "
                "the final checkpoint is written; lower it so restarts lose less work.",
            )
        )
    if cluster and spec.checkpoint is not None and "emptyDir" in (spec.checkpoint.volume or {}):
        found.append(
            warning(
                "spec.checkpoint.volume",
                "is an emptyDir, deleted with its pod: a gang restart (new pods) starts from step 0, and with "
                "more than one pod no pod holds a whole checkpoint; use a ReadWriteMany persistentVolumeClaim.",
            )
        )
    return found
