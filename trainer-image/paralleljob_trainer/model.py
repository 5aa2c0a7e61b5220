"""The decoder-only model as a list of pipeline layers, tensor-parallel inside each block.

GPT layer list: `Embedding` (token embedding, vocab-parallel when tensor > 1, plus learned positions),
`layers` x `TransformerBlock` (pre-LN, causal self-attention and MLP; QKV and MLP-up column-parallel,
attention-out and MLP-down row-parallel, heads split across TP), and `Head` (final LN + untied LM head,
vocab-parallel when tensor > 1). The llama layers are `paralleljob_trainer.llama`'s. `build_pipeline` hands
them to DeepSpeed's PipelineModule, which places blocks evenly over the stages; the loss is the vocab-parallel
cross-entropy (`paralleljob_trainer.vocab_parallel`).
"""

from __future__ import annotations

from pathlib import Path

import torch
from deepspeed.pipe import LayerSpec, PipelineModule
from deepspeed.runtime.pipe.topology import ProcessTopology
from torch import nn
from torch.nn import functional

from paralleljob_contract.jobfile import ModelConfig
from paralleljob_trainer import llama, pretrained, weights
from paralleljob_trainer.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    TensorParallel,
    column_shard,
    mark_replicated,
    row_shard,
)
from paralleljob_trainer.vocab_parallel import LanguageModelLoss, VocabParallelEmbedding, VocabParallelHead

EMBEDDING_LAYER = 0


def _layer_norm(hidden: int, tp: TensorParallel, eps: float) -> nn.LayerNorm:
    norm = nn.LayerNorm(hidden, eps=eps)
    for parameter in norm.parameters():
        mark_replicated(parameter, tp)
    return norm


class Embedding(nn.Module):
    """Token embedding (vocab-parallel when tensor > 1) and learned position embeddings (whole on every rank)."""

    def __init__(self, model: ModelConfig, seed: int, tp: TensorParallel) -> None:
        super().__init__()
        h = model.hidden_size
        self.tp = tp
        self.tokens = VocabParallelEmbedding(model.vocab_size, h, tp, seed, EMBEDDING_LAYER, "tokens")
        # `_weight` keeps nn.Embedding from drawing a N(0, 1) table of its own first.
        positions = weights.normal(seed, EMBEDDING_LAYER, "positions", (model.sequence_length, h))
        self.positions = nn.Embedding(model.sequence_length, h, _weight=positions)
        mark_replicated(self.positions.weight, tp)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        embedded = self.tokens(tokens)  # under sequence parallelism: this rank's shard of the sequence
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        if self.tp.sequence_parallel and self.tp.size > 1:
            span = self.tp.span(tokens.shape[1])
            positions = positions[span.start : span.stop]
        return embedded + self.positions(positions)


def _qkv_local_weight(model: ModelConfig, seed: int, layer: int, tp: TensorParallel) -> torch.Tensor:
    """This rank's rows (q_r, k_r, v_r) of the [3h, h] QKV weight.

    The unsharded model's rows are q (h), k (h), v (h), each heads-major; taking each rank's heads of all three
    keeps its heads whole and lets one column-parallel matmul produce its q, k and v.
    """
    h = model.hidden_size
    heads = tp.span(h)
    parts = [range(part * h + heads.start, part * h + heads.stop) for part in range(3)]
    return torch.cat([weights.normal_slice(seed, layer, "qkv", (3 * h, h), rows) for rows in parts])


class TransformerBlock(nn.Module):
    """Pre-LN block: x + attn(ln1(x)), then + mlp(ln2(x)), with Megatron's TP splits."""

    def __init__(self, model: ModelConfig, seed: int, layer: int, tp: TensorParallel) -> None:
        super().__init__()
        h, f = model.hidden_size, model.ffn_hidden_size
        out_std = weights.residual_std(model.layers)
        self.local_heads = model.attention_heads // tp.size
        self.head_dim = model.head_dim
        self.ln1 = _layer_norm(h, tp, model.norm_eps)
        self.qkv = ColumnParallelLinear(_qkv_local_weight(model, seed, layer, tp), tp)
        self.attn_out = RowParallelLinear(row_shard(tp, seed, layer, "attn_out", (h, h), out_std), tp)
        self.ln2 = _layer_norm(h, tp, model.norm_eps)
        # GPT-2's gelu_new is the tanh approximation of GELU.
        self.approximate = "tanh" if model.activation == "gelu_new" else "none"
        self.mlp_up = ColumnParallelLinear(column_shard(tp, seed, layer, "mlp_up", (f, h)), tp)
        self.mlp_down = RowParallelLinear(row_shard(tp, seed, layer, "mlp_down", (h, f), out_std), tp)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self._attention(self.ln1(hidden))
        up = self.mlp_up(self.ln2(hidden))
        return hidden + self.mlp_down(functional.gelu(up, approximate=self.approximate))

    def _attention(self, normed: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(normed)  # the whole sequence, also under sequence parallelism
        batch, seq, _ = qkv.shape
        q, k, v = qkv.view(batch, seq, 3, self.local_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        context = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.attn_out(context.transpose(1, 2).reshape(batch, seq, self.local_heads * self.head_dim))


class Head(nn.Module):
    """Final LayerNorm (whole on every TP rank) and the untied LM head (vocab-parallel when tensor > 1)."""

    def __init__(self, model: ModelConfig, seed: int, tp: TensorParallel) -> None:
        super().__init__()
        layer = model.layers + 1
        self.ln_f = _layer_norm(model.hidden_size, tp, model.norm_eps)
        self.lm_head = VocabParallelHead(model.vocab_size, model.hidden_size, tp, seed, layer, "lm_head")

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(hidden))


def layer_specs(model: ModelConfig, seed: int, tp: TensorParallel) -> list[LayerSpec]:
    """The pipeline's layers in order; DeepSpeed builds only those of this rank's stage."""
    if model.architecture == "llama":
        return llama.layer_specs(model, seed, tp)
    blocks = [LayerSpec(TransformerBlock, model, seed, layer, tp) for layer in range(1, model.layers + 1)]
    return [LayerSpec(Embedding, model, seed, tp), *blocks, LayerSpec(Head, model, seed, tp)]


def block_type(model: ModelConfig) -> type[nn.Module]:
    """The class of the model's transformer blocks: what the stages share out and what is recomputed."""
    return llama.LlamaBlock if model.architecture == "llama" else TransformerBlock


class GPTPipeline(PipelineModule):  # type: ignore[misc]
    """The GPT as a PipelineModule whose tensor-parallel group is DeepSpeed's own.

    PipelineModule builds a PipelineParallelGrid over the topology, with a process group for every axis, the
    model (tensor) axis included (its "slice" group), before it builds this stage's layers. `_build` hands
    the layers that group, so the trainer creates no process group of its own.
    """

    def __init__(
        self,
        model: ModelConfig,
        seed: int,
        topology: ProcessTopology,
        sequence_parallel: bool = False,
        pretrained: Path | None = None,
    ) -> None:
        self.gpt_shape = (model, seed)
        self.sequence_parallel = sequence_parallel
        self.pretrained = pretrained
        # Partitioning reads only the layer types; the layers themselves are built in `_build`.
        placeholder = TensorParallel(rank=0, size=topology.get_dim("model"))
        block = block_type(model).__name__
        super().__init__(
            layers=layer_specs(model, seed, placeholder),
            topology=topology,
            loss_fn=LanguageModelLoss(model.vocab_size, placeholder),
            partition_method=f"type:{block}",
            activation_checkpoint_interval=model.activation_checkpoint_interval,
            # Only blocks are recomputed: DeepSpeed's reentrant checkpoint gives no gradient to a chunk whose
            # input needs none (the embedding's token ids), and the head is cheap. Chunks count from a stage's
            # first layer.
            checkpointable_layers=[block],
        )

    def _build(self) -> None:
        grid = self._grid
        size = grid.get_slice_parallel_world_size()
        self.tensor_parallel = TensorParallel(
            rank=grid.get_slice_parallel_rank(),
            size=size,
            group=grid.slice_proc_group if size > 1 else None,
            sequence_parallel=self.sequence_parallel,
        )
        model, seed = self.gpt_shape
        self._layer_specs = layer_specs(model, seed, self.tensor_parallel)
        self.loss_fn = LanguageModelLoss(model.vocab_size, self.tensor_parallel)
        if self.pretrained is None:
            super()._build()
            return
        with weights.undrawn():  # every weight is loaded next: drawing them would be thrown away
            super()._build()
        pretrained.load_stage(self, model, self.tensor_parallel, self.pretrained)


def build_pipeline(
    model: ModelConfig,
    seed: int,
    topology: ProcessTopology,
    sequence_parallel: bool = False,
    pretrained: Path | None = None,
) -> GPTPipeline:
    """The model as a PipelineModule; stages get an even share of transformer blocks, with the weights of the
    Hugging Face folder `pretrained` when one is given (else seeded random ones)."""
    return GPTPipeline(model, seed, topology, sequence_parallel, pretrained)
