"""Small builders of ParallelJob documents for the API tests: a valid job as a user writes it, then edits."""

from __future__ import annotations

import copy
from typing import Any

import yaml

BASE = """
apiVersion: paralleljob.io/v1alpha1
kind: ParallelJob
metadata:
  name: gpt-small
spec:
  parallelism: {pipeline: 2, tensor: 4, data: 2}
  gpusPerNode: 8
  model: {layers: 8, hiddenSize: 512, attentionHeads: 8, sequenceLength: 256, vocabSize: 256}
  deepspeed:
    train_micro_batch_size_per_gpu: 2
    gradient_accumulation_steps: 8
    zero_optimization: {stage: 1}
  training: {steps: 100}
  checkpoint: {intervalSteps: 50, volume: {persistentVolumeClaim: {claimName: checkpoints}}}
"""


def job(**edits: Any) -> dict[str, Any]:
    """The base job with dotted-path edits applied; a value of DELETE removes the key."""
    doc: dict[str, Any] = yaml.safe_load(BASE)
    for dotted, value in edits.items():
        set_path(doc, dotted.replace("__", "."), value)
    return doc


DELETE = object()


def set_path(doc: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    node = doc
    *parents, last = dotted.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    if value is DELETE:
        node.pop(last, None)
    else:
        node[last] = copy.deepcopy(value)
    return doc


def edited(doc: dict[str, Any], edits: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    for dotted, value in edits.items():
        set_path(out, dotted, value)
    return out
