"""Model arithmetic of the bundled trainer's two architectures: parameters, FLOPs and the parameters one GPU of
a pipeline stage holds. The planner's estimates (`paralleljob.planning.estimates`) and the trainer's metrics
(MFU) both call these, so the figures a plan promises and the figures a run reports come from one formula.

`gpt`: decoder-only with learned position embeddings, pre-LayerNorm blocks with biases, a GELU MLP and an
untied LM head. `llama`: rotary positions (no position table), RMSNorm, grouped-query attention (kv heads),
a SwiGLU MLP (gate, up, down), no biases, optionally tied embeddings (trainer-image/paralleljob_trainer/).
The formulas are the public ones in docs/planning.md.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

Stage = Literal["first", "last", "only"]
Architecture = Literal["gpt", "llama"]

# Megatron's make-vocab-size-divisible-by: a vocabulary split over TP ranks is padded to tensor x this.
VOCAB_PADDING_MULTIPLE = 128


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1's rotary frequency scaling (config.json's rope_scaling with rope_type llama3)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """The numbers of the model the formulas read (l, h, s, V, ffn; heads and kv heads for llama's GQA)."""

    layers: int
    hidden_size: int
    sequence_length: int
    vocab_size: int
    ffn_hidden_size: int
    architecture: Architecture = "gpt"
    attention_heads: int = 1
    kv_heads: int | None = None  # llama: key/value heads (None: as many as attention heads)
    tie_embeddings: bool = False

    @property
    def kv_hidden(self) -> int:
        """Width of the K (or V) projection: kv heads x head size (h for GPT and for llama without GQA)."""
        if self.architecture == "gpt" or self.kv_heads is None:
            return self.hidden_size
        return self.kv_heads * (self.hidden_size // self.attention_heads)


# The shape rules a layout must meet, written once: the API's rules (`paralleljob.api.sections.model`), the
# job-file reader (`jobfile`) and the layout search call them, each with its own message.


def heads_split(attention_heads: int, tensor: int) -> bool:
    """Whether every tensor-parallel rank holds whole attention heads."""
    return attention_heads % tensor == 0


def hidden_per_head(hidden_size: int, attention_heads: int) -> bool:
    """Whether the hidden size splits into whole heads."""
    return hidden_size % attention_heads == 0


def ffn_split(ffn_hidden_size: int, tensor: int) -> bool:
    """Whether every tensor-parallel rank holds an equal share of the feed-forward columns."""
    return ffn_hidden_size % tensor == 0


def layers_fill_stages(layers: int, pipeline: int) -> bool:
    """Whether every pipeline stage gets at least one layer."""
    return layers >= pipeline


def default_ffn_hidden_size(hidden_size: int, architecture: str = "gpt") -> int:
    """spec.model.ffnHiddenSize when unset: 4h for GPT; for llama 8h/3 rounded up to a multiple of 256
    (Meta's `multiple_of`), which keeps the SwiGLU's three matrices at about GPT's 8h^2."""
    if architecture == "llama":
        return 256 * math.ceil(8 * hidden_size / 3 / 256)
    return 4 * hidden_size


def padded_vocab_size(vocab_size: int, tensor: int) -> int:
    """Rows of the embedding and head: the vocabulary itself at TP 1; split over TP ranks (vocab-parallel),
    padded to a multiple of tensor x 128 as Megatron does (the padding rows are masked out of the loss)."""
    if tensor == 1:
        return vocab_size
    multiple = tensor * VOCAB_PADDING_MULTIPLE
    return multiple * math.ceil(vocab_size / multiple)


def _block_matmul_weights(shape: ModelShape) -> int:
    """Weights of one block's matrices: attention 2h^2 + 2h*kv_hidden, MLP 2h*ffn (GELU) or 3h*ffn (SwiGLU)."""
    h, f = shape.hidden_size, shape.ffn_hidden_size
    mlp = 3 * h * f if shape.architecture == "llama" else 2 * h * f
    return 2 * h * h + 2 * h * shape.kv_hidden + mlp


def _block_small_parameters(shape: ModelShape) -> int:
    """Norms and biases of one block: GPT 9h + ffn (two LayerNorms 4h, biases 3h + ffn + 2h); llama 2h."""
    h, f = shape.hidden_size, shape.ffn_hidden_size
    return 2 * h if shape.architecture == "llama" else 9 * h + f


def _position_rows(shape: ModelShape) -> int:
    """Rows of the learned position table: s for GPT, none for llama's rotary positions."""
    return 0 if shape.architecture == "llama" else shape.sequence_length


def _final_norm(shape: ModelShape) -> int:
    return shape.hidden_size if shape.architecture == "llama" else 2 * shape.hidden_size


def parameter_count(shape: ModelShape) -> int:
    """Parameters of the full (unsharded, unpadded) model.

    GPT: per block 4h^2 + 2h*ffn weights, 3h + ffn + 2h biases and two LayerNorms (4h); token and position
    embeddings (V+s)h; a final LayerNorm 2h; an untied LM head Vh. With ffn = 4h this is Megatron's
    12lh^2(1 + 13/12h + (V+s)/12lh) plus the untied head Vh and the final LayerNorm 2h.
    Llama: per block 2h^2 + 2h*kv_hidden + 3h*ffn and two RMSNorms (2h); the token embedding Vh; a final
    RMSNorm h; the LM head Vh unless tied to the embedding.
    """
    h, v = shape.hidden_size, shape.vocab_size
    per_block = _block_matmul_weights(shape) + _block_small_parameters(shape)
    head = 0 if shape.tie_embeddings else v * h
    return shape.layers * per_block + (v + _position_rows(shape)) * h + _final_norm(shape) + head


def training_flops(shape: ModelShape, tokens: int, recompute: bool = False) -> float:
    """Matmul FLOPs of one training pass over `tokens` tokens: k*T*l*(2*W_block + 4sh) + 6*T*h*V.

    W_block is a block's matrix weights (GPT 4h^2 + 2h*ffn, llama 2h^2 + 2h*kv_hidden + 3h*ffn), each costing
    2 FLOPs per token forward; attention adds 4sh (QK^T and AV). Backward costs twice the forward, so k = 3;
    full activation recomputation runs the forward again, k = 4 (hardware work, not model work: MFU counts
    k = 3). The LM head (2hV forward, 4hV backward per token) is never recomputed. For GPT with ffn = 4h and
    k = 4 this is Narayanan et al.'s 96*B*s*l*h^2(1 + s/6h + V/16lh) exactly.
    """
    h, s = shape.hidden_size, shape.sequence_length
    k = 4 if recompute else 3
    return (
        k * tokens * shape.layers * (2 * _block_matmul_weights(shape) + 4 * s * h) + 6 * tokens * h * shape.vocab_size
    )


def layers_per_stage(layers: int, pipeline: int) -> int:
    """Blocks on the fullest pipeline stage."""
    return math.ceil(layers / pipeline)


def end_stages(pipeline: int) -> tuple[Stage, ...]:
    """The pipeline stages whose memory bounds a job: the first and the last (one stage when p = 1)."""
    return ("only",) if pipeline == 1 else ("first", "last")


def kv_replicated(shape: ModelShape, tensor: int) -> bool:
    """Whether every TP rank holds all K and V heads (llama with fewer kv heads than TP ranks)."""
    return shape.architecture == "llama" and shape.kv_heads is not None and shape.kv_heads < tensor


def _block_parameters_per_rank(shape: ModelShape, tensor: int) -> float:
    h, f, t = shape.hidden_size, shape.ffn_hidden_size, tensor
    if shape.architecture == "llama":
        kv = 2 * h * shape.kv_hidden
        kv_held = kv if kv_replicated(shape, t) else kv / t
        return (2 * h * h + 3 * h * f) / t + kv_held + 2 * h
    # GPT: weights, QKV and MLP-up biases split over TP; LayerNorms and the post-all-reduce biases whole.
    return (4 * h * h + 2 * h * f + 3 * h + f) / t + 6 * h


def stage_parameters(shape: ModelShape, pipeline: int, tensor: int, stage: Stage) -> float:
    """Parameters one GPU of `stage` holds before ZeRO sharding.

    A block's weight matrices (and GPT's QKV and MLP-up biases) are split over TP; norms and the biases added
    after an all-reduce are whole on every TP rank, and so are llama's K and V when kv heads < TP. The token
    embedding (first stage) and the LM head (last stage) are vocab-parallel: 1/TP of the padded vocabulary
    each (whole at TP 1); GPT's position table is whole. Tied embeddings are one matrix on a single stage and
    a copy on each end stage of a pipeline.
    """
    h, t = shape.hidden_size, tensor
    vocab_rows = padded_vocab_size(shape.vocab_size, t) / t
    held = layers_per_stage(shape.layers, pipeline) * _block_parameters_per_rank(shape, t)
    if stage in ("first", "only"):
        held += vocab_rows * h + _position_rows(shape) * h
    if stage in ("last", "only"):
        held += _final_norm(shape)
        if not (shape.tie_embeddings and stage == "only"):
            held += vocab_rows * h
    return held
