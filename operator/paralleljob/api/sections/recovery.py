"""The rules of spec.failurePolicy's recovery from lost nodes: hot spares (`spareNodes`) and the data-parallel
shrink (`allowDataShrink`, `minData`). The fields are declared with the rest of `FailurePolicy` in `api.types`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from paralleljob.api.problems import Problem, error
from paralleljob.api.rule import Rule

if TYPE_CHECKING:
    from paralleljob.api import types as t

_FP = "self.failurePolicy"


def min_data_of(spec: t.ParallelJobSpec) -> int:
    """The smallest DP a shrink may reach: spec.failurePolicy.minData, else 1."""
    return spec.failure_policy.min_data or 1


def _min_data_within_data(spec: t.ParallelJobSpec) -> Problem | None:
    floor, data = spec.failure_policy.min_data, spec.parallelism.data
    if floor is None or data is None or floor <= data:
        return None
    return error(
        "spec.failurePolicy.minData",
        f"{floor} is more than parallelism.data {data}, so the job could never run at its own size; set minData "
        f"to at most {data}.",
    )


def _min_data_needs_shrink(spec: t.ParallelJobSpec) -> Problem | None:
    policy = spec.failure_policy
    if policy.min_data is None or policy.allow_data_shrink:
        return None
    return error(
        "spec.failurePolicy.minData",
        f"{policy.min_data} is a floor for allowDataShrink, which is off; set allowDataShrink: true, or remove minData.",
    )


RULES: tuple[Rule, ...] = (
    Rule(
        "min-data-within-data",
        ".failurePolicy.minData",
        f"!has({_FP}) || !has({_FP}.minData) || !has(self.parallelism.data) || {_FP}.minData <= self.parallelism.data",
        "failurePolicy.minData must be at most parallelism.data",
        _min_data_within_data,
    ),
    Rule(
        "min-data-needs-shrink",
        ".failurePolicy.minData",
        f"!has({_FP}) || !has({_FP}.minData) || (has({_FP}.allowDataShrink) && {_FP}.allowDataShrink)",
        "failurePolicy.minData is the floor of allowDataShrink; set allowDataShrink: true, or remove minData",
        _min_data_needs_shrink,
    ),
)
