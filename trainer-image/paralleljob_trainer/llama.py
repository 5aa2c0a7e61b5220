"""The llama architecture's pipeline layers: token embedding, Llama blocks, final RMSNorm and LM head.

A block is x + attn(rms1(x)), then + down(silu(gate(n)) * up(n)) with n = rms2(x), with no biases, rotary
position embeddings on q and k (the rotate-half convention of Hugging Face's LlamaModel, so an export needs no
permutation) and grouped-query attention. Tensor parallelism as Megatron splits it: q, k, v, gate and up
column-parallel behind one copy-to-TP of the normed input, the attention output and down row-parallel. Each
rank holds whole key/value groups (kvHeads % tensor == 0); when tensor > kvHeads every rank holds all key/value
heads and uses its group's, their gradient summed over the TP group (vLLM's replication, exact for training).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from deepspeed.pipe import LayerSpec, TiedLayerSpec
from torch import nn
from torch.nn import functional

from paralleljob_contract.jobfile import ModelConfig
from paralleljob_contract.model import RopeScaling
from paralleljob_trainer import weights
from paralleljob_trainer.tensor_parallel import (
    RowParallelLinear,
    TensorParallel,
    column_shard,
    copy_to_tensor_parallel,
    enter_parallel_region,
    mark_replicated,
    mark_sharded,
    row_shard,
)
from paralleljob_trainer.vocab_parallel import VocabParallelEmbedding, VocabParallelHead, vocab_parallel_logits

EMBEDDING_LAYER = 0
RMS_NORM_EPS = 1e-5


def rms_norm(hidden: int, tp: TensorParallel, eps: float = RMS_NORM_EPS) -> nn.RMSNorm:
    norm = nn.RMSNorm(hidden, eps=eps)
    mark_replicated(norm.weight, tp)
    return norm


def llama3_frequencies(inverse_frequency: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    """Llama 3.1's scaled frequencies: wavelengths longer than the original context / low_freq_factor divided
    by `factor`, shorter than context / high_freq_factor kept, and those between interpolated smoothly."""
    context = scaling.original_max_position_embeddings
    low, high = scaling.low_freq_factor, scaling.high_freq_factor
    wavelength = 2 * math.pi / inverse_frequency
    scaled = torch.where(wavelength > context / low, inverse_frequency / scaling.factor, inverse_frequency)
    smooth = (context / wavelength - low) / (high - low)
    between = (wavelength <= context / low) & (wavelength >= context / high)
    return torch.where(between, (1 - smooth) * scaled / scaling.factor + smooth * scaled, scaled)


def rotary_tables(
    sequence: int, head_dim: int, theta: float, device: torch.device, scaling: RopeScaling | None = None
) -> tuple[torch.Tensor, ...]:
    """cos and sin of position x frequency, [s, head_dim], computed in float32 as transformers does."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    inverse_frequency = 1.0 / (theta**exponents)
    if scaling is not None:
        inverse_frequency = llama3_frequencies(inverse_frequency, scaling)
    angles = torch.outer(torch.arange(sequence, device=device).float(), inverse_frequency)
    doubled = torch.cat((angles, angles), dim=-1)
    return doubled.cos(), doubled.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate [b, heads, s, d] by position: x cos + rotate_half(x) sin (first half paired with second)."""
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat((-second, first), dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


class ShardedWeight(nn.Module):
    """A bias-free linear whose input is already in the parallel region (one copy-to-TP serves several)."""

    def __init__(self, local_weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = mark_sharded(nn.Parameter(local_weight))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return functional.linear(inputs, self.weight)


class ReplicatedKeyValue(nn.Module):
    """K or V when tensor > kvHeads: every rank holds all kv heads and projects onto its group's only.

    The weight enters the parallel region through copy-to-TP, so its gradient (each rank's rows of its own
    group) is summed over the TP group: identical on every rank, the unsharded model's gradient."""

    def __init__(self, full_weight: torch.Tensor, group: int, head_dim: int, tp: TensorParallel) -> None:
        super().__init__()
        self.tp = tp
        self.rows = slice(group * head_dim, (group + 1) * head_dim)
        self.weight = mark_replicated(nn.Parameter(full_weight), tp, sequence_partial=False)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return functional.linear(inputs, copy_to_tensor_parallel(self.weight, self.tp)[self.rows])


def _key_value(model: ModelConfig, seed: int, layer: int, name: str, tp: TensorParallel) -> nn.Module:
    d, kv, h = model.head_dim, model.query_groups, model.hidden_size
    if kv % tp.size == 0:
        return ShardedWeight(column_shard(tp, seed, layer, name, (kv * d, h)))
    ranks_per_group = tp.size // kv
    return ReplicatedKeyValue(weights.normal(seed, layer, name, (kv * d, h)), tp.rank // ranks_per_group, d, tp)


class LlamaBlock(nn.Module):
    """RMSNorm, rotary grouped-query attention and a SwiGLU MLP, with Megatron's TP splits."""

    def __init__(self, model: ModelConfig, seed: int, layer: int, tp: TensorParallel) -> None:
        super().__init__()
        h, f, d = model.hidden_size, model.ffn_hidden_size, model.head_dim
        out_std = weights.residual_std(model.layers)
        self.tp, self.model = tp, model
        self.local_heads = model.attention_heads // tp.size
        self.local_kv_heads = max(1, model.query_groups // tp.size)
        self.attn_norm = rms_norm(h, tp, model.norm_eps)
        self.q = ShardedWeight(column_shard(tp, seed, layer, "q", (model.attention_heads * d, h)))
        self.k = _key_value(model, seed, layer, "k", tp)
        self.v = _key_value(model, seed, layer, "v", tp)
        self.o = RowParallelLinear(row_shard(tp, seed, layer, "o", (h, h), out_std), tp, bias=False)
        self.mlp_norm = rms_norm(h, tp, model.norm_eps)
        self.gate = ShardedWeight(column_shard(tp, seed, layer, "gate", (f, h)))
        self.up = ShardedWeight(column_shard(tp, seed, layer, "up", (f, h)))
        self.down = RowParallelLinear(row_shard(tp, seed, layer, "down", (h, f), out_std), tp, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self._attention(enter_parallel_region(self.attn_norm(hidden), self.tp))
        normed = enter_parallel_region(self.mlp_norm(hidden), self.tp)
        return hidden + self.down(functional.silu(self.gate(normed)) * self.up(normed))

    def _attention(self, normed: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = normed.shape
        d = self.model.head_dim
        q = self.q(normed).view(batch, seq, self.local_heads, d).transpose(1, 2)
        k = self.k(normed).view(batch, seq, self.local_kv_heads, d).transpose(1, 2)
        v = self.v(normed).view(batch, seq, self.local_kv_heads, d).transpose(1, 2)
        cos, sin = rotary_tables(seq, d, self.model.rope_theta, normed.device, self.model.rope_scaling)
        q, k = apply_rotary(q, cos.to(q.dtype), sin.to(q.dtype)), apply_rotary(k, cos.to(k.dtype), sin.to(k.dtype))
        context = functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o(context.transpose(1, 2).reshape(batch, seq, self.local_heads * d))


class LlamaEmbedding(nn.Module):
    """The token embedding (vocab-parallel when tensor > 1); rotary positions need no table."""

    def __init__(self, model: ModelConfig, seed: int, tp: TensorParallel) -> None:
        super().__init__()
        self.tokens = VocabParallelEmbedding(model.vocab_size, model.hidden_size, tp, seed, EMBEDDING_LAYER, "tokens")

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.tokens(tokens)


def tied_logits(embedding: LlamaEmbedding, hidden: torch.Tensor) -> torch.Tensor:
    """The LM head of tied embeddings: this rank's logit columns from the token embedding's rows."""
    return vocab_parallel_logits(hidden, embedding.tokens.weight, embedding.tokens.tp)


class FinalNorm(nn.Module):
    """The final RMSNorm, a layer of its own when the head is the (tied) embedding."""

    def __init__(self, model: ModelConfig, seed: int, tp: TensorParallel) -> None:
        super().__init__()
        self.norm = rms_norm(model.hidden_size, tp, model.norm_eps)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.norm(hidden)


class LlamaHead(nn.Module):
    """Final RMSNorm and the untied LM head (vocab-parallel when tensor > 1)."""

    def __init__(self, model: ModelConfig, seed: int, tp: TensorParallel) -> None:
        super().__init__()
        self.norm = rms_norm(model.hidden_size, tp, model.norm_eps)
        self.lm_head = VocabParallelHead(model.vocab_size, model.hidden_size, tp, seed, model.layers + 1, "lm_head")

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden))


def layer_specs(model: ModelConfig, seed: int, tp: TensorParallel) -> list[Any]:
    """Embedding, blocks and head; with tied embeddings the head is the embedding's TiedLayerSpec, which
    DeepSpeed builds once on a single stage and once on each end stage of a pipeline, summing their
    gradients over the tie group every step (and counting the copy in the gradient norm once)."""
    blocks = [LayerSpec(LlamaBlock, model, seed, layer, tp) for layer in range(1, model.layers + 1)]
    if not model.tie_embeddings:
        return [LayerSpec(LlamaEmbedding, model, seed, tp), *blocks, LayerSpec(LlamaHead, model, seed, tp)]
    tied = "embeddings"
    return [
        TiedLayerSpec(tied, LlamaEmbedding, model, seed, tp, tied_weight_attr=["tokens.weight"]),
        *blocks,
        LayerSpec(FinalNorm, model, seed, tp),
        TiedLayerSpec(
            tied, LlamaEmbedding, model, seed, tp, forward_fn=tied_logits, tied_weight_attr=["tokens.weight"]
        ),
    ]
