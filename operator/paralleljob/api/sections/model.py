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
        "Vocabulary size. The token embedding (first stage) and the untied LM head (last stage) are kept whole "
        "on every tensor-parallel rank, not split, so any size works with any spec.parallelism.tensor. "
        "Byte-level text data (spec.training.data.source: text) needs at least 256.",
        minimum=1,
    )
    ffn_hidden_size: int | None = api_field(
        "Inner size of each MLP. Default: 4 * hiddenSize. Must be divisible by spec.parallelism.tensor.",
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
)
