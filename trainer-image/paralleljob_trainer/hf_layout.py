"""Where each Hugging Face tensor lives in the trainer's layers, and how it is cut across tensor-parallel ranks.

One table (`tensor_table`) names, for every tensor of a LlamaForCausalLM or GPT2LMHeadModel, the pipeline layer
(0 the embedding, 1..l the blocks, l+1 the head or final norm), the key in that layer's state dict, its full
shape under Hugging Face's name, and its `cuts.Cut` (the kinds are described there). It is the only table of
cuts: the export merges TP shards with `Cut.merge`; a pretrained start reads each rank's part with `Cut.read`
(safetensors' sliced reads); a resume at another TP size looks each trainer tensor's cut up by its key
(`cut_of`) and re-cuts it with `cuts.recut_plan`. So no two directions can disagree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch

from paralleljob_trainer import cuts


@dataclasses.dataclass(frozen=True)
class Entry:
    """One Hugging Face tensor: its name and full shape, the trainer layer and key holding it, its cut."""

    name: str
    shape: tuple[int, ...]
    layer: int
    key: str
    cut: cuts.Cut
    # Read from this tensor when the folder has none of its own (GPT-2's head, tied to wte).
    fallback: str | None = None


ROWS, COLS, WHOLE, VOCAB = cuts.Cut("rows"), cuts.Cut("cols"), cuts.Cut("whole"), cuts.Cut("vocab")


def _llama_table(model: Mapping[str, Any], tensor: int) -> list[Entry]:
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


def _gpt_table(model: Mapping[str, Any]) -> list[Entry]:
    layers, vocab, h, f = model["layers"], model["vocab_size"], model["hidden_size"], model["ffn_hidden_size"]
    conv_rows, conv_cols = cuts.Cut("rows", transposed=True), cuts.Cut("cols", transposed=True)
    table = [
        Entry("transformer.wte.weight", (vocab, h), 0, "tokens.weight", VOCAB),
        Entry("transformer.wpe.weight", (model["sequence_length"], h), 0, "positions.weight", cuts.Cut("positions")),
    ]
    for layer in range(1, layers + 1):
        name = f"transformer.h.{layer - 1}"
        table += [
            Entry(f"{name}.ln_1.weight", (h,), layer, "ln1.weight", WHOLE),
            Entry(f"{name}.ln_1.bias", (h,), layer, "ln1.bias", WHOLE),
            Entry(f"{name}.attn.c_attn.weight", (h, 3 * h), layer, "qkv.weight", cuts.Cut("qkv", transposed=True)),
            Entry(f"{name}.attn.c_attn.bias", (3 * h,), layer, "qkv.bias", cuts.Cut("qkv")),
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


def tensor_table(model: Mapping[str, Any], tensor: int) -> list[Entry]:
    """Every Hugging Face tensor of `model` (a manifest's model section) at TP size `tensor`."""
    if model.get("architecture", "gpt") == "llama":
        return _llama_table(model, tensor)
    return _gpt_table(model)


def cut_of(model: Mapping[str, Any], key: str, tensor: int) -> cuts.Cut:
    """How the tensor `key` of a trainer layer's state dict is cut at TP `tensor` (alike in every layer)."""
    found = {entry.key: entry.cut for entry in tensor_table({**model, "layers": 1}, tensor)}.get(key)
    if found is None:
        raise cuts.CutError(f"tensor {key!r} has no known tensor-parallel cut")
    return found


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
