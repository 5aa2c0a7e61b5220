"""The decoder-only GPT as a list of pipeline layers, tensor-parallel inside each block.

Layer list: `Embedding` (token + position, replicated), `layers` x `TransformerBlock` (pre-LN, causal
self-attention and MLP; QKV and MLP-up column-parallel, attention-out and MLP-down row-parallel, heads split
across TP), and `Head` (final LN + untied LM head, replicated). `build_pipeline` hands them to DeepSpeed's
PipelineModule, which places blocks evenly over the stages. Why the vocabulary is replicated rather than
vocab-parallel is written down in docs/trainer.md.
"""

from __future__ import annotations

import torch
from deepspeed.pipe import LayerSpec, PipelineModule
from deepspeed.runtime.pipe.topology import ProcessTopology
from torch import nn
from torch.nn import functional

from paralleljob_contract.jobfile import ModelConfig
from paralleljob_trainer import weights
from paralleljob_trainer.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    TensorParallel,
    mark_replicated,
)

EMBEDDING_LAYER = 0


def _layer_norm(hidden: int, tp: TensorParallel) -> nn.LayerNorm:
    norm = nn.LayerNorm(hidden)
    for parameter in norm.parameters():
        mark_replicated(parameter, tp)
    return norm


class Embedding(nn.Module):
    """Token and learned position embeddings; every TP rank holds them whole."""

    def __init__(self, model: ModelConfig, seed: int, tp: TensorParallel) -> None:
        super().__init__()
        h = model.hidden_size
        self.tokens = nn.Embedding(model.vocab_size, h)
        self.positions = nn.Embedding(model.sequence_length, h)
        with torch.no_grad():
            self.tokens.weight.copy_(weights.normal(seed, EMBEDDING_LAYER, "tokens", (model.vocab_size, h)))
            self.positions.weight.copy_(weights.normal(seed, EMBEDDING_LAYER, "positions", (model.sequence_length, h)))
        mark_replicated(self.tokens.weight, tp)
        mark_replicated(self.positions.weight, tp)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.tokens(tokens) + self.positions(positions)


def _qkv_full_weight(model: ModelConfig, seed: int, layer: int, tp: TensorParallel) -> torch.Tensor:
    """The [3h, h] QKV weight with rows regrouped so that TP rank r's chunk is (q_r, k_r, v_r).

    The unsharded model's rows are q (h), k (h), v (h), each heads-major; regrouping keeps every rank's heads
    whole and lets one column-parallel matmul produce its q, k and v.
    """
    h = model.hidden_size
    full = weights.normal(seed, layer, "qkv", (3 * h, h))
    return full.view(3, tp.size, h // tp.size, h).transpose(0, 1).reshape(3 * h, h)


class TransformerBlock(nn.Module):
    """Pre-LN block: x + attn(ln1(x)), then + mlp(ln2(x)), with Megatron's TP splits."""

    def __init__(self, model: ModelConfig, seed: int, layer: int, tp: TensorParallel) -> None:
        super().__init__()
        h, f = model.hidden_size, model.ffn_hidden_size
        out_std = weights.residual_std(model.layers)
        self.local_heads = model.attention_heads // tp.size
        self.head_dim = model.head_dim
        self.ln1 = _layer_norm(h, tp)
        self.qkv = ColumnParallelLinear(_qkv_full_weight(model, seed, layer, tp), tp)
        self.attn_out = RowParallelLinear(weights.normal(seed, layer, "attn_out", (h, h), out_std), tp)
        self.ln2 = _layer_norm(h, tp)
        self.mlp_up = ColumnParallelLinear(weights.normal(seed, layer, "mlp_up", (f, h)), tp)
        self.mlp_down = RowParallelLinear(weights.normal(seed, layer, "mlp_down", (h, f), out_std), tp)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self._attention(self.ln1(hidden))
        return hidden + self.mlp_down(functional.gelu(self.mlp_up(self.ln2(hidden))))

    def _attention(self, normed: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = normed.shape
        q, k, v = self.qkv(normed).view(batch, seq, 3, self.local_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        context = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.attn_out(context.transpose(1, 2).reshape(batch, seq, self.local_heads * self.head_dim))


class Head(nn.Module):
    """Final LayerNorm and the LM head (untied from the token embedding), replicated on every TP rank."""

    def __init__(self, model: ModelConfig, seed: int, tp: TensorParallel) -> None:
        super().__init__()
        layer = model.layers + 1
        self.ln_f = _layer_norm(model.hidden_size, tp)
        self.lm_head = nn.Linear(model.hidden_size, model.vocab_size, bias=False)
        with torch.no_grad():
            self.lm_head.weight.copy_(weights.normal(seed, layer, "lm_head", (model.vocab_size, model.hidden_size)))
        mark_replicated(self.lm_head.weight, tp)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(hidden))


def language_model_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of one micro-batch, computed in float32."""
    return functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))


def layer_specs(model: ModelConfig, seed: int, tp: TensorParallel) -> list[LayerSpec]:
    """The pipeline's layers in order; DeepSpeed builds only those of this rank's stage."""
    blocks = [LayerSpec(TransformerBlock, model, seed, layer, tp) for layer in range(1, model.layers + 1)]
    return [LayerSpec(Embedding, model, seed, tp), *blocks, LayerSpec(Head, model, seed, tp)]


class GPTPipeline(PipelineModule):  # type: ignore[misc]
    """The GPT as a PipelineModule whose tensor-parallel group is DeepSpeed's own.

    PipelineModule builds a PipelineParallelGrid over the topology, with a process group for every axis, the
    model (tensor) axis included (its "slice" group), before it builds this stage's layers. `_build` hands
    the layers that group, so the trainer creates no process group of its own.
    """

    def __init__(self, model: ModelConfig, seed: int, topology: ProcessTopology) -> None:
        self.gpt_shape = (model, seed)
        # Partitioning reads only the layer types; the layers themselves are built in `_build`.
        placeholder = TensorParallel(rank=0, size=topology.get_dim("model"))
        super().__init__(
            layers=layer_specs(model, seed, placeholder),
            topology=topology,
            loss_fn=language_model_loss,
            partition_method="type:TransformerBlock",
            activation_checkpoint_interval=model.activation_checkpoint_interval,
            # Only blocks are recomputed: DeepSpeed's reentrant checkpoint gives no gradient to a chunk whose
            # input needs none (the embedding's token ids), and the head is cheap. Chunks count from a stage's
            # first layer.
            checkpointable_layers=[TransformerBlock.__name__],
        )

    def _build(self) -> None:
        grid = self._grid
        size = grid.get_slice_parallel_world_size()
        self.tensor_parallel = TensorParallel(
            rank=grid.get_slice_parallel_rank(), size=size, group=grid.slice_proc_group if size > 1 else None
        )
        model, seed = self.gpt_shape
        self._layer_specs = layer_specs(model, seed, self.tensor_parallel)
        super()._build()


def build_pipeline(model: ModelConfig, seed: int, topology: ProcessTopology) -> GPTPipeline:
    """The GPT as a PipelineModule; stages get an even share of transformer blocks."""
    return GPTPipeline(model, seed, topology)
