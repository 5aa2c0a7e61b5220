"""How each tensor of a pipeline layer is cut over tensor-parallel ranks: merge the slices, cut them again.

One table for the export (which merges a checkpoint's TP slices into whole tensors) and the re-cut on resume
(which merges them and cuts the whole tensors for another TP size). A layer's tensors are named as in its
state dict (`qkv.weight`, `o.weight`, ...), the same names for weights and for the optimizer's per-element
state (AdamW's moments), which is cut exactly like the weight it belongs to:

- rows: column-parallel weights and biases (each rank holds some output features);
- columns: row-parallel weights (each rank holds some input features);
- whole: replicated tensors (norms, row-parallel biases, positions, K and V when TP exceeds the KV heads);
- vocab: the vocab-parallel embedding and head, rows padded to `padded_vocab_size` (padding rows zero);
- grouped QKV: GPT's fused QKV, whose rank r holds (q_r, k_r, v_r), while the whole tensor is (q, k, v).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from paralleljob_contract.model import padded_vocab_size


class Cut(enum.Enum):
    ROWS = "rows"
    COLUMNS = "columns"
    WHOLE = "whole"
    VOCAB = "vocab"
    GROUPED_QKV = "grouped QKV"


class CutError(RuntimeError):
    """A tensor this table does not know: the message names it."""


_CUTS = {
    # GPT
    "tokens.weight": Cut.VOCAB,
    "positions.weight": Cut.WHOLE,
    "qkv.weight": Cut.GROUPED_QKV,
    "qkv.bias": Cut.GROUPED_QKV,
    "attn_out.weight": Cut.COLUMNS,
    "mlp_up.weight": Cut.ROWS,
    "mlp_up.bias": Cut.ROWS,
    "mlp_down.weight": Cut.COLUMNS,
    "lm_head.weight": Cut.VOCAB,
    # llama (k and v: see `cut_of`)
    "q.weight": Cut.ROWS,
    "o.weight": Cut.COLUMNS,
    "gate.weight": Cut.ROWS,
    "up.weight": Cut.ROWS,
    "down.weight": Cut.COLUMNS,
}
_WHOLE = {
    "ln1.weight",
    "ln1.bias",
    "ln2.weight",
    "ln2.bias",
    "ln_f.weight",
    "ln_f.bias",
    "attn_out.bias",
    "mlp_down.bias",
    "attn_norm.weight",
    "mlp_norm.weight",
    "norm.weight",
}


def cut_of(model: Mapping[str, Any], key: str, tensor: int) -> Cut:
    """How the tensor `key` of a layer of `model` (the manifest's model section) is cut at TP `tensor`."""
    if key in ("k.weight", "v.weight"):
        kv = model.get("kv_heads") or model["attention_heads"]
        return Cut.ROWS if kv % tensor == 0 else Cut.WHOLE  # llama.ReplicatedKeyValue holds every KV head
    if key in _WHOLE:
        return Cut.WHOLE
    if key not in _CUTS:
        raise CutError(f"tensor {key!r} has no known tensor-parallel cut")
    return _CUTS[key]


def merge(cut: Cut, parts: Sequence[torch.Tensor], vocab_size: int) -> torch.Tensor:
    """The whole (unpadded) tensor from each TP rank's slice, in TP rank order."""
    if cut is Cut.WHOLE:
        return parts[0]
    if cut is Cut.COLUMNS:
        return torch.cat(list(parts), dim=1)
    if cut is Cut.GROUPED_QKV:
        thirds = [part.chunk(3, dim=0) for part in parts]
        return torch.cat([torch.cat([third[which] for third in thirds], dim=0) for which in range(3)], dim=0)
    rows = torch.cat(list(parts), dim=0)
    return rows[:vocab_size] if cut is Cut.VOCAB else rows


def split(cut: Cut, whole: torch.Tensor, tensor: int, rank: int) -> torch.Tensor:
    """TP rank `rank`'s slice of `whole` at TP `tensor` (a copy, contiguous)."""
    if cut is Cut.WHOLE or (tensor == 1 and cut is not Cut.VOCAB):
        return whole.clone()
    if cut is Cut.COLUMNS:
        return whole.chunk(tensor, dim=1)[rank].clone()
    if cut is Cut.GROUPED_QKV:
        return torch.cat([third.chunk(tensor, dim=0)[rank] for third in whole.chunk(3, dim=0)], dim=0).clone()
    if cut is Cut.VOCAB:
        padded = padded_vocab_size(whole.shape[0], tensor)
        whole = torch.cat([whole, whole.new_zeros(padded - whole.shape[0], *whole.shape[1:])], dim=0)
    return whole.chunk(tensor, dim=0)[rank].clone()
