"""Megatron-style tensor parallelism: the communication operators and the column/row-parallel linears.

`copy_to_tensor_parallel` (identity forward, all-reduce backward) enters a parallel region and
`reduce_from_tensor_parallel` (all-reduce forward, identity backward) leaves it, so one transformer block costs
two all-reduces forward and two backward. Under sequence parallelism (Megatron-SP) the residual stream
outside the regions holds 1/TP of the sequence: a region is entered by an all-gather of the sequence
(reduce-scatter backward) and left by a reduce-scatter (all-gather backward), the same bytes as the
all-reduces, while norms and their activations shrink by TP. Each rank draws only its own slice of a weight (`column_shard`,
`row_shard`, see `weights`), which is exactly that slice of the unsharded model's weight.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.nn import functional

from paralleljob_trainer import weights
from paralleljob_trainer.compute_timing import CLOCK

# Set on parameters every tensor-parallel rank holds whole (norms, row-parallel biases, positions, replicated
# K/V heads, and at TP 1 the embeddings and head).
REPLICATED = "tensor_parallel_replicated"
# Set, under sequence parallelism, on replicated parameters that see only this rank's sequence shard (norms,
# row-parallel biases, positions): their gradients are summed over the TP group, not averaged.
SEQUENCE_PARTIAL = "tensor_parallel_sequence_partial"


@dataclasses.dataclass(frozen=True)
class TensorParallel:
    """This rank's place in its tensor-parallel group; `group` is None when the group has one rank."""

    rank: int
    size: int
    group: Any = None
    # Megatron-SP: outside the parallel regions each rank holds 1/size of the sequence.
    sequence_parallel: bool = False

    def span(self, length: int) -> range:
        """This rank's contiguous share of `length` items (rows, columns, heads)."""
        share = length // self.size
        return range(self.rank * share, (self.rank + 1) * share)


SINGLE = TensorParallel(rank=0, size=1)
# A tensor or a parameter: marking it keeps its type.
TensorT = TypeVar("TensorT", bound=torch.Tensor)


class _CopyToTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
        ctx.tp = tp
        return tensor

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return all_reduce(grad, ctx.tp), None


class _ReduceFromTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
        return all_reduce(tensor, tp)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def all_reduce(tensor: torch.Tensor, tp: TensorParallel, op: Any = dist.ReduceOp.SUM) -> torch.Tensor:
    """`op` (a sum unless told) of `tensor` over the TP group, in a new tensor: autograd may still need the input."""
    if tp.size == 1:
        return tensor
    tensor = tensor.contiguous().clone()
    with CLOCK.blocked():  # waiting on the TP group is not this rank's compute
        dist.all_reduce(tensor, op=op, group=tp.group)
    return tensor


def copy_to_tensor_parallel(tensor: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """Enter a parallel region: every rank sees the same input; gradients from all ranks are summed."""
    return _CopyToTensorParallel.apply(tensor, tp)  # type: ignore[no-untyped-call]  # torch leaves apply untyped


def reduce_from_tensor_parallel(tensor: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """Leave a parallel region: partial results of all ranks are summed."""
    return _ReduceFromTensorParallel.apply(tensor, tp)  # type: ignore[no-untyped-call]  # torch leaves apply untyped


def _gather_sequence(tensor: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    parts = [torch.empty_like(tensor) for _ in range(tp.size)]
    with CLOCK.blocked():
        dist.all_gather(parts, tensor.contiguous(), group=tp.group)
    return torch.cat(parts, dim=1)


def _reduce_scatter_sequence(tensor: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    if dist.get_backend(tp.group) == "nccl":
        sequence_first = tensor.transpose(0, 1).contiguous()
        shape = (sequence_first.shape[0] // tp.size, *sequence_first.shape[1:])
        out = torch.empty(shape, dtype=tensor.dtype, device=tensor.device)
        with CLOCK.blocked():
            dist.reduce_scatter_tensor(out, sequence_first, group=tp.group)
        return out.transpose(0, 1).contiguous()
    # gloo has no reduce-scatter: all-reduce and keep this rank's shard (same numbers, more bytes).
    return all_reduce(tensor, tp).chunk(tp.size, dim=1)[tp.rank].contiguous()


class _GatherFromSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
        ctx.tp = tp
        return _gather_sequence(tensor, tp)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _reduce_scatter_sequence(grad, ctx.tp), None


class _ReduceScatterToSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
        ctx.tp = tp
        return _reduce_scatter_sequence(tensor, tp)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _gather_sequence(grad, ctx.tp), None


def enter_parallel_region(tensor: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """In front of column-parallel work: copy-to-TP, or under sequence parallelism all-gather the sequence
    (its backward reduce-scatters the summed input gradient)."""
    if tp.sequence_parallel and tp.size > 1:
        return _GatherFromSequence.apply(tensor, tp)  # type: ignore[no-untyped-call]  # torch leaves apply untyped
    return copy_to_tensor_parallel(tensor, tp)


def leave_parallel_region(tensor: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """Behind row-parallel work: sum the partial results, or under sequence parallelism reduce-scatter them
    to this rank's sequence shard (its backward all-gathers the gradient)."""
    if tp.sequence_parallel and tp.size > 1:
        return _ReduceScatterToSequence.apply(tensor, tp)  # type: ignore[no-untyped-call]  # torch leaves apply untyped
    return reduce_from_tensor_parallel(tensor, tp)


def mark_sharded(parameter: TensorT) -> TensorT:
    """Count this shard in the gradient norm on every tensor-parallel rank (see `mark_replicated`)."""
    parameter.model_parallel = True  # type: ignore[attr-defined]
    return parameter


def mark_replicated(parameter: TensorT, tp: TensorParallel, sequence_partial: bool = True) -> TensorT:
    """Count a parameter that every tensor-parallel rank holds whole exactly once in the gradient norm.

    DeepSpeed's `clip_grad_norm_` counts a gradient when the rank is rank 0 of the whole model-parallel slice
    (pipe x model) or when `param.model_parallel` is set. Left unmarked, replicated parameters of every stage
    after the first would be dropped from the norm; marked on all TP ranks they would be counted TP times.
    Under sequence parallelism a parameter applied to the sequence shard (`sequence_partial`) gets only this
    rank's share of its gradient; `is_sequence_partial` tells the step to sum those over TP.
    """
    parameter.model_parallel = tp.rank == 0  # type: ignore[attr-defined]
    setattr(parameter, REPLICATED, True)
    setattr(parameter, SEQUENCE_PARTIAL, tp.sequence_parallel and tp.size > 1 and sequence_partial)
    return parameter


def is_replicated(parameter: torch.Tensor) -> bool:
    return bool(getattr(parameter, REPLICATED, False))


def is_sequence_partial(parameter: torch.Tensor) -> bool:
    return bool(getattr(parameter, SEQUENCE_PARTIAL, False))


def average_over_tensor_parallel(tensors: list[torch.Tensor], tp: TensorParallel, mean: bool = True) -> None:
    """Replace each tensor, in place, by its mean (or, `mean` False, its sum) over the TP group: one
    all-reduce per dtype.

    Used on the gradients of replicated parameters. Every TP rank computes them from the same inputs, but
    non-deterministic GPU kernels (atomics in LayerNorm and embedding backward) can make the copies differ
    in the last bits, and then the replicas' weights would drift apart step after step.
    """
    if tp.size == 1:
        return
    for dtype in sorted({t.dtype for t in tensors}, key=str):
        same = [t for t in tensors if t.dtype == dtype]
        flat = _flatten_dense_tensors(same)
        with CLOCK.blocked():
            dist.all_reduce(flat, group=tp.group)
        if mean:
            flat.div_(tp.size)
        for tensor, reduced in zip(same, _unflatten_dense_tensors(flat, same), strict=True):
            tensor.copy_(reduced)


def column_shard(
    tp: TensorParallel, seed: int, layer: int, name: str, shape: tuple[int, int], std: float = weights.INIT_STD
) -> torch.Tensor:
    """This rank's rows of the seeded `shape` weight (a column-parallel linear's output features)."""
    return weights.normal_slice(seed, layer, name, shape, tp.span(shape[0]), std=std)


def row_shard(
    tp: TensorParallel, seed: int, layer: int, name: str, shape: tuple[int, int], std: float = weights.INIT_STD
) -> torch.Tensor:
    """This rank's columns of the seeded `shape` weight (a row-parallel linear's input features)."""
    return weights.normal_slice(seed, layer, name, shape, range(shape[0]), tp.span(shape[1]), std=std)


class ColumnParallelLinear(nn.Module):
    """y = x W^T + b with W split by output rows (`local_weight` is this rank's); the output stays split."""

    def __init__(self, local_weight: torch.Tensor, tp: TensorParallel, bias: bool = True) -> None:
        super().__init__()
        self.tp = tp
        self.weight = mark_sharded(nn.Parameter(local_weight))
        self.bias = mark_sharded(nn.Parameter(torch.zeros(local_weight.shape[0]))) if bias else None

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return functional.linear(enter_parallel_region(inputs, self.tp), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """y = x W^T + b with W split by input columns (`local_weight` is this rank's); partial products are summed,
    then the (replicated) bias is added."""

    def __init__(self, local_weight: torch.Tensor, tp: TensorParallel, bias: bool = True) -> None:
        super().__init__()
        self.tp = tp
        self.weight = mark_sharded(nn.Parameter(local_weight))
        self.bias = mark_replicated(nn.Parameter(torch.zeros(local_weight.shape[0])), tp) if bias else None

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        partial = functional.linear(inputs, self.weight)
        reduced = leave_parallel_region(partial, self.tp)
        return reduced if self.bias is None else reduced + self.bias
