"""spec.model: the transformer's shape and precision, and the rules that split it (heads and ffn across tensor,
layers across pipeline stages, a byte-level vocabulary).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

from paralleljob.api.fields import api_field
from paralleljob.api.problems import Problem, error
from paralleljob.api.rule import Rule
from paralleljob_contract import jobfile
from paralleljob_contract import model as model_math

if TYPE_CHECKING:
    from paralleljob.api import types as t

Precision = Literal["bf16", "fp16", "fp32"]
Architecture = Literal["gpt", "llama"]


@dataclasses.dataclass(frozen=True)
class Pretrained:
    """A Hugging Face folder whose weights the model starts from."""

    path: str = api_field(
        "Folder of a LlamaForCausalLM or GPT2LMHeadModel (config.json and *.safetensors, one file or shards with "
        "model.safetensors.index.json), as seen inside the pod (mount it with spec.template.volumes); relative "
        "to the job file's folder under `paralleljob run`. The rest of spec.model must agree with config.json "
        "(`paralleljob model-spec DIR` prints the section); each rank reads only the slices it holds. A resume "
        "from a checkpoint reads the checkpoint instead."
    )


@dataclasses.dataclass(frozen=True)
class Model:
    """The shape of the GPT model the bundled trainer builds."""

    layers: int = api_field("Number of transformer blocks. Split into spec.parallelism.pipeline stages.", minimum=1)
    hidden_size: int = api_field("Hidden (embedding) size; must be divisible by attentionHeads.", minimum=1)
    attention_heads: int = api_field(
        "Number of attention heads; must be divisible by spec.parallelism.tensor, since heads are split "
        "across tensor-parallel ranks.",
        minimum=1,
    )
    sequence_length: int = api_field("Tokens per sample (context length).", minimum=1)
    vocab_size: int = api_field(
        "Vocabulary size. With spec.parallelism.tensor > 1 the token embedding (first stage) and the LM head "
        "(last stage) are vocab-parallel: padded to a multiple of tensor x 128 (the padding masked out of the "
        "loss) and split over the tensor-parallel ranks, so any size works with any tensor size. Byte-level "
        "text data (spec.training.data.source: text) needs at least 256.",
        minimum=1,
    )
    ffn_hidden_size: int | None = api_field(
        "Inner size of each MLP. Default: 4 * hiddenSize for gpt, 8/3 * hiddenSize rounded up to a multiple of "
        "256 for llama. Must be divisible by spec.parallelism.tensor.",
        default=None,
        minimum=1,
    )
    precision: Precision = api_field(
        "Numeric precision: bf16 (the GPU default), fp16 (with loss scaling) or fp32 (CPU and exact tests). "
        "Sets bf16/fp16 in the DeepSpeed config; a contradicting spec.deepspeed is an error.",
        default=jobfile.DEFAULT_PRECISION,
    )
    activation_checkpoint_interval: int = api_field(
        "Recompute activations every this many layers in the backward pass, trading compute for memory "
        "(DeepSpeed PipelineModule activation_checkpoint_interval). 0 turns recomputation off.",
        default=jobfile.DEFAULT_ACTIVATION_CHECKPOINT_INTERVAL,
        minimum=0,
    )
    architecture: Architecture = api_field(
        "The block the bundled trainer builds. gpt: learned positions, LayerNorm, GELU MLP, biases. llama: "
        "rotary positions (ropeTheta), RMSNorm, SwiGLU MLP (gate, up, down), no biases, grouped-query "
        "attention (kvHeads); exported as LlamaForCausalLM (spec.checkpoint.export).",
        default=jobfile.DEFAULT_ARCHITECTURE,
    )
    kv_heads: int | None = api_field(
        "llama only: key/value heads of grouped-query attention. Default: attentionHeads (no grouping). Must "
        "divide attentionHeads, and kvHeads and spec.parallelism.tensor must divide one another: each "
        "tensor-parallel rank holds whole key/value groups, or every rank holds all of them when tensor > kvHeads.",
        default=None,
        minimum=1,
    )
    rope_theta: float = api_field(
        "llama only: base of the rotary position embeddings' frequencies (10000 in Llama 2, 500000 in Llama 3).",
        default=jobfile.DEFAULT_ROPE_THETA,
        minimum=1,
    )
    tie_embeddings: bool = api_field(
        "llama only: share one matrix between the token embedding and the LM head. With pipeline > 1 the first "
        "and the last stage each hold a copy whose gradients are summed every step (DeepSpeed's tied layers).",
        default=False,
    )
    pretrained: Pretrained | None = api_field(
        "Start from the weights of a Hugging Face folder instead of seeded random ones. Norm epsilons, Llama "
        "3.1's rope_scaling and GPT-2's gelu_new are taken from its config.json.",
        default=None,
    )


def _heads_split(spec: t.ParallelJobSpec) -> Problem | None:
    heads, tp = spec.model.attention_heads, spec.parallelism.tensor
    if tp is None or model_math.heads_split(heads, tp):
        return None
    return error(
        "spec.model.attentionHeads",
        f"{heads} heads cannot be split evenly across tensor {tp}; use a multiple of {tp} heads or a tensor "
        "size that divides the head count.",
    )


def _hidden_per_head(spec: t.ParallelJobSpec) -> Problem | None:
    hidden, heads = spec.model.hidden_size, spec.model.attention_heads
    if model_math.hidden_per_head(hidden, heads):
        return None
    return error(
        "spec.model.hiddenSize",
        f"{hidden} is not divisible by attentionHeads {heads}; make hiddenSize a multiple of {heads}.",
    )


def _ffn_split(spec: t.ParallelJobSpec) -> Problem | None:
    ffn, tp = spec.model.ffn_hidden_size, spec.parallelism.tensor
    if ffn is None or tp is None or model_math.ffn_split(ffn, tp):
        return None
    return error(
        "spec.model.ffnHiddenSize",
        f"{ffn} cannot be split evenly across tensor {tp}; use a multiple of {tp}.",
    )


def _layers_per_stage(spec: t.ParallelJobSpec) -> Problem | None:
    layers, pp = spec.model.layers, spec.parallelism.pipeline
    if pp is None or model_math.layers_fill_stages(layers, pp):
        return None
    return error(
        "spec.model.layers",
        f"{layers} layers cannot fill {pp} pipeline stages; use at least {pp} layers or at most {layers} stages.",
    )


def _byte_vocab(spec: t.ParallelJobSpec) -> Problem | None:
    if spec.training.data.source != "text" or spec.model.vocab_size >= 256:
        return None
    return error(
        "spec.model.vocabSize",
        f"{spec.model.vocab_size} is too small for byte-level text; set vocabSize to at least 256.",
    )


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


def _pretrained_path(spec: t.ParallelJobSpec) -> Problem | None:
    pretrained = spec.model.pretrained
    if pretrained is None or pretrained.path:
        return None
    return error("spec.model.pretrained.path", "is empty; set it to the Hugging Face folder inside the pod.")


_LLAMA = "has(self.model.architecture) && self.model.architecture == 'llama'"

RULES: tuple[Rule, ...] = (
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
        "byte-vocab",
        ".model.vocabSize",
        "!has(self.training.data) || !has(self.training.data.source) "
        "|| self.training.data.source != 'text' || self.model.vocabSize >= 256",
        "byte-level text needs model.vocabSize of at least 256",
        _byte_vocab,
    ),
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
        "pretrained-path-set",
        ".model.pretrained.path",
        "!has(self.model.pretrained) || size(self.model.pretrained.path) > 0",
        "model.pretrained.path must name a folder",
        _pretrained_path,
    ),
)
