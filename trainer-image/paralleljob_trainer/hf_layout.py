"""Where each Hugging Face tensor lives in the trainer's layers, and how it is cut across tensor-parallel ranks.

One table (`tensor_table`) names, for every tensor of a LlamaForCausalLM or GPT2LMHeadModel, the pipeline layer
(0 the embedding, 1..l the blocks, l+1 the head or final norm), the key in that layer's state dict, its full
shape under Hugging Face's name, and its `Cut`. The export merges TP shards with `Cut.merge`; a pretrained
start reads each rank's part with `Cut.read` (safetensors' sliced reads), so the two directions cannot
disagree. Cuts: rows (column-parallel outputs), cols (row-parallel inputs), whole (replicated), vocab (rows of
the padded vocabulary, padding zero), qkv (GPT's fused QKV, each rank's q, k and v heads side by side), and
positions (GPT's learned positions: the first sequenceLength rows). GPT-2's Conv1D keeps weights as
[in, out], the transpose of a Linear's: `transposed` marks them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

import torch

from paralleljob_contract.model import padded_vocab_size
from paralleljob_trainer.tensor_parallel import TensorParallel

Kind = Literal["rows", "cols", "whole", "vocab", "qkv", "positions"]


class Slice(Protocol):
    """What safetensors' `get_slice` returns: a shape, and indexing that reads only the indexed part."""

    def get_shape(self) -> list[int]: ...

    def __getitem__(self, index: Any) -> torch.Tensor: ...


@dataclasses.dataclass(frozen=True)
class Cut:
    """How one tensor is split across TP ranks (in the trainer's [out, in] orientation)."""

    kind: Kind
    transposed: bool = False  # Hugging Face stores it [in, out] (GPT-2's Conv1D)

    def merge(self, shards: Sequence[torch.Tensor], vocab: int) -> torch.Tensor:
        """The Hugging Face tensor from every TP rank's shard."""
        if self.kind in ("whole", "positions"):
            merged = shards[0]
        elif self.kind == "cols":
            merged = torch.cat(list(shards), dim=1)
        elif self.kind == "qkv":  # each rank holds (q_r, k_r, v_r); unsharded: q (all heads), k, v
            parts = [shard.chunk(3, dim=0) for shard in shards]
            merged = torch.cat([torch.cat([part[which] for part in parts], dim=0) for which in range(3)], dim=0)
        else:
            merged = torch.cat(list(shards), dim=0)
            merged = merged[:vocab] if self.kind == "vocab" else merged
        return merged.T if self.transposed else merged

    def read(self, source: Slice, tp: TensorParallel, vocab: int, rows: int = 0) -> torch.Tensor:
        """This rank's part of the tensor, reading only that part (`rows`: the positions a GPT keeps)."""
        shape = source.get_shape()
        if self.kind == "whole":
            return self._oriented(source[:])
        if self.kind == "positions":
            return source[:rows]
        if self.kind == "vocab":
            return _vocab_rows(source, tp, vocab, shape[1])
        if self.kind == "qkv":
            return self._qkv(source, tp, shape)
        # rows of ours are the last axis of a transposed tensor; cols of ours are its first.
        along_first = (self.kind == "rows") != self.transposed
        span = tp.span(shape[0] if along_first else shape[1])
        part = source[span.start : span.stop] if along_first else source[:, span.start : span.stop]
        return self._oriented(part)

    def _oriented(self, part: torch.Tensor) -> torch.Tensor:
        return part.T.contiguous() if self.transposed and part.dim() == 2 else part

    def _qkv(self, source: Slice, tp: TensorParallel, shape: list[int]) -> torch.Tensor:
        hidden = shape[-1] // 3
        heads = tp.span(hidden)
        starts = [part * hidden + heads.start for part in range(3)]
        if len(shape) == 1:
            return torch.cat([source[start : start + len(heads)] for start in starts])
        return torch.cat([source[:, start : start + len(heads)] for start in starts], dim=1).T.contiguous()


def _vocab_rows(source: Slice, tp: TensorParallel, vocab: int, hidden: int) -> torch.Tensor:
    """This rank's rows of the padded vocabulary: the real ones read, the padding zero."""
    rows = tp.span(padded_vocab_size(vocab, tp.size))
    real = range(rows.start, min(rows.stop, vocab))
    if tp.size == 1:
        return source[:vocab]
    local = torch.zeros(len(rows), hidden)
    if len(real):
        local[: len(real)] = source[real.start : real.stop]
    return local


@dataclasses.dataclass(frozen=True)
class Entry:
    """One Hugging Face tensor: its name and full shape, the trainer layer and key holding it, its cut."""

    name: str
    shape: tuple[int, ...]
    layer: int
    key: str
    cut: Cut
    # Read from this tensor when the folder has none of its own (GPT-2's head, tied to wte).
    fallback: str | None = None


ROWS, COLS, WHOLE, VOCAB = Cut("rows"), Cut("cols"), Cut("whole"), Cut("vocab")


def _llama_table(model: dict[str, Any], tensor: int) -> list[Entry]:
    layers, vocab, h, f = model["layers"], model["vocab_size"], model["hidden_size"], model["ffn_hidden_size"]
    heads = model["attention_heads"]
    kv = model["kv_heads"] or heads
    d = h // heads
    key_value = ROWS if kv % tensor == 0 else WHOLE  # fewer kv heads than TP ranks: every rank holds them all
    table = [Entry("model.embed_tokens.weight", (vocab, h), 0, "tokens.weight", VOCAB)]
    for layer in range(1, layers + 1):
        name = f"model.layers.{layer - 1}"
        table += [
            Entry(f"{name}.input_layernorm.weight", (h,), layer, "attn_norm.weight", WHOLE),
            Entry(f"{name}.self_attn.q_proj.weight", (heads * d, h), layer, "q.weight", ROWS),
            Entry(f"{name}.self_attn.k_proj.weight", (kv * d, h), layer, "k.weight", key_value),
            Entry(f"{name}.self_attn.v_proj.weight", (kv * d, h), layer, "v.weight", key_value),
            Entry(f"{name}.self_attn.o_proj.weight", (h, heads * d), layer, "o.weight", COLS),
            Entry(f"{name}.post_attention_layernorm.weight", (h,), layer, "mlp_norm.weight", WHOLE),
            Entry(f"{name}.mlp.gate_proj.weight", (f, h), layer, "gate.weight", ROWS),
            Entry(f"{name}.mlp.up_proj.weight", (f, h), layer, "up.weight", ROWS),
            Entry(f"{name}.mlp.down_proj.weight", (h, f), layer, "down.weight", COLS),
        ]
    table.append(Entry("model.norm.weight", (h,), layers + 1, "norm.weight", WHOLE))
    if not model["tie_embeddings"]:
        table.append(Entry("lm_head.weight", (vocab, h), layers + 1, "lm_head.weight", VOCAB))
    return table


def _gpt_table(model: dict[str, Any]) -> list[Entry]:
    layers, vocab, h, f = model["layers"], model["vocab_size"], model["hidden_size"], model["ffn_hidden_size"]
    conv_rows, conv_cols = Cut("rows", transposed=True), Cut("cols", transposed=True)
    table = [
        Entry("transformer.wte.weight", (vocab, h), 0, "tokens.weight", VOCAB),
        Entry("transformer.wpe.weight", (model["sequence_length"], h), 0, "positions.weight", Cut("positions")),
    ]
    for layer in range(1, layers + 1):
        name = f"transformer.h.{layer - 1}"
        table += [
            Entry(f"{name}.ln_1.weight", (h,), layer, "ln1.weight", WHOLE),
            Entry(f"{name}.ln_1.bias", (h,), layer, "ln1.bias", WHOLE),
            Entry(f"{name}.attn.c_attn.weight", (h, 3 * h), layer, "qkv.weight", Cut("qkv", transposed=True)),
            Entry(f"{name}.attn.c_attn.bias", (3 * h,), layer, "qkv.bias", Cut("qkv")),
            Entry(f"{name}.attn.c_proj.weight", (h, h), layer, "attn_out.weight", conv_cols),
            Entry(f"{name}.attn.c_proj.bias", (h,), layer, "attn_out.bias", WHOLE),
            Entry(f"{name}.ln_2.weight", (h,), layer, "ln2.weight", WHOLE),
            Entry(f"{name}.ln_2.bias", (h,), layer, "ln2.bias", WHOLE),
            Entry(f"{name}.mlp.c_fc.weight", (h, f), layer, "mlp_up.weight", conv_rows),
            Entry(f"{name}.mlp.c_fc.bias", (f,), layer, "mlp_up.bias", ROWS),
            Entry(f"{name}.mlp.c_proj.weight", (f, h), layer, "mlp_down.weight", conv_cols),
            Entry(f"{name}.mlp.c_proj.bias", (h,), layer, "mlp_down.bias", WHOLE),
        ]
    return [
        *table,
        Entry("transformer.ln_f.weight", (h,), layers + 1, "ln_f.weight", WHOLE),
        Entry("transformer.ln_f.bias", (h,), layers + 1, "ln_f.bias", WHOLE),
        Entry("lm_head.weight", (vocab, h), layers + 1, "lm_head.weight", VOCAB, fallback="transformer.wte.weight"),
    ]


def tensor_table(model: dict[str, Any], tensor: int) -> list[Entry]:
    """Every Hugging Face tensor of `model` (a manifest's model section) at TP size `tensor`."""
    if model.get("architecture", "gpt") == "llama":
        return _llama_table(model, tensor)
    return _gpt_table(model)


def merged(
    model: dict[str, Any], load: Callable[[int], list[dict[str, torch.Tensor]]], tensor: int
) -> dict[str, torch.Tensor]:
    """The unsharded, unpadded tensors under Hugging Face's names; `load(layer)` gives every TP rank's state
    dict of that pipeline layer, and is called once per layer."""
    out: dict[str, torch.Tensor] = {}
    shards: dict[int, list[dict[str, torch.Tensor]]] = {}
    for entry in tensor_table(model, tensor):
        if entry.layer not in shards:
            shards = {entry.layer: load(entry.layer)}  # the table is in layer order: keep one layer at a time
        out[entry.name] = entry.cut.merge([shard[entry.key] for shard in shards[entry.layer]], model["vocab_size"])
    return out
