"""job.json: version, identity, resolved spec, DeepSpeed config and the plan's layout, which the trainer reads."""

from __future__ import annotations

import dataclasses

import pytest

from paralleljob.manifests.trainer_config import build_trainer_config
from paralleljob_contract import jobfile
from paralleljob_contract.errors import ContractError


def test_job_file_carries_spec_deepspeed_and_plan(resolved, plan):
    config = build_trainer_config(resolved, plan)
    assert config["apiVersion"] == "paralleljob.io/v1alpha1"
    assert config["kind"] == "ParallelJob"
    assert config["metadata"] == {"name": "gpt", "namespace": "research"}
    assert config["spec"]["parallelism"] == {"pipeline": 2, "tensor": 4, "data": 2}
    assert config["deepspeed"]["train_batch_size"] == 2 * 8 * 2
    assert config["version"] == 1
    # The layout, not a per-node list: a pod's node rank and node are in its environment.
    assert config["plan"] == {
        "layout": {"pipeline": 2, "tensor": 4, "data": 2},
        "axisOrder": ["pipe", "data", "model"],
        "worldSize": 16,
        "nodes": 4,
        "ranksPerNode": 4,
    }


def test_job_file_fills_the_defaults_the_api_documents(resolved, plan):
    spec = build_trainer_config(resolved, plan)["spec"]
    # ffnHiddenSize: 4 * hiddenSize; warmupSteps: min(100, steps / 10), from the contract's one definition.
    assert (spec["model"]["ffnHiddenSize"], spec["training"]["warmupSteps"]) == (4 * 256, 10)


@pytest.mark.parametrize(
    ("product", "peak", "expected"),
    [
        ("NVIDIA-H100-80GB-HBM3", 989.0, {"stepSeconds": 1.25, "peakTflops": 989.0}),
        # A product the planner does not know: the step time it modeled with its default peak, but no peak,
        # so the run reports TFLOP/s and leaves MFU out rather than invent it.
        ("", 100.0, {"stepSeconds": 1.25}),
    ],
    ids=["known-gpu", "unknown-product"],
)
def test_job_file_carries_the_planners_modeled_step_time_and_known_peak(resolved, plan, product, peak, expected):
    figures = dataclasses.replace(plan.estimates, step_seconds=1.25, assumptions={"peakTFLOPS": peak})
    config = build_trainer_config(resolved, dataclasses.replace(plan, estimates=figures, gpu_product=product))
    assert config["modeled"] == expected
    read = jobfile.parse_job_config(config).modeled
    assert read is not None and read.step_seconds == 1.25 and read.peak_tflops == expected.get("peakTflops")


def test_a_plan_without_a_modeled_step_writes_no_modeled_object(resolved, plan):
    config = build_trainer_config(resolved, plan)
    assert "modeled" not in config and jobfile.parse_job_config(config).modeled is None


@pytest.mark.parametrize(
    ("modeled", "field"),
    [({"stepSeconds": 0}, "modeled.stepSeconds"), ({"stepSeconds": 1, "peakTflops": "fast"}, "modeled.peakTflops")],
    ids=["zero-step", "peak-not-a-number"],
)
def test_a_bad_modeled_object_is_one_line_naming_the_field(resolved, plan, modeled, field):
    config = build_trainer_config(resolved, plan) | {"modeled": modeled}
    with pytest.raises(ContractError, match=f"^{field}: "):
        jobfile.parse_job_config(config)
