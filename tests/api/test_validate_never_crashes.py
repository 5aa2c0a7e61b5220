"""Property: validation never raises, whatever the document, and always explains a rejection."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paralleljob.api import validate_document
from tests.api.jobs import job

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=True),
    st.text(max_size=8),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
sizes = st.one_of(st.integers(min_value=-2, max_value=64), scalars)

PATHS = [
    "spec.parallelism.pipeline",
    "spec.parallelism.tensor",
    "spec.parallelism.data",
    "spec.gpusPerNode",
    "spec.model.layers",
    "spec.model.hiddenSize",
    "spec.model.attentionHeads",
    "spec.model.vocabSize",
    "spec.model.ffnHiddenSize",
    "spec.model.precision",
    "spec.deepspeed.train_batch_size",
    "spec.deepspeed.train_micro_batch_size_per_gpu",
    "spec.deepspeed.gradient_accumulation_steps",
    "spec.deepspeed.zero_optimization.stage",
    "spec.deepspeed.zero_optimization",
    "spec.deepspeed",
    "spec.training.data",
    "spec.training.steps",
    "spec.checkpoint",
    "spec.topology",
    "spec.network.ncclEnv",
    "spec.template.tolerations",
    "spec",
    "metadata",
    "metadata.name",
    "kind",
]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(PATHS), st.one_of(sizes, json_values), max_size=6))
def test_random_edits_never_raise_and_rejections_always_say_why(edits) -> None:
    doc = job()
    for dotted, value in sorted(edits.items()):
        node = doc
        *parents, last = dotted.split(".")
        for key in parents:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        node[last] = value
    result = validate_document(doc)
    if not result.ok:
        assert any(p.is_error for p in result.problems)
        assert all(p.path and p.message for p in result.problems)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_arbitrary_documents_never_raise(doc) -> None:
    result = validate_document(doc)
    assert not result.ok
