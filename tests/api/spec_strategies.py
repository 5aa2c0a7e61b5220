"""Hypothesis strategies for ParallelJob documents a user could write: well-typed values chosen near the edges
of every cross-field rule (sizes that do or do not divide, budgets, ZeRO stages, GQA, data sources, the failure
policy), so that generated jobs land on both sides of each rule instead of failing the schema at once.

Used by the in-process fuzz tests (tests/api/test_fuzz_specs.py) and by the same fuzzing through the real
kube-apiserver (tests/upstream/test_fuzz_server.py).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tests.api.jobs import job

ABSENT = object()


def _maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.just(ABSENT), strategy)


def _put(section: dict[str, Any], key: str, value: Any) -> None:
    if value is not ABSENT:
        section[key] = value


@st.composite
def parallelism(draw: st.DrawFn) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if draw(st.booleans()):
        _put(out, "gpus", draw(_maybe(st.sampled_from([4, 8, 12, 16, 32]))))
        _put(out, "nodes", draw(_maybe(st.sampled_from([1, 2, 3, 4]))))
    _put(out, "pipeline", draw(_maybe(st.integers(min_value=1, max_value=4))))
    _put(out, "tensor", draw(_maybe(st.sampled_from([1, 2, 3, 4, 8, 12, 16]))))
    _put(out, "data", draw(_maybe(st.integers(min_value=1, max_value=4))))
    _put(out, "sequenceParallel", draw(_maybe(st.booleans())))
    return out


@st.composite
def model(draw: st.DrawFn) -> dict[str, Any]:
    out: dict[str, Any] = {
        "layers": draw(st.integers(min_value=1, max_value=12)),
        "hiddenSize": draw(st.sampled_from([256, 500, 512, 516, 520, 768, 1024])),
        "attentionHeads": draw(st.sampled_from([4, 6, 8, 12, 16])),
        "sequenceLength": draw(st.sampled_from([128, 254, 256])),
        "vocabSize": draw(st.sampled_from([100, 256, 50257, 100000])),
    }
    _put(out, "architecture", draw(_maybe(st.sampled_from(["gpt", "llama"]))))
    _put(out, "kvHeads", draw(_maybe(st.sampled_from([1, 2, 3, 4, 8]))))
    _put(out, "tieEmbeddings", draw(_maybe(st.booleans())))
    _put(out, "ffnHiddenSize", draw(_maybe(st.sampled_from([1024, 1026, 2048]))))
    _put(out, "precision", draw(_maybe(st.sampled_from(["bf16", "fp16", "fp32"]))))
    return out


@st.composite
def deepspeed(draw: st.DrawFn) -> dict[str, Any]:
    out: dict[str, Any] = {"train_micro_batch_size_per_gpu": draw(st.integers(min_value=1, max_value=4))}
    _put(out, "gradient_accumulation_steps", draw(_maybe(st.integers(min_value=1, max_value=8))))
    _put(out, "train_batch_size", draw(_maybe(st.sampled_from([16, 30, 32, 64, 128]))))
    zero: dict[str, Any] = {}
    _put(zero, "stage", draw(_maybe(st.integers(min_value=0, max_value=3))))
    _put(zero, "offload_optimizer", draw(_maybe(st.sampled_from([{"device": "cpu"}, {"device": "none"}]))))
    if zero or draw(st.booleans()):
        out["zero_optimization"] = zero
    _put(out, "fp16", draw(_maybe(st.sampled_from([{"enabled": True}, {"enabled": False}]))))
    _put(out, "bf16", draw(_maybe(st.sampled_from([{"enabled": True}, {"enabled": False}]))))
    return out


DATA = [
    {"source": "synthetic"},
    {"source": "text"},
    {"source": "text", "path": "/d"},
    {"source": "tokens", "path": "/d.bin"},
    {"source": "tokens", "path": "/d", "tokenDtype": "uint32"},
]


@st.composite
def failure_policy(draw: st.DrawFn) -> dict[str, Any]:
    out: dict[str, Any] = {}
    _put(out, "spareNodes", draw(_maybe(st.integers(min_value=0, max_value=3))))
    _put(out, "allowDataShrink", draw(_maybe(st.booleans())))
    _put(out, "minData", draw(_maybe(st.integers(min_value=1, max_value=4))))
    _put(out, "backoffLimit", draw(_maybe(st.integers(min_value=0, max_value=5))))
    return out


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    """A whole ParallelJob document: the tests' base job with each section drawn anew or kept."""
    doc = job()
    spec = doc["spec"]
    spec["parallelism"] = draw(parallelism())
    spec["model"] = draw(model())
    spec["deepspeed"] = draw(deepspeed())
    gpus_per_node = draw(_maybe(st.sampled_from([1, 2, 4, 8])))
    if gpus_per_node is ABSENT:
        spec.pop("gpusPerNode", None)
    else:
        spec["gpusPerNode"] = gpus_per_node
    spec["training"] = {"steps": draw(st.integers(min_value=1, max_value=1000))}
    data = draw(_maybe(st.sampled_from(DATA)))
    if data is not ABSENT:
        spec["training"]["data"] = dict(data)
    policy = draw(failure_policy())
    if policy:
        spec["failurePolicy"] = policy
    if draw(st.booleans()):
        spec["topology"] = {"nvlinkDomainLabel": "nvidia.com/gpu.clique"}
    if draw(st.booleans()):
        spec.pop("checkpoint", None)
    return doc
