"""Optimizer and learning-rate schedule from the DeepSpeed config, gradients the optimizer sees, their norm.

The optimizer is whatever the DeepSpeed config's `optimizer` section names. Adam, AdamW and SGD are built here
as plain torch optimizers (so no DeepSpeed op is JIT-compiled on CPU); any other type, and any optimizer under
ZeRO offload, is left to DeepSpeed.
Without an `optimizer` section the trainer uses AdamW. Without a `scheduler` section the learning rate warms
up linearly for `warmupSteps` and then follows a cosine down to `minLrRatio` x lr at the last step, whoever
built the optimizer. Once per step, before DeepSpeed's data-parallel reduction, the gradients of replicated
tensor-parallel parameters are averaged over the TP group so that their copies cannot drift apart.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from deepspeed.runtime.constants import PIPE_REPLICATED
from deepspeed.runtime.pipe.schedule import ReduceGrads
from deepspeed.runtime.utils import clip_grad_norm_

from paralleljob_contract.jobfile import TrainingConfig
from paralleljob_trainer import tensor_parallel

DEFAULT_OPTIMIZER = {
    "type": "AdamW",
    "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1},
}
_TORCH_OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "sgd": torch.optim.SGD,
}
# DeepSpeed-only keys of its Adam section that torch's optimizers do not take.
_DEEPSPEED_ONLY_KEYS = {"torch_adam", "adam_w_mode", "fused"}


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """LR multiplier for optimizer step `step` (0-based): linear warmup to 1, cosine decay to `min_ratio`."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step + 1 - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def split_optimizer(ds_config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(config for deepspeed.initialize, optimizer section to build here or None to leave to DeepSpeed)."""
    config = copy.deepcopy(dict(ds_config))
    section = config.pop("optimizer", None) or copy.deepcopy(DEFAULT_OPTIMIZER)
    # ZeRO optimizer offload needs DeepSpeed's own CPU Adam, which DeepSpeed builds from the section.
    offloaded = bool((config.get("zero_optimization") or {}).get("offload_optimizer"))
    if offloaded or str(section.get("type", "")).lower() not in _TORCH_OPTIMIZERS:
        config["optimizer"] = section
        return config, None
    return config, section


def build_optimizer(section: Mapping[str, Any], parameters: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """A torch optimizer from a DeepSpeed `optimizer` section of type Adam, AdamW or SGD."""
    kind = str(section["type"]).lower()
    params = {k: v for k, v in dict(section.get("params") or {}).items() if k not in _DEEPSPEED_ONLY_KEYS}
    if "betas" in params:
        params["betas"] = tuple(params["betas"])
    return _TORCH_OPTIMIZERS[kind](list(parameters), **params)


def build_scheduler(
    optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int, min_ratio: float
) -> torch.optim.lr_scheduler.LambdaLR:
    """The default warmup-then-cosine schedule as a LambdaLR (stepped once per optimizer step)."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine(step, warmup_steps, total_steps, min_ratio)
    )


def default_schedule(
    ds_config: Mapping[str, Any], training: TrainingConfig
) -> Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LambdaLR] | None:
    """The `lr_scheduler` callable for deepspeed.initialize: warmup and cosine, unless the config has its own.

    A callable rather than a scheduler object, because DeepSpeed calls it with the optimizer it ends up with:
    also the one it builds itself (offload, other types), which does not exist before initialize.
    """
    if "scheduler" in ds_config:
        return None

    def build(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        return build_scheduler(optimizer, training.warmup_steps, training.steps, training.min_lr_ratio)

    return build


def average_replicated_gradients_each_step(engine: Any, tp: tensor_parallel.TensorParallel) -> None:
    """Average the gradients of TP-replicated parameters over the TP group, once per step, before DP reduction.

    The pipeline engine runs the ReduceGrads instruction once per step, after the last micro-batch's backward;
    this wraps it. The gradient the optimizer will use is the fp32 accumulation buffer under the bf16
    optimizer (`_hp_grad`, as DeepSpeed's own tied-weight reduction uses), else the parameter's gradient.
    Cost: one all-reduce of the replicated parameters (norms, biases, positions; embeddings and head at TP 1)
    per step; under sequence parallelism the norms' (and biases') partial gradients are summed instead.
    """
    if tp.size == 1:
        return
    replicated = [p for p in engine.module.parameters() if tensor_parallel.is_replicated(p)]
    reduce_grads = type(engine)._INSTRUCTION_MAP[ReduceGrads]

    def average_then_reduce(self: Any, *args: Any, **kwargs: Any) -> Any:
        # Under sequence parallelism a norm's gradient on each rank covers its sequence shard: sum those.
        for partial in (False, True):
            same = [p for p in replicated if tensor_parallel.is_sequence_partial(p) == partial]
            gradients = [g for p in same if (g := _gradient_to_reduce(self, p)) is not None]
            tensor_parallel.average_over_tensor_parallel(gradients, tp, mean=not partial)
        return reduce_grads(self, *args, **kwargs)

    engine._INSTRUCTION_MAP = {**type(engine)._INSTRUCTION_MAP, ReduceGrads: average_then_reduce}


def _gradient_to_reduce(engine: Any, parameter: torch.Tensor) -> torch.Tensor | None:
    if engine.using_bf16_optimizer:
        return getattr(parameter, "_hp_grad", None)
    if hasattr(engine.optimizer, "get_gradient_for_reduction"):  # ZeRO-1 may accumulate in `grad_accum`
        return engine.optimizer.get_gradient_for_reduction(parameter)
    return parameter.grad


def record_fp32_grad_norm(engine: Any) -> None:
    """Make the fp32 path keep the gradient norm, for `engine.get_global_grad_norm()` and the metrics.

    In fp32 DeepSpeed clips with `clip_grad_norm_` and throws the norm away (the bf16/fp16 optimizer wrappers
    keep it). This replaces the engine's clip method by the same call that also stores the result; with
    clipping off, the norm is measured the same way (max_norm infinite) just before the optimizer step.
    Under ZeRO the optimizer is DeepSpeed's ZeRO optimizer, which computes and keeps its own norm.
    """
    if engine.bfloat16_enabled() or engine.fp16_enabled() or engine.zero_optimization_stage() > 0:
        return

    def measure(max_norm: float) -> None:
        # DeepSpeed's fp32 clip_grad_norm_ ignores `ds_pipe_replicated`, so the last stage's copy of a tied
        # weight would count twice: measure without the copies, then scale every gradient, copies included.
        parameters = [p for p in engine.module.parameters() if p.grad is not None]
        counted = [p for p in parameters if not getattr(p, PIPE_REPLICATED, False)]
        norm = float(clip_grad_norm_(parameters=counted, max_norm=math.inf, mpu=engine.mpu))
        engine._global_grad_norm = norm
        coefficient = max_norm / (norm + 1e-6)
        if coefficient < 1:
            for parameter in parameters:
                parameter.grad.mul_(coefficient)

    if engine.gradient_clipping() > 0:
        engine.clip_fp32_gradients = lambda: measure(engine.gradient_clipping())
    else:
        engine.optimizer.register_step_pre_hook(lambda *_: measure(math.inf))
