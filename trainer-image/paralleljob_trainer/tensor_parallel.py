"""Megatron-style tensor parallelism: the two communication operators and the column/row-parallel linears.

`copy_to_tensor_parallel` (identity forward, all-reduce backward) enters a parallel region and
`reduce_from_tensor_parallel` (all-reduce forward, identity backward) leaves it, so one transformer block costs
two all-reduces forward and two backward. Weights are created full-size from a per-layer seed and then sliced
(see `weights`), which makes a sharded model start from exactly the weights of the unsharded one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.nn import functional

# Set on parameters every tensor-parallel rank holds whole (LayerNorms, row-parallel biases, embeddings, head).
REPLICATED = "tensor_parallel_replicated"


@dataclasses.dataclass(frozen=True)
class TensorParallel:
    """This rank's place in its tensor-parallel group; `group` is None when the group has one rank."""

    rank: int
    size: int
    group: Any = None

    def shard(self, full: torch.Tensor, dim: int) -> torch.Tensor:
        """This rank's contiguous slice of `full` along `dim`."""
        return full.chunk(self.size, dim=dim)[self.rank].contiguous()


SINGLE = TensorParallel(rank=0, size=1)


class _CopyToTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
        ctx.tp = tp
        return tensor

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_reduce(grad, ctx.tp), None


class _ReduceFromTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
        return _all_reduce(tensor, tp)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def _all_reduce(tensor: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    if tp.size == 1:
        return tensor
    tensor = tensor.contiguous().clone()
    dist.all_reduce(tensor, group=tp.group)
    return tensor


def copy_to_tensor_parallel(tensor: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """Enter a parallel region: every rank sees the same input; gradients from all ranks are summed."""
    return _CopyToTensorParallel.apply(tensor, tp)


def reduce_from_tensor_parallel(tensor: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """Leave a parallel region: partial results of all ranks are summed."""
    return _ReduceFromTensorParallel.apply(tensor, tp)


def mark_sharded(parameter: torch.Tensor) -> torch.Tensor:
    """Count this shard in the gradient norm on every tensor-parallel rank (see `mark_replicated`)."""
    parameter.model_parallel = True  # type: ignore[attr-defined]
    return parameter


def mark_replicated(parameter: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """Count a parameter that every tensor-parallel rank holds whole exactly once in the gradient norm.

    DeepSpeed's `clip_grad_norm_` counts a gradient when the rank is rank 0 of the whole model-parallel slice
    (pipe x model) or when `param.model_parallel` is set. Left unmarked, replicated parameters of every stage
    after the first would be dropped from the norm; marked on all TP ranks they would be counted TP times.
    """
    parameter.model_parallel = tp.rank == 0  # type: ignore[attr-defined]
    setattr(parameter, REPLICATED, True)
    return parameter


def is_replicated(parameter: torch.Tensor) -> bool:
    return bool(getattr(parameter, REPLICATED, False))


def average_over_tensor_parallel(tensors: list[torch.Tensor], tp: TensorParallel) -> None:
    """Replace each tensor, in place, by its mean over the TP group: one all-reduce per dtype.

    Used on the gradients of replicated parameters. Every TP rank computes them from the same inputs, but
    non-deterministic GPU kernels (atomics in LayerNorm and embedding backward) can make the copies differ
    in the last bits, and then the replicas' weights would drift apart step after step.
    """
    if tp.size == 1:
        return
    for dtype in sorted({t.dtype for t in tensors}, key=str):
        same = [t for t in tensors if t.dtype == dtype]
        flat = _flatten_dense_tensors(same)
        dist.all_reduce(flat, group=tp.group)
        flat.div_(tp.size)
        for tensor, mean in zip(same, _unflatten_dense_tensors(flat, same), strict=True):
            tensor.copy_(mean)


class ColumnParallelLinear(nn.Module):
    """y = x W^T + b with W split by output rows; the output stays split across the group."""

    def __init__(self, full_weight: torch.Tensor, tp: TensorParallel) -> None:
        super().__init__()
        self.tp = tp
        self.weight = mark_sharded(nn.Parameter(tp.shard(full_weight, dim=0)))
        self.bias = mark_sharded(nn.Parameter(torch.zeros(self.weight.shape[0])))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return functional.linear(copy_to_tensor_parallel(inputs, self.tp), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """y = x W^T + b with W split by input columns; partial products are summed, then the bias is added."""

    def __init__(self, full_weight: torch.Tensor, tp: TensorParallel) -> None:
        super().__init__()
        self.tp = tp
        self.weight = mark_sharded(nn.Parameter(tp.shard(full_weight, dim=1)))
        self.bias = mark_replicated(nn.Parameter(torch.zeros(full_weight.shape[0])), tp)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        partial = functional.linear(inputs, self.weight)
        return reduce_from_tensor_parallel(partial, self.tp) + self.bias
