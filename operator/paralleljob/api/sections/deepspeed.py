"""spec.deepspeed: the DeepSpeed config keys the API reads (declared in the CRD so that CEL can see them),
and the rules on them: ZeRO with pipeline parallelism, optimizer offload, the batch product, the precision.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from paralleljob.api.problems import Problem, error
from paralleljob.api.rule import Rule

if TYPE_CHECKING:
    from paralleljob.api import types as t

# DeepSpeed config keys the validator reads; declared in the CRD so that CEL rules can see them
# (fields preserved as unknown are invisible to CEL).
DEEPSPEED_KNOWN_PROPERTIES: dict[str, Any] = {
    "train_batch_size": {"type": "integer", "minimum": 1, "description": "Global batch in samples."},
    "train_micro_batch_size_per_gpu": {
        "type": "integer",
        "minimum": 1,
        "description": "Samples per micro-batch on one GPU.",
    },
    "gradient_accumulation_steps": {
        "type": "integer",
        "minimum": 1,
        "description": "Micro-batches per optimizer step; with pipeline parallelism, the micro-batches in "
        "flight through the pipeline.",
    },
    "gradient_clipping": {"type": "number", "minimum": 0, "description": "Clip the global gradient norm."},
    "zero_optimization": {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
        "description": "ZeRO settings. With pipeline parallelism only stage 0 or 1 is allowed.",
        "properties": {
            "stage": {"type": "integer", "minimum": 0, "maximum": 3, "description": "ZeRO stage."},
            "offload_optimizer": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
                "description": "Optimizer state offload; needs ZeRO stage >= 1.",
                "properties": {"device": {"type": "string", "description": "cpu, nvme or none."}},
            },
        },
    },
    "bf16": {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
        "description": "bf16 settings; enabled must agree with spec.model.precision.",
        "properties": {"enabled": {"type": "boolean", "description": "Whether bf16 is on."}},
    },
    "fp16": {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
        "description": "fp16 settings; enabled must agree with spec.model.precision.",
        "properties": {"enabled": {"type": "boolean", "description": "Whether fp16 is on."}},
    },
}


HAS_DEEPSPEED = "has(self.deepspeed)"


_ZERO = f"{HAS_DEEPSPEED} && has(self.deepspeed.zero_optimization)"


_STAGE = f"{_ZERO} && has(self.deepspeed.zero_optimization.stage)"


def zero_stage(spec: t.ParallelJobSpec) -> int:
    """The ZeRO stage of spec.deepspeed (0 when absent or malformed)."""
    zero = (spec.deepspeed or {}).get("zero_optimization") or {}
    stage = zero.get("stage", 0) if isinstance(zero, dict) else 0
    return stage if isinstance(stage, int) else 0


def ds_int(spec: t.ParallelJobSpec, key: str) -> int | None:
    value = (spec.deepspeed or {}).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def ds_enabled(spec: t.ParallelJobSpec, key: str) -> bool | None:
    section = (spec.deepspeed or {}).get(key)
    if isinstance(section, dict) and isinstance(section.get("enabled"), bool):
        return bool(section["enabled"])
    return None


def _zero_with_pipeline(spec: t.ParallelJobSpec) -> Problem | None:
    stage, pp = zero_stage(spec), spec.parallelism.pipeline
    if stage < 2 or pp is None or pp <= 1:
        return None
    return error(
        "spec.deepspeed.zero_optimization.stage",
        f"ZeRO stage {stage} with pipeline {pp}: DeepSpeed's pipeline engine asserts \"ZeRO-2 and ZeRO-3 are "
        'incompatible with pipeline parallelism"; use stage 1, or pipeline 1.',
    )


def _offload_needs_zero(spec: t.ParallelJobSpec) -> Problem | None:
    zero = (spec.deepspeed or {}).get("zero_optimization")
    offload = zero.get("offload_optimizer") if isinstance(zero, dict) else None
    if not isinstance(offload, dict) or offload.get("device", "cpu") == "none" or zero_stage(spec) >= 1:
        return None
    return error(
        "spec.deepspeed.zero_optimization.offload_optimizer",
        "optimizer offload needs ZeRO stage 1 or more; set zero_optimization.stage to 1, or remove the offload.",
    )


def _batch_product(spec: t.ParallelJobSpec) -> Problem | None:
    tbs, micro = ds_int(spec, "train_batch_size"), ds_int(spec, "train_micro_batch_size_per_gpu")
    gas, dp = ds_int(spec, "gradient_accumulation_steps"), spec.parallelism.data
    if None in (tbs, micro, gas, dp):
        return None
    assert tbs is not None and micro is not None and gas is not None and dp is not None
    if tbs == micro * gas * dp:
        return None
    return error(
        "spec.deepspeed.train_batch_size",
        f"{tbs} != micro-batch {micro} x gradient_accumulation_steps {gas} x DP {dp} = {micro * gas * dp}; "
        f"set train_batch_size to {micro * gas * dp} or change one factor.",
    )


def _precision_matches(spec: t.ParallelJobSpec) -> Problem | None:
    precision = spec.model.precision
    for key in ("bf16", "fp16"):
        if ds_enabled(spec, key) and precision != key:
            return error(
                f"spec.deepspeed.{key}.enabled",
                f"is true but spec.model.precision is {precision}; remove it (precision sets it) or set "
                f"precision to {key}.",
            )
    return None


RULES: tuple[Rule, ...] = (
    Rule(
        "zero-with-pipeline",
        ".deepspeed.zero_optimization.stage",
        f"!({_STAGE}) || self.deepspeed.zero_optimization.stage < 2 || !has(self.parallelism.pipeline) "
        "|| self.parallelism.pipeline == 1",
        "ZeRO stage 2 and 3 are incompatible with pipeline parallelism; use stage 1, or pipeline 1",
        _zero_with_pipeline,
    ),
    Rule(
        "offload-needs-zero",
        ".deepspeed.zero_optimization.offload_optimizer",
        f"!({_ZERO} && has(self.deepspeed.zero_optimization.offload_optimizer)) "
        "|| (has(self.deepspeed.zero_optimization.offload_optimizer.device) "
        "&& self.deepspeed.zero_optimization.offload_optimizer.device == 'none') "
        f"|| ({_STAGE} && self.deepspeed.zero_optimization.stage >= 1)",
        "optimizer offload needs ZeRO stage 1 or more",
        _offload_needs_zero,
    ),
    Rule(
        "batch-product",
        ".deepspeed.train_batch_size",
        f"!({HAS_DEEPSPEED} && has(self.deepspeed.train_batch_size) && has(self.deepspeed.train_micro_batch_size_per_gpu) "
        "&& has(self.deepspeed.gradient_accumulation_steps) && has(self.parallelism.data)) "
        "|| self.deepspeed.train_batch_size == self.deepspeed.train_micro_batch_size_per_gpu "
        "* self.deepspeed.gradient_accumulation_steps * self.parallelism.data",
        "train_batch_size must equal train_micro_batch_size_per_gpu * gradient_accumulation_steps * parallelism.data",
        _batch_product,
    ),
    Rule(
        "precision-matches-deepspeed",
        ".model.precision",
        "!has(self.deepspeed) || ("
        "(!has(self.deepspeed.bf16) || !has(self.deepspeed.bf16.enabled) || !self.deepspeed.bf16.enabled "
        "|| (has(self.model.precision) && self.model.precision == 'bf16')) && "
        "(!has(self.deepspeed.fp16) || !has(self.deepspeed.fp16.enabled) || !self.deepspeed.fp16.enabled "
        "|| (has(self.model.precision) && self.model.precision == 'fp16')))",
        "deepspeed bf16/fp16 must agree with model.precision",
        _precision_matches,
    ),
)
