"""job.json: identity, resolved spec, DeepSpeed config and the trainer's part of the plan."""

from __future__ import annotations

from paralleljob.manifests.trainer_config import build_trainer_config


def test_job_file_carries_spec_deepspeed_and_plan(resolved, plan):
    config = build_trainer_config(resolved, plan)
    assert config["apiVersion"] == "paralleljob.io/v1alpha1"
    assert config["kind"] == "ParallelJob"
    assert config["metadata"] == {"name": "gpt", "namespace": "research"}
    assert config["spec"]["parallelism"] == {"pipeline": 2, "tensor": 4, "data": 2}
    assert config["deepspeed"]["train_batch_size"] == 2 * 8 * 2
    assert config["plan"]["nodes"] == plan["nodes"]
    assert "estimates" not in config["plan"]


def test_job_file_does_not_alias_the_plan(resolved, plan):
    config = build_trainer_config(resolved, plan)
    config["plan"]["nodes"][0]["node"] = "elsewhere"
    assert plan["nodes"][0]["node"] == "node-0"
