"""Each validation rule of issue 2, with a valid and an invalid case, checked by path and wording."""

from __future__ import annotations

import pytest

from paralleljob.api import validate_document
from tests.api.jobs import DELETE, job

# (id, edits that make the base job invalid, expected path, a phrase of the fix)
INVALID = [
    ("sizes-positive", {"spec.parallelism.pipeline": 0}, "spec.parallelism.pipeline", "at least 1"),
    (
        "tensor-divides-node",
        {"spec.parallelism.tensor": 3, "spec.model.attentionHeads": 12, "spec.model.hiddenSize": 768},
        "spec.parallelism.tensor",
        "divisor of 8",
    ),
    (
        "heads-divisible-by-tensor",
        {"spec.model.attentionHeads": 6, "spec.model.hiddenSize": 516},
        "spec.model.attentionHeads",
        "multiple of 4",
    ),
    ("hidden-divisible-by-heads", {"spec.model.hiddenSize": 500}, "spec.model.hiddenSize", "multiple of 8"),
    ("layers-at-least-stages", {"spec.model.layers": 1}, "spec.model.layers", "at least 2 layers"),
    (
        "batch-product",
        {"spec.deepspeed.train_batch_size": 30},
        "spec.deepspeed.train_batch_size",
        "set train_batch_size to 32",
    ),
    (
        "dp-underivable",
        {"spec.parallelism.data": DELETE, "spec.deepspeed.train_batch_size": 100},
        "spec.parallelism.data",
        "multiple of 16",
    ),
    (
        "dp-missing-numbers",
        {"spec.parallelism.data": DELETE},
        "spec.parallelism.data",
        "set it, or set train_batch_size",
    ),
    (
        "zero2-with-pipeline",
        {"spec.deepspeed.zero_optimization.stage": 2},
        "spec.deepspeed.zero_optimization.stage",
        "use stage 1, or pipeline 1",
    ),
    (
        "offload-needs-zero",
        {"spec.deepspeed.zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}},
        "spec.deepspeed.zero_optimization.offload_optimizer",
        "stage to 1",
    ),
    ("unknown-field", {"spec.parallelisms": {"pipeline": 1}}, "spec.parallelisms", "did you mean parallelism"),
    ("name-dns-label", {"metadata.name": "GPT_Small"}, "metadata.name", "DNS-1123"),
    ("name-too-long", {"metadata.name": "a" * 57}, "metadata.name", "at most 56"),
    ("steps-positive", {"spec.training.steps": 0}, "spec.training.steps", "at least 1"),
    ("sequence-positive", {"spec.model.sequenceLength": -5}, "spec.model.sequenceLength", "at least 1"),
    (
        "micro-batch-positive",
        {"spec.deepspeed.train_micro_batch_size_per_gpu": 0},
        "spec.deepspeed.train_micro_batch_size_per_gpu",
        "at least 1",
    ),
    ("gpus-per-node-positive", {"spec.gpusPerNode": 0}, "spec.gpusPerNode", "at least 1"),
    (
        "gpus-per-node-above-world",
        {"spec.parallelism": {"pipeline": 1, "tensor": 4, "data": 1}, "spec.deepspeed.train_batch_size": 16},
        "spec.gpusPerNode",
        "divisor of 4 such as 4",
    ),
    (
        "gpus-per-node-divides-derived-world",
        {
            "spec.parallelism": {"pipeline": 3, "tensor": 2},
            "spec.model.layers": 9,
            "spec.deepspeed.train_batch_size": 16,
        },
        "spec.gpusPerNode",
        "pipeline 3 x tensor 2 x data 1",
    ),
    (
        "text-needs-path",
        {"spec.training.data": {"source": "text"}},
        "spec.training.data.path",
        "required for source text",
    ),
    (
        "text-needs-byte-vocab",
        {"spec.training.data": {"source": "text", "path": "/d"}, "spec.model.vocabSize": 100},
        "spec.model.vocabSize",
        "at least 256",
    ),
    (
        "precision-contradiction",
        {"spec.deepspeed.fp16": {"enabled": True}},
        "spec.deepspeed.fp16.enabled",
        "precision is bf16",
    ),
    ("enum", {"spec.network.fabric": "myrinet"}, "spec.network.fabric", "one of auto, infiniband"),
    (
        "tensor-in-clique-without-imex",
        {
            "spec.parallelism.tensor": 16,
            "spec.model.attentionHeads": 16,
            "spec.topology.nvlinkDomainLabel": "nvidia.com/gpu.clique",
        },
        "spec.parallelism.tensor",
        "spec.network.imexChannelClaim",
    ),
    ("verify-enum", {"spec.network.verify": "maybe"}, "spec.network.verify", "one of fail, warn, off"),
    ("preflight-enum", {"spec.network.preflight": "warn"}, "spec.network.preflight", "one of off, report, fail"),
    (
        "imex-claim-unknown",
        {"spec.network.imexChannelClaim": "imex"},
        "spec.network.imexChannelClaim",
        "add the ComputeDomain's channel claim",
    ),
    (
        "claim-without-source",
        {"spec.template.resourceClaims": [{"name": "imex"}]},
        "spec.template.resourceClaims[0]",
        "exactly one of resourceClaimTemplateName",
    ),
    (
        "min-data-above-data",
        {"spec.failurePolicy": {"allowDataShrink": True, "minData": 3}},
        "spec.failurePolicy.minData",
        "set minData to at most 2",
    ),
    (
        "min-data-without-shrink",
        {"spec.failurePolicy": {"minData": 1}},
        "spec.failurePolicy.minData",
        "set allowDataShrink: true, or remove minData",
    ),
    ("negative-spares", {"spec.failurePolicy": {"spareNodes": -1}}, "spec.failurePolicy.spareNodes", ">= 0"),
    ("wrong-type", {"spec.model.layers": "eight"}, "spec.model.layers", "must be an integer"),
    ("required", {"spec.model.vocabSize": DELETE}, "spec.model.vocabSize", "is required"),
]

# (id, edits that keep the base job valid while touching the same rule)
VALID = [
    ("sizes-positive", {"spec.parallelism.pipeline": 1}),
    ("tensor-divides-node", {"spec.parallelism.tensor": 8}),
    (
        "tensor-in-clique",
        {
            "spec.parallelism.tensor": 16,
            "spec.model.attentionHeads": 16,
            "spec.topology.nvlinkDomainLabel": "nvidia.com/gpu.clique",
            "spec.network.imexChannelClaim": "imex",
            "spec.template.resourceClaims": [{"name": "imex", "resourceClaimTemplateName": "cd-channel"}],
        },
    ),
    ("heads-divisible-by-tensor", {"spec.model.attentionHeads": 16}),
    ("layers-at-least-stages", {"spec.model.layers": 2}),
    ("batch-product", {"spec.deepspeed.train_batch_size": 32}),
    ("dp-derived", {"spec.parallelism.data": DELETE, "spec.deepspeed.train_batch_size": 64}),
    ("spares-and-shrink", {"spec.failurePolicy": {"spareNodes": 2, "allowDataShrink": True, "minData": 2}}),
    ("zero2-without-pipeline", {"spec.parallelism.pipeline": 1, "spec.deepspeed.zero_optimization.stage": 2}),
    ("offload-with-zero1", {"spec.deepspeed.zero_optimization.offload_optimizer": {"device": "cpu"}}),
    ("text-with-path", {"spec.training.data": {"source": "text", "path": "/data/corpus"}}),
    ("precision-agrees", {"spec.deepspeed.bf16": {"enabled": True}}),
    (
        "imex-claim-named",
        {
            "spec.template.resourceClaims": [{"name": "imex", "resourceClaimTemplateName": "cd-channel"}],
            "spec.network.imexChannelClaim": "imex",
        },
    ),
]


def error_paths(doc: dict) -> dict[str, str]:
    result = validate_document(doc)
    return {p.path: p.message for p in result.problems if p.is_error}


def test_the_base_job_is_valid() -> None:
    result = validate_document(job())
    assert result.ok, [p.render() for p in result.problems]


@pytest.mark.parametrize(("edits", "path", "phrase"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_each_rule_rejects_its_invalid_case_naming_the_field_and_the_fix(edits, path, phrase) -> None:
    errors = error_paths(job(**{k.replace(".", "__"): v for k, v in edits.items()}))
    assert path in errors, errors
    assert phrase in errors[path]


@pytest.mark.parametrize("edits", [c[1] for c in VALID], ids=[c[0] for c in VALID])
def test_each_rule_accepts_its_valid_case(edits) -> None:
    result = validate_document(job(**{k.replace(".", "__"): v for k, v in edits.items()}))
    assert result.ok, [p.render() for p in result.problems]


def test_all_problems_in_a_job_are_reported_not_only_the_first() -> None:
    errors = error_paths(
        job(spec__model__layers=1, spec__deepspeed__zero_optimization__stage=3, spec__model__hiddenSize=500)
    )
    assert {"spec.model.layers", "spec.deepspeed.zero_optimization.stage", "spec.model.hiddenSize"} <= set(errors)


def test_a_derived_data_parallel_size_comes_from_the_batch_arithmetic() -> None:
    result = validate_document(
        job(
            spec__parallelism__data=DELETE,
            spec__deepspeed__train_batch_size=1024,
            spec__deepspeed__train_micro_batch_size_per_gpu=8,
        )
    )
    assert result.resolved is not None
    assert result.resolved.data == 1024 // (8 * 8)
    assert result.resolved.world_size == 2 * 4 * 16


@pytest.mark.parametrize(
    ("edits", "phrase"),
    [
        ({"spec__model__layers": 7}, "uneven"),
        ({"spec__deepspeed__gradient_accumulation_steps": 1}, "idle 50%"),
        ({"spec__checkpoint": DELETE}, "starts training from step 0"),
        ({"spec__checkpoint__intervalSteps": 500}, "only the final checkpoint"),
        ({"spec__checkpoint__volume": {"emptyDir": {}}}, "emptyDir, deleted with its pod"),
    ],
    ids=["uneven-stages", "pipeline-bubble", "no-checkpoint", "interval-beyond-steps", "checkpoint-on-empty-dir"],
)
def test_warnings_are_reported_separately_and_do_not_reject_the_job(edits, phrase) -> None:
    result = validate_document(job(**edits))
    assert result.ok
    warnings = [p.message for p in result.problems if not p.is_error]
    assert any(phrase in w for w in warnings), warnings


def test_a_small_bubble_does_not_warn() -> None:
    result = validate_document(job(spec__deepspeed__gradient_accumulation_steps=4))
    assert not [p for p in result.problems if "idle" in p.message]


def test_the_deepspeed_config_passed_to_the_trainer_is_complete_and_keeps_unknown_keys() -> None:
    doc = job(spec__deepspeed__steps_per_print=7, spec__model__precision="fp32")
    resolved = validate_document(doc).resolved
    assert resolved is not None
    config = resolved.deepspeed_config()
    assert config["train_batch_size"] == 2 * 8 * 2
    assert config["steps_per_print"] == 7
    assert config["bf16"] == {"enabled": False} and config["fp16"] == {"enabled": False}


def test_a_huge_gpus_per_node_gets_its_message_at_once() -> None:
    # The suggested divisor used to be searched over every integer up to gpusPerNode: validation never ended.
    result = validate_document(job(spec__gpusPerNode=10**30 + 1, spec__parallelism__tensor=4))
    assert any("does not divide gpusPerNode" in problem.render() for problem in result.problems)


def test_a_checkpoint_without_a_volume_is_an_error_on_a_cluster_that_names_the_fix() -> None:
    result = validate_document(job(spec__checkpoint__volume=DELETE))
    errors = {p.path: p.message for p in result.problems if p.is_error}
    assert not result.ok
    assert "is required on a cluster" in errors["spec.checkpoint.volume"]
    assert (
        "persistentVolumeClaim" in errors["spec.checkpoint.volume"] and "emptyDir" in errors["spec.checkpoint.volume"]
    )


def test_paralleljob_run_keeps_its_local_checkpoint_folder_without_a_volume_or_a_warning() -> None:
    result = validate_document(job(spec__checkpoint__volume=DELETE), cluster=False)
    assert result.ok and not [p for p in result.problems if p.path == "spec.checkpoint.volume"]
    on_empty_dir = validate_document(job(spec__checkpoint__volume={"emptyDir": {}}), cluster=False)
    assert not [p for p in on_empty_dir.problems if p.path == "spec.checkpoint.volume"]


@pytest.mark.parametrize(
    ("resume_from", "valid"),
    [("gpt-base", True), ("team/models/gpt-base", True), ("/abs/path", False), ("../other", False), ("a/../b", False)],
    ids=["job-name", "folder-on-the-volume", "absolute", "parent", "parent-inside"],
)
def test_resume_from_names_a_job_or_a_folder_inside_the_volume(resume_from, valid) -> None:
    result = validate_document(job(spec__checkpoint__resumeFrom=resume_from))
    assert result.ok == valid, [p.render() for p in result.problems]
    if not valid:
        errors = {p.path: p.message for p in result.problems if p.is_error}
        assert "a folder relative to the volume's root with no leading /" in errors["spec.checkpoint.resumeFrom"]
