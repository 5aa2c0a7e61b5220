"""Batch arithmetic: train_batch_size = micro_batch * gradient_accumulation_steps * DP.

DeepSpeed accepts any two of the three batch numbers and completes the third; this module does the same
ahead of time (so a bad combination is an error at `kubectl apply`, not an assertion an hour into a run)
and also derives DP when `spec.parallelism.data` is absent.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from paralleljob.api.problems import Problem, error

TBS = "train_batch_size"
MICRO = "train_micro_batch_size_per_gpu"
GAS = "gradient_accumulation_steps"


@dataclasses.dataclass(frozen=True)
class Batch:
    """The resolved batch: every number known and consistent."""

    train_batch_size: int
    micro_batch: int
    gradient_accumulation_steps: int
    data_parallel: int


def _int_or_none(config: dict[str, Any], key: str) -> int | None:
    value = config.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def resolve_batch(deepspeed: dict[str, Any] | None, data_parallel: int | None) -> tuple[Batch | None, list[Problem]]:
    """Complete the batch numbers from spec.deepspeed and DP, or say what is inconsistent."""
    config = deepspeed or {}
    tbs, micro, gas = (_int_or_none(config, key) for key in (TBS, MICRO, GAS))
    if data_parallel is None:
        return _derive_data_parallel(tbs, micro, gas)
    return _complete(tbs, micro, gas, data_parallel)


def _derive_data_parallel(tbs: int | None, micro: int | None, gas: int | None) -> tuple[Batch | None, list[Problem]]:
    if tbs is None or micro is None or gas is None:
        return None, [
            error(
                "spec.parallelism.data",
                "is absent and cannot be derived; set it, or set train_batch_size, "
                "train_micro_batch_size_per_gpu and gradient_accumulation_steps in spec.deepspeed.",
            )
        ]
    if tbs % (micro * gas):
        return None, [
            error(
                "spec.parallelism.data",
                f"cannot be derived: train_batch_size {tbs} is not a multiple of micro-batch {micro} x "
                f"gradient_accumulation_steps {gas} = {micro * gas}; make train_batch_size a multiple of "
                f"{micro * gas} or set spec.parallelism.data.",
            )
        ]
    return Batch(tbs, micro, gas, tbs // (micro * gas)), []


def _complete(tbs: int | None, micro: int | None, gas: int | None, dp: int) -> tuple[Batch | None, list[Problem]]:
    path = f"spec.deepspeed.{TBS}"
    if tbs is not None and micro is not None and gas is not None:
        if tbs != micro * gas * dp:
            return None, [
                error(
                    path,
                    f"{tbs} != micro-batch {micro} x gradient_accumulation_steps {gas} x DP {dp} = "
                    f"{micro * gas * dp}; set train_batch_size to {micro * gas * dp} or change one factor.",
                )
            ]
        return Batch(tbs, micro, gas, dp), []
    if tbs is None:
        micro, gas = micro or 1, gas or 1
        return Batch(micro * gas * dp, micro, gas, dp), []
    if micro is None and gas is None:
        gas = 1  # DeepSpeed's rule: only the global batch given means no accumulation.
    known_name, known = (MICRO, micro) if micro is not None else (GAS, gas)
    assert known is not None
    divisor = known * dp
    if tbs % divisor:
        return None, [
            error(
                path,
                f"{tbs} is not divisible by {known_name} {known} x DP {dp} = {divisor}; "
                f"set train_batch_size to a multiple of {divisor}.",
            )
        ]
    if micro is not None:
        return Batch(tbs, micro, tbs // divisor, dp), []
    return Batch(tbs, tbs // divisor, known, dp), []
