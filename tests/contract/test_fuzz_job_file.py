"""Fuzzed job files: the contract's reader (every rank, and users' own scripts, call it before any process group
forms) answers any `job.json` with a JobConfig or a one-line ContractError, never another exception, which would
be a traceback in every rank's log instead of the one message the pod's termination reports.

Each example starts from a valid job file and changes, removes or retypes a few of its fields at any depth.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from paralleljob_contract import jobfile
from paralleljob_contract.errors import ContractError
from paralleljob_contract.layout import Layout

VALID = jobfile.job_document(
    name="fuzz",
    namespace="default",
    spec={
        "parallelism": {"pipeline": 2, "tensor": 2, "data": 2, "sequenceParallel": False},
        "model": {"layers": 4, "hiddenSize": 64, "attentionHeads": 4, "sequenceLength": 32, "vocabSize": 256},
        "training": {"steps": 10, "data": {"source": "synthetic"}},
        "checkpoint": {"intervalSteps": 5, "keep": 2},
    },
    deepspeed={"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4},
    plan=jobfile.make_plan(Layout(2, 2, 2), 4),
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


def _paths(node: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every key path of the document, at any depth."""
    if not isinstance(node, dict):
        return []
    return [p for key, value in node.items() for p in [(*prefix, key), *_paths(value, (*prefix, key))]]


PATHS = _paths(VALID)


def edit(document: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    """Set (or, for the DELETE marker, remove) one field; an edit under a field already retyped is dropped."""
    node: Any = document
    for key in path[:-1]:
        if not isinstance(node, dict) or not isinstance(node.get(key), dict):
            return
        node = node[key]
    if value is _DELETE:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value


_DELETE = object()


def test_the_valid_job_file_parses() -> None:
    assert jobfile.parse_job_config(VALID).plan.layout == Layout(2, 2, 2)


# What the fuzzing found, each a traceback before: a null batch size, a section that is not an object, an axis
# order of non-names, a learning-rate floor that is not a number.
@example([(("deepspeed", "train_batch_size"), None)])
@example([(("deepspeed", "train_micro_batch_size_per_gpu"), "2")])
@example([(("spec", "training", "data"), True)])
@example([(("metadata",), True)])
@example([(("spec", "checkpoint"), [1])])
@example([(("plan", "axisOrder"), [None, None])])
@example([(("spec", "training", "minLrRatio"), "low")])
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(PATHS), st.one_of(st.just(_DELETE), json_values)), min_size=1, max_size=4))
def test_any_job_file_parses_or_is_refused_in_one_line(edits: list[tuple[tuple[str, ...], Any]]) -> None:
    document = copy.deepcopy(VALID)
    for path, value in edits:
        edit(document, path, value)
    try:
        jobfile.parse_job_config(document)
    except ContractError as error:
        message = str(error)
        assert message.strip() and "\n" not in message, message
