"""The GPT-3 175B-shaped ParallelJob both planner benchmarks plan (`planner_scale.py`, `planner_cost.py`).

Model and training settings are those of examples/gpt-175b-64xa100.yaml; only the layout and the number of
micro-batches per step vary.
"""

from __future__ import annotations

import yaml

from paralleljob.api import ResolvedJob, validate_document


def gpt_175b_job(name: str, pipeline: int, tensor: int, data: int, micro_batches: int) -> ResolvedJob:
    """A validated GPT-3 175B job (ZeRO-1, full recomputation) with this layout and gradient accumulation."""
    text = f"""
apiVersion: paralleljob.io/v1alpha1
kind: ParallelJob
metadata: {{name: {name}}}
spec:
  parallelism: {{pipeline: {pipeline}, tensor: {tensor}, data: {data}}}
  model: {{layers: 96, hiddenSize: 12288, attentionHeads: 96, sequenceLength: 2048, vocabSize: 51200,
          activationCheckpointInterval: 1}}
  deepspeed: {{train_micro_batch_size_per_gpu: 1, gradient_accumulation_steps: {micro_batches},
              zero_optimization: {{stage: 1}}}}
  training: {{steps: 10}}
  checkpoint: {{intervalSteps: 5, volume: {{emptyDir: {{}}}}}}
"""
    result = validate_document(yaml.safe_load(text))
    assert result.resolved is not None, [problem.render() for problem in result.problems]
    return result.resolved
