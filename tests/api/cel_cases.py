"""The CEL table: specs that exercise every rule of the CRD both ways, shared by the offline check of the rules
and their Python twins (tests/api/test_cel_rules.py) and the real API server's (tests/upstream/test_crd.py)."""

from __future__ import annotations

from paralleljob.api import crd
from tests.api.jobs import DELETE

SPEC_SCHEMA = crd.spec_schema()

IMEX = {
    "spec.network": {"imexChannelClaim": "imex"},
    "spec.template": {"resourceClaims": [{"name": "imex", "resourceClaimTemplateName": "cd-channel"}]},
}
# Specs that exercise every rule both ways; ids say which rule they are aimed at.
CASES = {
    "base": {},
    "budget-gpus": {"spec.parallelism": {"gpus": 16}, "spec.deepspeed.train_batch_size": 32},
    "budget-nodes": {"spec.parallelism": {"nodes": 2}, "spec.deepspeed.train_batch_size": 32},
    "no-sizes-no-budget": {"spec.parallelism": {"data": 2}},
    "gpus-and-nodes": {"spec.parallelism": {"gpus": 16, "nodes": 2}, "spec.deepspeed.train_batch_size": 32},
    "nodes-without-gpus-per-node": {
        "spec.parallelism": {"nodes": 2},
        "spec.gpusPerNode": DELETE,
        "spec.deepspeed.train_batch_size": 32,
    },
    # Found by the fuzzing (test_fuzz_specs): nodes without gpusPerNode is still a budget to CEL, so the twin
    # must ask for the train batch too.
    "nodes-without-gpus-per-node-or-batch": {"spec.parallelism": {"nodes": 2}, "spec.gpusPerNode": DELETE},
    "budget-sizes-agree": {"spec.parallelism.gpus": 16, "spec.deepspeed.train_batch_size": 32},
    "budget-sizes-disagree": {"spec.parallelism.gpus": 32, "spec.deepspeed.train_batch_size": 32},
    "budget-no-train-batch": {"spec.parallelism": {"gpus": 16}},
    "budget-tensor-fixed": {"spec.parallelism": {"gpus": 16, "tensor": 3}, "spec.deepspeed.train_batch_size": 32},
    "tensor-not-dividing-node": {
        "spec.parallelism.tensor": 3,
        "spec.model.attentionHeads": 12,
        "spec.model.hiddenSize": 768,
    },
    "tensor-in-clique-multiple": {
        "spec.parallelism.tensor": 16,
        "spec.model.attentionHeads": 16,
        "spec.topology": {"nvlinkDomainLabel": "nvidia.com/gpu.clique"},
        **IMEX,
    },
    "tensor-in-clique-misaligned": {
        "spec.parallelism.tensor": 12,
        "spec.model.attentionHeads": 12,
        "spec.model.hiddenSize": 768,
        "spec.topology": {"nvlinkDomainLabel": "nvidia.com/gpu.clique"},
        **IMEX,
    },
    # A clique label alone no longer lets TP cross nodes: without an IMEX channel NCCL cannot use the NVLink.
    "tensor-in-clique-without-imex": {
        "spec.parallelism.tensor": 16,
        "spec.model.attentionHeads": 16,
        "spec.topology": {"nvlinkDomainLabel": "nvidia.com/gpu.clique"},
    },
    "no-gpus-per-node": {
        "spec.gpusPerNode": DELETE,
        "spec.parallelism.tensor": 3,
        "spec.model.attentionHeads": 12,
        "spec.model.hiddenSize": 768,
    },
    "four-gpu-job-on-eight-gpu-nodes": {"spec.parallelism": {"pipeline": 1, "tensor": 4, "data": 1}},
    "gpus-per-node-not-dividing-derived-data": {
        "spec.parallelism.data": DELETE,
        "spec.parallelism.tensor": 2,
        "spec.parallelism.pipeline": 3,
        "spec.model.layers": 9,
        "spec.deepspeed.train_batch_size": 16,
    },
    "gpus-per-node-dividing-derived-data": {"spec.parallelism.data": DELETE, "spec.deepspeed.train_batch_size": 64},
    "heads-not-split": {"spec.model.attentionHeads": 6, "spec.model.hiddenSize": 516},
    "hidden-not-per-head": {"spec.model.hiddenSize": 500},
    "ffn-not-split": {"spec.model.ffnHiddenSize": 1026},
    "ffn-split": {"spec.model.ffnHiddenSize": 1024},
    "too-few-layers": {"spec.model.layers": 1},
    "zero2-pipeline": {"spec.deepspeed.zero_optimization.stage": 2},
    "zero3-no-pipeline": {"spec.deepspeed.zero_optimization.stage": 3, "spec.parallelism.pipeline": 1},
    "zero-absent": {"spec.deepspeed": {"train_micro_batch_size_per_gpu": 2}},
    "offload-zero0": {"spec.deepspeed.zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}},
    "offload-no-stage": {"spec.deepspeed.zero_optimization": {"offload_optimizer": {"device": "cpu"}}},
    "offload-none-device": {"spec.deepspeed.zero_optimization": {"offload_optimizer": {"device": "none"}}},
    "offload-zero1": {"spec.deepspeed.zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}},
    "batch-inconsistent": {"spec.deepspeed.train_batch_size": 30},
    "batch-consistent": {"spec.deepspeed.train_batch_size": 32},
    "text-no-path": {"spec.training.data": {"source": "text"}},
    "tokens-with-path": {"spec.training.data": {"source": "tokens", "path": "/d.bin"}},
    "tokens-blend-without-path": {"spec.training.data": {"source": "tokens", "sources": [{"path": "/a"}]}},
    "eval-held-out-fraction": {"spec.training.eval": {"heldOutFraction": 0.1}},
    "eval-folder-and-fraction": {"spec.training.eval": {"path": "/held", "heldOutFraction": 0.1}},
    "eval-neither": {"spec.training.eval": {"intervalSteps": 10}},
    "text-small-vocab": {"spec.training.data": {"source": "text", "path": "/d"}, "spec.model.vocabSize": 100},
    "tokens-uint16-big-vocab": {
        "spec.training.data": {"source": "tokens", "path": "/d"},
        "spec.model.vocabSize": 100000,
    },
    "tokens-uint32-big-vocab": {
        "spec.training.data": {"source": "tokens", "path": "/d", "tokenDtype": "uint32"},
        "spec.model.vocabSize": 100000,
    },
    "fp16-but-bf16": {"spec.deepspeed.fp16": {"enabled": True}},
    "fp16-agrees": {"spec.deepspeed.fp16": {"enabled": True}, "spec.model.precision": "fp16"},
    "bf16-disabled": {"spec.deepspeed.bf16": {"enabled": False}, "spec.model.precision": "fp32"},
    "checkpoint-without-volume": {"spec.checkpoint.volume": DELETE},
    "checkpoint-on-empty-dir": {"spec.checkpoint.volume": {"emptyDir": {}}},
    "no-checkpoint": {"spec.checkpoint": DELETE},
    "own-labels": {"spec.template": {"labels": {"team": "a", "example.com/x": "1", "app.kubernetes.io/name": "g"}}},
    "job-label-override": {"spec.template": {"labels": {"paralleljob.io/job": "other"}}},
    "subdomain-label": {"spec.template": {"labels": {"x.paralleljob.io/y": "1"}}},
    "managed-by-label": {"spec.template": {"labels": {"app.kubernetes.io/managed-by": "me"}}},
    "lookalike-label": {"spec.template": {"labels": {"notparalleljob.io/y": "1", "paralleljob.io": "1"}}},
    "own-annotations": {"spec.template": {"annotations": {"example.com/owner": "team-a"}}},
    "operator-annotation": {"spec.template": {"annotations": {"paralleljob.io/attempt": "0"}}},
    "llama-gqa-whole-groups": {"spec.model.architecture": "llama", "spec.model.kvHeads": 4},
    "llama-gqa-replicated-kv": {
        "spec.model.architecture": "llama",
        "spec.model.kvHeads": 2,
        "spec.model.tieEmbeddings": True,
    },
    "kv-heads-on-gpt": {"spec.model.kvHeads": 2},
    "tie-on-gpt": {"spec.model.tieEmbeddings": True},
    "kv-heads-not-dividing": {"spec.model.architecture": "llama", "spec.model.kvHeads": 3},
    "llama-odd-head-size": {"spec.model.architecture": "llama", "spec.model.hiddenSize": 520},
    "pretrained-folder": {"spec.model.pretrained": {"path": "/models/llama"}},
    "pretrained-empty-path": {"spec.model.pretrained": {"path": ""}},
    "sequence-parallel": {"spec.parallelism.sequenceParallel": True},
    "sequence-parallel-tensor-1": {"spec.parallelism.sequenceParallel": True, "spec.parallelism.tensor": 1},
    "sequence-parallel-uneven": {"spec.parallelism.sequenceParallel": True, "spec.model.sequenceLength": 254},
    "sequence-parallel-budget": {
        "spec.parallelism": {"gpus": 16, "sequenceParallel": True},
        "spec.deepspeed.train_batch_size": 32,
    },
    "spares-and-shrink": {"spec.failurePolicy": {"spareNodes": 2, "allowDataShrink": True, "minData": 1}},
    "min-data-above-data": {"spec.failurePolicy": {"allowDataShrink": True, "minData": 3}},
    "min-data-without-shrink": {"spec.failurePolicy": {"minData": 1}},
    "min-data-with-budget": {
        "spec.parallelism": {"gpus": 16},
        "spec.deepspeed.train_batch_size": 32,
        "spec.failurePolicy": {"allowDataShrink": True, "minData": 4},
    },
}
