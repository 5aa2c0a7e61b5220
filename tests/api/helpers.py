"""What the tests share of tests/api: the base job the policy tests vary."""

from __future__ import annotations

BASE = """
apiVersion: paralleljob.io/v1alpha1
kind: ParallelJob
metadata: {name: gpt, namespace: research}
spec:
  parallelism: {pipeline: 2, tensor: 2, data: 2}
  gpusPerNode: 4
  model: {layers: 4, hiddenSize: 256, attentionHeads: 8, sequenceLength: 128, vocabSize: 512}
  training: {steps: 10}
  checkpoint:
    volume: {persistentVolumeClaim: {claimName: ckpt}}
"""
