"""job.json: version, identity, resolved spec, DeepSpeed config and the plan's layout, which the trainer reads."""

from __future__ import annotations

from paralleljob.manifests.trainer_config import build_trainer_config


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
