"""Model arithmetic of the bundled trainer's GPT: parameters, FLOPs and the parameters one GPU of a pipeline
stage holds. The planner's estimates (`paralleljob.planning.estimates`) and the trainer's metrics (MFU) both call
these, so the figures a plan promises and the figures a run reports come from one formula.

The GPT is decoder-only with learned position embeddings, pre-LayerNorm blocks and an untied LM head
(trainer-image/paralleljob_trainer/model.py). The formulas are the public ones in docs/planning.md.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

Stage = Literal["first", "last", "only"]


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """The numbers of the model the formulas read (l, h, s, V, ffn)."""

    layers: int
    hidden_size: int
    sequence_length: int
    vocab_size: int
    ffn_hidden_size: int


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


def default_ffn_hidden_size(hidden_size: int) -> int:
    """spec.model.ffnHiddenSize when unset: 4 * hiddenSize."""
    return 4 * hidden_size


def parameter_count(shape: ModelShape) -> int:
    """Parameters of the full (unsharded) model.

    Per block 4h^2 + 2h*ffn weights, 3h + ffn + 2h biases and two LayerNorms (4h); token and position
    embeddings (V+s)h; a final LayerNorm 2h; an untied LM head Vh. With ffn = 4h this is Megatron's
    12lh^2(1 + 13/12h + (V+s)/12lh) plus the untied head Vh and the final LayerNorm 2h.
    """
    h, f = shape.hidden_size, shape.ffn_hidden_size
    per_block = 4 * h * h + 2 * h * f + 9 * h + f
    return shape.layers * per_block + (shape.vocab_size + shape.sequence_length) * h + 2 * h + shape.vocab_size * h


def training_flops(shape: ModelShape, tokens: int, recompute: bool = False) -> float:
    """Matmul FLOPs of one training pass over `tokens` tokens: k*T*l*(8h^2 + 4h*ffn + 4sh) + 6*T*h*V.

    The forward pass of a block costs 2 FLOPs per multiply-add: QKV 6h^2, attention 4sh (QK^T and AV),
    output 2h^2, MLP 4h*ffn per token. Backward costs twice the forward, so k = 3; full activation
    recomputation runs the forward again, k = 4 (hardware work, not model work: MFU counts k = 3). The LM
    head (2hV forward, 4hV backward per token) is never recomputed. With ffn = 4h and k = 4 this is
    Narayanan et al.'s 96*B*s*l*h^2(1 + s/6h + V/16lh) exactly.
    """
    h, s, f = shape.hidden_size, shape.sequence_length, shape.ffn_hidden_size
    k = 4 if recompute else 3
    return k * tokens * shape.layers * (8 * h * h + 4 * h * f + 4 * s * h) + 6 * tokens * h * shape.vocab_size


def layers_per_stage(layers: int, pipeline: int) -> int:
    """Blocks on the fullest pipeline stage."""
    return math.ceil(layers / pipeline)


def end_stages(pipeline: int) -> tuple[Stage, ...]:
    """The pipeline stages whose memory bounds a job: the first and the last (one stage when p = 1)."""
    return ("only",) if pipeline == 1 else ("first", "last")


def stage_parameters(shape: ModelShape, pipeline: int, tensor: int, stage: Stage) -> float:
    """Parameters one GPU of `stage` holds before ZeRO sharding.

    A block's weight matrices, QKV and MLP-up biases are split over TP; its LayerNorms and the biases added
    after an all-reduce are whole on every TP rank. The trainer keeps the embeddings (first stage) and the
    final LayerNorm and untied LM head (last stage) whole on every TP rank.
    """
    h, f, t = shape.hidden_size, shape.ffn_hidden_size, tensor
    per_block = (4 * h * h + 2 * h * f + 3 * h + f) / t + 6 * h
    held = layers_per_stage(shape.layers, pipeline) * per_block
    if stage in ("first", "only"):
        held += (shape.vocab_size + shape.sequence_length) * h
    if stage in ("last", "only"):
        held += shape.vocab_size * h + 2 * h
    return held
