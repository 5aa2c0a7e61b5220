"""Cross-field rules of a ParallelJob spec, each written twice: as a CEL rule for the CRD and in Python.

The CRD's `x-kubernetes-validations` reject a bad job at `kubectl apply`; the Python twin gives the same
verdict (with the numbers in the message) to `paralleljob validate`, the operator and the local runner.
`tests/api/test_cel_rules.py` evaluates both on the same specs and checks that they agree.

CEL cannot see fields that the schema preserves as unknown, so every DeepSpeed key a rule reads is declared
in `types.DEEPSPEED_KNOWN_PROPERTIES`. CEL also errors on `has(a.b)` when `a` is absent, so every rule guards
each level of a path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from paralleljob.api import types as t
from paralleljob.api.problems import Problem, error
from paralleljob_contract.layout import tensor_fits

Check = Callable[[t.ParallelJobSpec], Problem | None]

_DS = "has(self.deepspeed)"
_ZERO = f"{_DS} && has(self.deepspeed.zero_optimization)"
_STAGE = f"{_ZERO} && has(self.deepspeed.zero_optimization.stage)"


@dataclasses.dataclass(frozen=True)
class Rule:
    """One cross-field rule: where it applies, its CEL form and its Python form."""

    name: str
    field_path: str  # relative to spec, as the CRD's fieldPath (".parallelism.tensor")
    cel: str
    message: str  # the fixed message CEL reports
    check: Check
    # Only for a job on a cluster (the CRD, the operator, `paralleljob validate`); `paralleljob run` skips it.
    cluster_only: bool = False

    def x_kubernetes_validation(self) -> dict[str, Any]:
        return {"rule": self.cel, "message": self.message, "fieldPath": self.field_path, "reason": "FieldValueInvalid"}


def zero_stage(spec: t.ParallelJobSpec) -> int:
    """The ZeRO stage of spec.deepspeed (0 when absent or malformed)."""
    zero = (spec.deepspeed or {}).get("zero_optimization") or {}
    stage = zero.get("stage", 0) if isinstance(zero, dict) else 0
    return stage if isinstance(stage, int) else 0


def _ds_int(spec: t.ParallelJobSpec, key: str) -> int | None:
    value = (spec.deepspeed or {}).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ds_enabled(spec: t.ParallelJobSpec, key: str) -> bool | None:
    section = (spec.deepspeed or {}).get(key)
    if isinstance(section, dict) and isinstance(section.get("enabled"), bool):
        return bool(section["enabled"])
    return None


def multi_node_nvlink(spec: t.ParallelJobSpec) -> bool:
    """Whether tensor-parallel groups may span nodes: an NVLink domain label and an IMEX channel for the pods.
    Without the channel NCCL cannot map GPU memory across nodes, and the all-reduces would go over the NIC."""
    return spec.topology.nvlink_domain_label is not None and spec.network.imex_channel_claim is not None


_MNNVL = (
    "has(self.topology) && has(self.topology.nvlinkDomainLabel) && has(self.network) "
    "&& has(self.network.imexChannelClaim)"
)


def _tensor_fits_node(spec: t.ParallelJobSpec) -> Problem | None:
    gpn, tp = spec.gpus_per_node, spec.parallelism.tensor
    if gpn is None or tp is None or multi_node_nvlink(spec) or tensor_fits(tp, gpn, multi_node_domain=False):
        return None
    # The largest divisor of gpusPerNode below tensor, found from tensor down (never gpusPerNode steps).
    divisor = next(d for d in range(min(gpn, tp), 0, -1) if gpn % d == 0)
    return error(
        "spec.parallelism.tensor",
        f"{tp} does not divide gpusPerNode {gpn}, so a tensor-parallel group would cross nodes and run its "
        f"all-reduces over the network; set tensor to a divisor of {gpn} (e.g. {divisor}) or, on a "
        "multi-node NVLink domain, set spec.topology.nvlinkDomainLabel and spec.network.imexChannelClaim.",
    )


def _tensor_fits_clique(spec: t.ParallelJobSpec) -> Problem | None:
    gpn, tp = spec.gpus_per_node, spec.parallelism.tensor
    if gpn is None or tp is None or not multi_node_nvlink(spec) or tensor_fits(tp, gpn, multi_node_domain=True):
        return None
    return error(
        "spec.parallelism.tensor",
        f"{tp} neither divides nor is a multiple of gpusPerNode {gpn}, so tensor-parallel groups would not "
        "line up with pods; make one a multiple of the other.",
    )


def _heads_split(spec: t.ParallelJobSpec) -> Problem | None:
    heads, tp = spec.model.attention_heads, spec.parallelism.tensor
    if tp is None or heads % tp == 0:
        return None
    return error(
        "spec.model.attentionHeads",
        f"{heads} heads cannot be split evenly across tensor {tp}; use a multiple of {tp} heads or a tensor "
        "size that divides the head count.",
    )


def _hidden_per_head(spec: t.ParallelJobSpec) -> Problem | None:
    hidden, heads = spec.model.hidden_size, spec.model.attention_heads
    if hidden % heads == 0:
        return None
    return error(
        "spec.model.hiddenSize",
        f"{hidden} is not divisible by attentionHeads {heads}; make hiddenSize a multiple of {heads}.",
    )


def _ffn_split(spec: t.ParallelJobSpec) -> Problem | None:
    ffn, tp = spec.model.ffn_hidden_size, spec.parallelism.tensor
    if ffn is None or tp is None or ffn % tp == 0:
        return None
    return error(
        "spec.model.ffnHiddenSize",
        f"{ffn} cannot be split evenly across tensor {tp}; use a multiple of {tp}.",
    )


def _layers_per_stage(spec: t.ParallelJobSpec) -> Problem | None:
    layers, pp = spec.model.layers, spec.parallelism.pipeline
    if pp is None or layers >= pp:
        return None
    return error(
        "spec.model.layers",
        f"{layers} layers cannot fill {pp} pipeline stages; use at least {pp} layers or at most {layers} stages.",
    )


def _zero_with_pipeline(spec: t.ParallelJobSpec) -> Problem | None:
    stage, pp = zero_stage(spec), spec.parallelism.pipeline
    if stage < 2 or pp is None or pp <= 1:
        return None
    return error(
        "spec.deepspeed.zero_optimization.stage",
        f"ZeRO stage {stage} with pipeline {pp}: DeepSpeed's pipeline engine asserts \"ZeRO-2 and ZeRO-3 are "
        'incompatible with pipeline parallelism"; use stage 1, or pipeline 1.',
    )


def _offload_needs_zero(spec: t.ParallelJobSpec) -> Problem | None:
    zero = (spec.deepspeed or {}).get("zero_optimization")
    offload = zero.get("offload_optimizer") if isinstance(zero, dict) else None
    if not isinstance(offload, dict) or offload.get("device", "cpu") == "none" or zero_stage(spec) >= 1:
        return None
    return error(
        "spec.deepspeed.zero_optimization.offload_optimizer",
        "optimizer offload needs ZeRO stage 1 or more; set zero_optimization.stage to 1, or remove the offload.",
    )


def _batch_product(spec: t.ParallelJobSpec) -> Problem | None:
    tbs, micro = _ds_int(spec, "train_batch_size"), _ds_int(spec, "train_micro_batch_size_per_gpu")
    gas, dp = _ds_int(spec, "gradient_accumulation_steps"), spec.parallelism.data
    if None in (tbs, micro, gas, dp):
        return None
    assert tbs is not None and micro is not None and gas is not None and dp is not None
    if tbs == micro * gas * dp:
        return None
    return error(
        "spec.deepspeed.train_batch_size",
        f"{tbs} != micro-batch {micro} x gradient_accumulation_steps {gas} x DP {dp} = {micro * gas * dp}; "
        f"set train_batch_size to {micro * gas * dp} or change one factor.",
    )


def budget_gpus(spec: t.ParallelJobSpec) -> int | None:
    """The GPU budget of spec.parallelism (gpus, or nodes x gpusPerNode), None when the sizes are given."""
    par = spec.parallelism
    if par.gpus is not None:
        return par.gpus
    if par.nodes is not None and spec.gpus_per_node is not None:
        return par.nodes * spec.gpus_per_node
    return None


def _sizes_or_budget(spec: t.ParallelJobSpec) -> Problem | None:
    par = spec.parallelism
    if (par.pipeline is not None and par.tensor is not None) or par.gpus is not None or par.nodes is not None:
        return None
    return error(
        "spec.parallelism",
        "needs pipeline and tensor, or a GPU budget (gpus, or nodes with gpusPerNode) for the operator to "
        "choose them; set one.",
    )


def _one_budget(spec: t.ParallelJobSpec) -> Problem | None:
    par = spec.parallelism
    if par.gpus is None or par.nodes is None:
        return None
    return error("spec.parallelism.nodes", "and gpus both give a budget; keep one.")


def _nodes_need_gpus_per_node(spec: t.ParallelJobSpec) -> Problem | None:
    if spec.parallelism.nodes is None or spec.gpus_per_node is not None:
        return None
    return error(
        "spec.parallelism.nodes",
        f"{spec.parallelism.nodes} nodes need spec.gpusPerNode to make a GPU budget; set it, or give gpus instead.",
    )


def _budget_matches_sizes(spec: t.ParallelJobSpec) -> Problem | None:
    par, gpus = spec.parallelism, spec.parallelism.gpus
    if gpus is None or None in (par.pipeline, par.tensor, par.data):
        return None
    assert par.pipeline is not None and par.tensor is not None and par.data is not None
    product = par.pipeline * par.tensor * par.data
    if product == gpus:
        return None
    return error(
        "spec.parallelism.gpus",
        f"{gpus} GPUs but pipeline {par.pipeline} x tensor {par.tensor} x data {par.data} = {product}; "
        "leave one size out for the operator to choose, or make them agree.",
    )


def _budget_needs_train_batch(spec: t.ParallelJobSpec) -> Problem | None:
    if budget_gpus(spec) is None or _ds_int(spec, "train_batch_size") is not None:
        return None
    return error(
        "spec.deepspeed.train_batch_size",
        "is needed with a GPU budget: the layout search splits this global batch into micro-batch x "
        "accumulation x DP; set it.",
    )


def data_parallel_of(spec: t.ParallelJobSpec) -> int | None:
    """DP as the API derives it: spec.parallelism.data, else train_batch_size / (micro x GAS) when those three
    are given and divide; None when it cannot be derived (the batch rules report why)."""
    if spec.parallelism.data is not None:
        return spec.parallelism.data
    tbs, micro = _ds_int(spec, "train_batch_size"), _ds_int(spec, "train_micro_batch_size_per_gpu")
    gas = _ds_int(spec, "gradient_accumulation_steps")
    if tbs is None or micro is None or gas is None or micro * gas <= 0 or tbs % (micro * gas):
        return None
    return tbs // (micro * gas)


def _gpus_per_node_divides_world(spec: t.ParallelJobSpec) -> Problem | None:
    gpn, pp, tp, dp = spec.gpus_per_node, spec.parallelism.pipeline, spec.parallelism.tensor, data_parallel_of(spec)
    if not gpn or pp is None or tp is None or dp is None or dp <= 0:
        return None
    world = pp * tp * dp
    if world % gpn == 0:
        return None
    fits = [g for g in range(min(gpn, world), 0, -1) if world % g == 0 and g % tp == 0] or [world]
    return error(
        "spec.gpusPerNode",
        f"{gpn} does not divide the job's {world} GPUs (pipeline {pp} x tensor {tp} x data {dp}), so the ranks "
        f"cannot fill whole pods; set gpusPerNode to a divisor of {world} such as {fits[0]}, or remove it to let "
        "the planner choose.",
    )


def _data_path(spec: t.ParallelJobSpec) -> Problem | None:
    data = spec.training.data
    if data.source == "synthetic" or data.path:
        return None
    return error(
        "spec.training.data.path",
        f"is required for source {data.source}; set it to the file or folder to read inside the pod.",
    )


def _byte_vocab(spec: t.ParallelJobSpec) -> Problem | None:
    if spec.training.data.source != "text" or spec.model.vocab_size >= 256:
        return None
    return error(
        "spec.model.vocabSize",
        f"{spec.model.vocab_size} is too small for byte-level text; set vocabSize to at least 256.",
    )


def _uint16_vocab(spec: t.ParallelJobSpec) -> Problem | None:
    data = spec.training.data
    if data.source != "tokens" or data.token_dtype != "uint16" or spec.model.vocab_size <= 65536:
        return None
    return error(
        "spec.training.data.tokenDtype",
        f"uint16 holds ids below 65536 but vocabSize is {spec.model.vocab_size}; use tokenDtype uint32.",
    )


# Metadata keys the operator sets on every pod and selects its pods by: the paralleljob.io domain (and its
# subdomains) and app.kubernetes.io/managed-by. A user key there would blind the operator to its own pods, or
# to another job's.
OPERATOR_DOMAIN = "paralleljob.io"
MANAGED_BY_KEY = "app.kubernetes.io/managed-by"
_OWNED_KEY_CEL = "k.matches('^([^/]*[.])?paralleljob[.]io/') || k == 'app.kubernetes.io/managed-by'"


def is_operator_key(key: str) -> bool:
    """Whether a label or annotation key belongs to the operator (its domain, or app.kubernetes.io/managed-by)."""
    domain, slash, _ = key.partition("/")
    owned_domain = bool(slash) and (domain == OPERATOR_DOMAIN or domain.endswith("." + OPERATOR_DOMAIN))
    return owned_domain or key == MANAGED_BY_KEY


def _operator_keys(kind: str, keys: dict[str, str] | None) -> Problem | None:
    owned = sorted(key for key in keys or {} if is_operator_key(key))
    if not owned:
        return None
    return error(
        f"spec.template.{kind}",
        f"{', '.join(owned)}: keys in the {OPERATOR_DOMAIN}/ domain and {MANAGED_BY_KEY} are set by the "
        "operator, which finds its pods by them; remove them or use a key of your own domain.",
    )


def _operator_labels(spec: t.ParallelJobSpec) -> Problem | None:
    return _operator_keys("labels", spec.template.labels)


def _operator_annotations(spec: t.ParallelJobSpec) -> Problem | None:
    return _operator_keys("annotations", spec.template.annotations)


def _metadata_cel(kind: str) -> str:
    return f"!has(self.template) || !has(self.template.{kind}) || self.template.{kind}.all(k, !({_OWNED_KEY_CEL}))"


def _precision_matches(spec: t.ParallelJobSpec) -> Problem | None:
    precision = spec.model.precision
    for key in ("bf16", "fp16"):
        if _ds_enabled(spec, key) and precision != key:
            return error(
                f"spec.deepspeed.{key}.enabled",
                f"is true but spec.model.precision is {precision}; remove it (precision sets it) or set "
                f"precision to {key}.",
            )
    return None


def _checkpoint_volume(spec: t.ParallelJobSpec) -> Problem | None:
    if spec.checkpoint is None or spec.checkpoint.volume:
        return None
    return error(
        "spec.checkpoint.volume",
        "is required on a cluster: without it the checkpoints are written inside the container and lost with "
        "it; set {persistentVolumeClaim: {claimName: ...}} on a ReadWriteMany claim, or {emptyDir: {}} for "
        "checkpoints that need not survive a restart.",
    )


_PAR = "self.parallelism"
_BUDGET = f"(has({_PAR}.gpus) || has({_PAR}.nodes))"

RULES: tuple[Rule, ...] = (
    Rule(
        "sizes-or-budget",
        ".parallelism",
        f"(has({_PAR}.pipeline) && has({_PAR}.tensor)) || {_BUDGET}",
        "parallelism needs pipeline and tensor, or a GPU budget (gpus, or nodes with gpusPerNode)",
        _sizes_or_budget,
    ),
    Rule(
        "one-budget",
        ".parallelism.nodes",
        f"!(has({_PAR}.gpus) && has({_PAR}.nodes))",
        "parallelism.gpus and parallelism.nodes both give a budget; keep one",
        _one_budget,
    ),
    Rule(
        "nodes-need-gpus-per-node",
        ".parallelism.nodes",
        f"!has({_PAR}.nodes) || has(self.gpusPerNode)",
        "parallelism.nodes needs gpusPerNode to make a GPU budget",
        _nodes_need_gpus_per_node,
    ),
    Rule(
        "budget-matches-sizes",
        ".parallelism.gpus",
        f"!(has({_PAR}.gpus) && has({_PAR}.pipeline) && has({_PAR}.tensor) && has({_PAR}.data)) "
        f"|| {_PAR}.pipeline * {_PAR}.tensor * {_PAR}.data == {_PAR}.gpus",
        "parallelism.pipeline * tensor * data must equal parallelism.gpus when all are given",
        _budget_matches_sizes,
    ),
    Rule(
        "budget-needs-train-batch",
        ".deepspeed.train_batch_size",
        f"!{_BUDGET} || (has(self.deepspeed) && has(self.deepspeed.train_batch_size))",
        "a GPU budget needs deepspeed.train_batch_size, the global batch the layout search splits",
        _budget_needs_train_batch,
    ),
    Rule(
        "tensor-fits-node",
        ".parallelism.tensor",
        f"!has(self.gpusPerNode) || !has(self.parallelism.tensor) || ({_MNNVL}) "
        "|| self.gpusPerNode % self.parallelism.tensor == 0",
        "parallelism.tensor must divide gpusPerNode, so that each tensor-parallel group stays in one node",
        _tensor_fits_node,
    ),
    Rule(
        "tensor-fits-clique",
        ".parallelism.tensor",
        f"!has(self.gpusPerNode) || !has(self.parallelism.tensor) || !({_MNNVL}) "
        "|| self.gpusPerNode % self.parallelism.tensor == 0 || self.parallelism.tensor % self.gpusPerNode == 0",
        "parallelism.tensor and gpusPerNode must divide one another in a multi-node NVLink domain",
        _tensor_fits_clique,
    ),
    Rule(
        "heads-split-across-tensor",
        ".model.attentionHeads",
        "!has(self.parallelism.tensor) || self.model.attentionHeads % self.parallelism.tensor == 0",
        "model.attentionHeads must be divisible by parallelism.tensor",
        _heads_split,
    ),
    Rule(
        "hidden-per-head",
        ".model.hiddenSize",
        "self.model.hiddenSize % self.model.attentionHeads == 0",
        "model.hiddenSize must be divisible by model.attentionHeads",
        _hidden_per_head,
    ),
    Rule(
        "ffn-split-across-tensor",
        ".model.ffnHiddenSize",
        "!has(self.model.ffnHiddenSize) || !has(self.parallelism.tensor) "
        "|| self.model.ffnHiddenSize % self.parallelism.tensor == 0",
        "model.ffnHiddenSize must be divisible by parallelism.tensor",
        _ffn_split,
    ),
    Rule(
        "layers-fill-stages",
        ".model.layers",
        "!has(self.parallelism.pipeline) || self.model.layers >= self.parallelism.pipeline",
        "model.layers must be at least parallelism.pipeline, so that every stage has a layer",
        _layers_per_stage,
    ),
    Rule(
        "zero-with-pipeline",
        ".deepspeed.zero_optimization.stage",
        f"!({_STAGE}) || self.deepspeed.zero_optimization.stage < 2 || !has(self.parallelism.pipeline) "
        "|| self.parallelism.pipeline == 1",
        "ZeRO stage 2 and 3 are incompatible with pipeline parallelism; use stage 1, or pipeline 1",
        _zero_with_pipeline,
    ),
    Rule(
        "offload-needs-zero",
        ".deepspeed.zero_optimization.offload_optimizer",
        f"!({_ZERO} && has(self.deepspeed.zero_optimization.offload_optimizer)) "
        "|| (has(self.deepspeed.zero_optimization.offload_optimizer.device) "
        "&& self.deepspeed.zero_optimization.offload_optimizer.device == 'none') "
        f"|| ({_STAGE} && self.deepspeed.zero_optimization.stage >= 1)",
        "optimizer offload needs ZeRO stage 1 or more",
        _offload_needs_zero,
    ),
    Rule(
        "batch-product",
        ".deepspeed.train_batch_size",
        f"!({_DS} && has(self.deepspeed.train_batch_size) && has(self.deepspeed.train_micro_batch_size_per_gpu) "
        "&& has(self.deepspeed.gradient_accumulation_steps) && has(self.parallelism.data)) "
        "|| self.deepspeed.train_batch_size == self.deepspeed.train_micro_batch_size_per_gpu "
        "* self.deepspeed.gradient_accumulation_steps * self.parallelism.data",
        "train_batch_size must equal train_micro_batch_size_per_gpu * gradient_accumulation_steps * parallelism.data",
        _batch_product,
    ),
    Rule(
        "gpus-per-node-divides-world",
        ".gpusPerNode",
        "!has(self.gpusPerNode) || self.gpusPerNode == 0 || !has(self.parallelism.pipeline) "
        "|| !has(self.parallelism.tensor) || (has(self.parallelism.data) "
        "? (self.parallelism.pipeline * self.parallelism.tensor * self.parallelism.data) % self.gpusPerNode == 0 "
        f": (!({_DS} && has(self.deepspeed.train_batch_size) && has(self.deepspeed.train_micro_batch_size_per_gpu) "
        "&& has(self.deepspeed.gradient_accumulation_steps)) "
        "|| self.deepspeed.train_micro_batch_size_per_gpu * self.deepspeed.gradient_accumulation_steps <= 0 "
        "|| self.deepspeed.train_batch_size % (self.deepspeed.train_micro_batch_size_per_gpu "
        "* self.deepspeed.gradient_accumulation_steps) != 0 "
        "|| (self.parallelism.pipeline * self.parallelism.tensor * (self.deepspeed.train_batch_size "
        "/ (self.deepspeed.train_micro_batch_size_per_gpu * self.deepspeed.gradient_accumulation_steps))) "
        "% self.gpusPerNode == 0))",
        "gpusPerNode must divide pipeline * tensor * data, so that the ranks fill whole pods",
        _gpus_per_node_divides_world,
    ),
    Rule(
        "data-path-required",
        ".training.data.path",
        "!has(self.training.data) || !has(self.training.data.source) "
        "|| self.training.data.source == 'synthetic' || has(self.training.data.path)",
        "training.data.path is required for sources text and tokens",
        _data_path,
    ),
    Rule(
        "byte-vocab",
        ".model.vocabSize",
        "!has(self.training.data) || !has(self.training.data.source) "
        "|| self.training.data.source != 'text' || self.model.vocabSize >= 256",
        "byte-level text needs model.vocabSize of at least 256",
        _byte_vocab,
    ),
    Rule(
        "uint16-vocab",
        ".training.data.tokenDtype",
        "!has(self.training.data) || !has(self.training.data.source) || self.training.data.source != 'tokens' "
        "|| (has(self.training.data.tokenDtype) && self.training.data.tokenDtype == 'uint32') "
        "|| self.model.vocabSize <= 65536",
        "uint16 token files hold ids below 65536; use tokenDtype uint32 for larger vocabularies",
        _uint16_vocab,
    ),
    Rule(
        "precision-matches-deepspeed",
        ".model.precision",
        "!has(self.deepspeed) || ("
        "(!has(self.deepspeed.bf16) || !has(self.deepspeed.bf16.enabled) || !self.deepspeed.bf16.enabled "
        "|| (has(self.model.precision) && self.model.precision == 'bf16')) && "
        "(!has(self.deepspeed.fp16) || !has(self.deepspeed.fp16.enabled) || !self.deepspeed.fp16.enabled "
        "|| (has(self.model.precision) && self.model.precision == 'fp16')))",
        "deepspeed bf16/fp16 must agree with model.precision",
        _precision_matches,
    ),
    Rule(
        "checkpoint-needs-volume",
        ".checkpoint.volume",
        "!has(self.checkpoint) || has(self.checkpoint.volume)",
        "checkpoint.volume is required: set {persistentVolumeClaim: {claimName: ...}} on a ReadWriteMany claim, "
        "or {emptyDir: {}} for checkpoints that need not survive a restart",
        _checkpoint_volume,
        cluster_only=True,
    ),
    Rule(
        "operator-owned-labels",
        ".template.labels",
        _metadata_cel("labels"),
        "labels in the paralleljob.io/ domain and app.kubernetes.io/managed-by are set by the operator",
        _operator_labels,
    ),
    Rule(
        "operator-owned-annotations",
        ".template.annotations",
        _metadata_cel("annotations"),
        "annotations in the paralleljob.io/ domain and app.kubernetes.io/managed-by are set by the operator",
        _operator_annotations,
    ),
)

# -- architecture and sequence-parallel rules (spec.model.architecture, kvHeads; parallelism.sequenceParallel) --


def _kv_heads_need_llama(spec: t.ParallelJobSpec) -> Problem | None:
    model = spec.model
    if model.kv_heads is None or model.architecture == "llama":
        return None
    return error("spec.model.kvHeads", "grouped-query attention is a llama feature; set architecture: llama.")


def _tie_needs_llama(spec: t.ParallelJobSpec) -> Problem | None:
    model = spec.model
    if not model.tie_embeddings or model.architecture == "llama":
        return None
    return error(
        "spec.model.tieEmbeddings",
        "tied embeddings are a llama feature (gpt keeps its untied head); set architecture: llama.",
    )


def _kv_heads_divide_heads(spec: t.ParallelJobSpec) -> Problem | None:
    kv, heads = spec.model.kv_heads, spec.model.attention_heads
    if kv is None or heads % kv == 0:
        return None
    return error(
        "spec.model.kvHeads",
        f"{kv} does not divide attentionHeads {heads}: each key/value head serves a whole group of query heads; "
        f"use a divisor of {heads}.",
    )


def _kv_heads_fit_tensor(spec: t.ParallelJobSpec) -> Problem | None:
    kv, tp = spec.model.kv_heads, spec.parallelism.tensor
    if kv is None or tp is None or kv % tp == 0 or tp % kv == 0:
        return None
    return error(
        "spec.model.kvHeads",
        f"{kv} and tensor {tp} do not divide one another: each tensor-parallel rank must hold whole key/value "
        "groups (kvHeads a multiple of tensor), or all of them (tensor a multiple of kvHeads).",
    )


def _rotary_pairs(spec: t.ParallelJobSpec) -> Problem | None:
    model = spec.model
    head_dim = model.hidden_size // model.attention_heads
    if model.architecture != "llama" or head_dim % 2 == 0:
        return None
    return error(
        "spec.model.hiddenSize",
        f"hiddenSize / attentionHeads = {head_dim} is odd; rotary embeddings rotate pairs of a head's dimensions, "
        "so llama needs an even head size.",
    )


def _sequence_parallel_needs_tensor(spec: t.ParallelJobSpec) -> Problem | None:
    tp, seq = spec.parallelism.tensor, spec.model.sequence_length
    if not spec.parallelism.sequence_parallel or (tp is not None and tp > 1 and seq % tp == 0):
        return None
    return error(
        "spec.parallelism.sequenceParallel",
        f"needs an explicit parallelism.tensor > 1 that divides model.sequenceLength {seq} (tensor is {tp}); "
        "set tensor, or turn sequenceParallel off.",
    )


_LLAMA = "has(self.model.architecture) && self.model.architecture == 'llama'"

ARCHITECTURE_RULES: tuple[Rule, ...] = (
    Rule(
        "kv-heads-need-llama",
        ".model.kvHeads",
        f"!has(self.model.kvHeads) || ({_LLAMA})",
        "model.kvHeads (grouped-query attention) needs model.architecture llama",
        _kv_heads_need_llama,
    ),
    Rule(
        "tie-embeddings-need-llama",
        ".model.tieEmbeddings",
        f"!has(self.model.tieEmbeddings) || !self.model.tieEmbeddings || ({_LLAMA})",
        "model.tieEmbeddings needs model.architecture llama",
        _tie_needs_llama,
    ),
    Rule(
        "kv-heads-divide-heads",
        ".model.kvHeads",
        "!has(self.model.kvHeads) || self.model.attentionHeads % self.model.kvHeads == 0",
        "model.kvHeads must divide model.attentionHeads",
        _kv_heads_divide_heads,
    ),
    Rule(
        "kv-heads-fit-tensor",
        ".model.kvHeads",
        "!has(self.model.kvHeads) || !has(self.parallelism.tensor) "
        "|| self.model.kvHeads % self.parallelism.tensor == 0 || self.parallelism.tensor % self.model.kvHeads == 0",
        "model.kvHeads and parallelism.tensor must divide one another",
        _kv_heads_fit_tensor,
    ),
    Rule(
        "rotary-pairs",
        ".model.hiddenSize",
        f"!({_LLAMA}) || (self.model.hiddenSize / self.model.attentionHeads) % 2 == 0",
        "llama needs an even head size (model.hiddenSize / model.attentionHeads)",
        _rotary_pairs,
    ),
    Rule(
        "sequence-parallel-needs-tensor",
        ".parallelism.sequenceParallel",
        f"!has({_PAR}.sequenceParallel) || !{_PAR}.sequenceParallel "
        f"|| (has({_PAR}.tensor) && {_PAR}.tensor > 1 && self.model.sequenceLength % {_PAR}.tensor == 0)",
        "parallelism.sequenceParallel needs parallelism.tensor > 1 dividing model.sequenceLength",
        _sequence_parallel_needs_tensor,
    ),
)
RULES = RULES + ARCHITECTURE_RULES


# Rules on the whole object (CRD root): only metadata.name is visible there besides spec.
NAME_RULE_CEL = (
    f"self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && size(self.metadata.name) <= {t.MAX_NAME_LENGTH}"
)
NAME_RULE_MESSAGE = (
    f"metadata.name must be a DNS-1123 label of at most {t.MAX_NAME_LENGTH} characters (pods are <name>-<nodeRank>)"
)

# A transition rule on spec (evaluated on updates only, with oldSelf the stored spec): the fields that decide
# the rank layout, the model's shape and the batch cannot change after creation, since the plan, the pods and
# the checkpoints on the volume all depend on them. Other fields (steps, template, network, failure policy...)
# may change; the operator applies them from the next gang attempt. Each field is compared on its own: one
# `self == oldSelf` over the whole spec would compare unbounded lists and preserved objects, whose estimated
# CEL cost a real API server refuses when the CRD is created.
SPEC_IMMUTABLE_FIELDS = (
    "parallelism.gpus",
    "parallelism.nodes",
    "parallelism.pipeline",
    "parallelism.tensor",
    "parallelism.data",
    "gpusPerNode",
    "model.layers",
    "model.hiddenSize",
    "model.attentionHeads",
    "model.sequenceLength",
    "model.vocabSize",
    "model.ffnHiddenSize",
    "model.precision",
    "model.architecture",
    "model.kvHeads",
    "model.ropeTheta",
    "model.tieEmbeddings",
    "deepspeed.train_batch_size",
    "deepspeed.train_micro_batch_size_per_gpu",
    "deepspeed.gradient_accumulation_steps",
)


def _unchanged(path: str) -> str:
    """CEL: the field at `path` is set in both or neither, and equal when set (every level guarded)."""
    parts = path.split(".")
    prefixes = [".".join(parts[: i + 1]) for i in range(len(parts))]

    def present(root: str) -> str:
        return " && ".join(f"has({root}.{prefix})" for prefix in prefixes)

    return f"(({present('self')}) == ({present('oldSelf')}) && (!({present('self')}) || self.{path} == oldSelf.{path}))"


SPEC_IMMUTABLE_CEL = " && ".join(_unchanged(path) for path in SPEC_IMMUTABLE_FIELDS)
SPEC_IMMUTABLE_MESSAGE = (
    "parallelism, gpusPerNode, the model's shape and precision, and the DeepSpeed batch sizes cannot change after "
    "creation: delete the ParallelJob and create it again (training resumes from the checkpoint volume)"
)


def check_rules(spec: t.ParallelJobSpec, *, cluster: bool = True) -> list[Problem]:
    """Run every cross-field rule (without `cluster`, not the cluster-only ones); all problems, not the first."""
    rules = [rule for rule in RULES if cluster or not rule.cluster_only]
    return [p for rule in rules if (p := rule.check(spec)) is not None]
