"""How one tensor is cut over tensor-parallel ranks: merged whole, read in part, or re-cut for another TP size.

A `Cut` is a kind and an orientation; which tensor has which cut is `hf_layout`'s table, the only one. Kinds:
rows (column-parallel outputs), cols (row-parallel inputs), whole (replicated), vocab (rows of the padded
vocabulary, padding zero), qkv (GPT's fused QKV, each rank's q, k and v heads side by side) and positions
(GPT's learned positions: the first sequenceLength rows, replicated). GPT-2's Conv1D keeps weights as
[in, out], the transpose of a Linear's: `transposed` marks them (it matters only on the Hugging Face side).

Three uses: the export merges every TP rank's slice into the Hugging Face tensor (`Cut.merge`); a pretrained
start reads this rank's part of a Hugging Face tensor (`Cut.read`); a resume at another TP size copies into each
new slice only the blocks of the saved slices that overlap it (`recut_plan`, `assemble`), so a rank never
builds a whole tensor and reads no saved slice it has no rows or columns of.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

import torch

from paralleljob_contract.model import padded_vocab_size
from paralleljob_trainer.tensor_parallel import TensorParallel

Kind = Literal["rows", "cols", "whole", "vocab", "qkv", "positions"]
Segment = tuple[int, int, int]  # [start, stop) of the whole tensor along the cut axis, held from local index


class CutError(RuntimeError):
    """A tensor the table does not know: the message names it."""


class Slice(Protocol):
    """What safetensors' `get_slice` returns: a shape, and indexing that reads only the indexed part."""

    def get_shape(self) -> list[int]: ...

    def __getitem__(self, index: Any) -> torch.Tensor: ...


@dataclasses.dataclass(frozen=True)
class Copy:
    """One block of a re-cut: `src` of saved TP rank `source`'s slice goes to `dst` of the new slice, along `axis`."""

    source: int
    axis: int
    src: slice
    dst: slice


@dataclasses.dataclass(frozen=True)
class Cut:
    """How one tensor is split across TP ranks (in the trainer's [out, in] orientation)."""

    kind: Kind
    transposed: bool = False  # Hugging Face stores it [in, out] (GPT-2's Conv1D)

    @property
    def replicated(self) -> bool:
        return self.kind in ("whole", "positions")

    def merge(self, shards: Sequence[torch.Tensor], vocab: int) -> torch.Tensor:
        """The Hugging Face tensor from every TP rank's shard."""
        if self.replicated:
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

    def axis(self) -> int | None:
        """The trainer-side axis the tensor is cut along; None when every rank holds it whole."""
        return None if self.replicated else 1 if self.kind == "cols" else 0

    def whole_length(self, local: int, tensor: int, vocab: int) -> int:
        """The whole tensor's length along the cut axis, from a slice's `local` length at TP `tensor`."""
        if self.replicated:
            return local
        return vocab if self.kind == "vocab" else local * tensor

    def local_length(self, length: int, tensor: int) -> int:
        """A slice's length along the cut axis at TP `tensor`, the whole tensor's being `length` (vocab unpadded)."""
        if self.replicated:
            return length
        return (padded_vocab_size(length, tensor) if self.kind == "vocab" else length) // tensor

    def segments(self, length: int, tensor: int, rank: int) -> list[Segment]:
        """The parts of the whole tensor (`length` along the cut axis; the vocabulary unpadded) that TP rank `rank`
        of `tensor` holds, and where each starts in its slice."""
        if self.replicated:
            return [(0, length, 0)]
        if self.kind == "vocab":
            share = padded_vocab_size(length, tensor) // tensor
            start, stop = rank * share, min((rank + 1) * share, length)
            return [(start, stop, 0)] if start < stop else []  # past the vocabulary: padding rows, zero
        if self.kind == "qkv":
            third = length // 3
            share = third // tensor
            return [
                (which * third + rank * share, which * third + (rank + 1) * share, which * share) for which in range(3)
            ]
        share = length // tensor
        return [(rank * share, (rank + 1) * share, 0)]


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


def shared_axis(old: Cut, new: Cut) -> int:
    """The axis a re-cut from `old` to `new` copies blocks along (a tensor's cut changes only between replicated
    and one axis: llama's K and V); 0 when both are replicated."""
    for axis in (new.axis(), old.axis()):
        if axis is not None:
            return axis
    return 0


def recut_plan(old: Cut, new: Cut, length: int, old_tp: int, new_tp: TensorParallel) -> list[Copy]:
    """The blocks of the slices saved at TP `old_tp` that make `new_tp`'s slice, `length` being the whole tensor's
    along the cut axis. A replicated saved tensor is read from one saved rank, the one holding this rank's first
    rows of the other tensors, so a rank opens as few saved ranks' files as its slice needs."""
    axis = shared_axis(old, new)
    first = min(old_tp - 1, new_tp.rank * old_tp // new_tp.size)
    sources = [first] if old.replicated else list(range(old_tp))
    plan = []
    for new_start, new_stop, new_local in new.segments(length, new_tp.size, new_tp.rank):
        for source in sources:
            for old_start, old_stop, old_local in old.segments(length, old_tp, source):
                start, stop = max(new_start, old_start), min(new_stop, old_stop)
                if start < stop:
                    src = slice(old_local + start - old_start, old_local + stop - old_start)
                    dst = slice(new_local + start - new_start, new_local + stop - new_start)
                    plan.append(Copy(source, axis, src, dst))
    return plan


def assemble(
    plan: Sequence[Copy], shape: Sequence[int], read: Callable[[int], torch.Tensor], dtype: torch.dtype
) -> torch.Tensor:
    """The new slice (of `shape`) from `plan`, `read(source)` giving saved rank `source`'s slice, in that slice's
    dtype (`dtype` when no block reads one: a slice of padding rows only). See `assemble_into`."""
    out = torch.empty(tuple(shape), dtype=read(plan[0].source).dtype if plan else dtype)
    return assemble_into(plan, out, read)


def assemble_into(plan: Sequence[Copy], out: torch.Tensor, read: Callable[[int], torch.Tensor]) -> torch.Tensor:
    """Fill `out` (the new slice, or a view of a larger buffer where it lives) from `plan`; what no block covers (the
    vocabulary's padding) is set to zero. Only the blocks are copied, each element written once: from a
    memory-mapped file only their pages are read, and a fresh `out` is never zeroed first."""
    if not plan:
        return out.zero_()
    axis, filled = plan[0].axis, 0
    for copy in sorted(plan, key=lambda block: block.dst.start):
        if copy.dst.start > filled:
            out.narrow(axis, filled, copy.dst.start - filled).zero_()
        block = read(copy.source).narrow(copy.axis, copy.src.start, copy.src.stop - copy.src.start)
        out.narrow(copy.axis, copy.dst.start, copy.dst.stop - copy.dst.start).copy_(block)
        filled = max(filled, copy.dst.stop)
    if filled < out.shape[axis]:
        out.narrow(axis, filled, out.shape[axis] - filled).zero_()
    return out
