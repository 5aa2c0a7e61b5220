"""Vocab-parallel token embedding, LM head and cross-entropy (Megatron's), used when tensor > 1.

The vocabulary is padded to a multiple of tensor x 128 (`paralleljob_contract.model.padded_vocab_size`) and
TP rank r holds rows [r Vp/t, (r+1) Vp/t) of the embedding and of the head. The embedding looks up the ids
that fall in its rows, zeroes the others and sums over the TP group. The head produces this rank's columns of
the logits only, and the cross-entropy combines them with three all-reduces of b x s numbers (the max, the
sum of exponentials and the target's logit), so no rank ever holds the full b x s x V logits. Padding rows
start at zero and their logits are masked to -inf, so they take no part in the softmax and get no gradient.
At tensor 1 the same modules hold the whole unpadded vocabulary and the loss is an ordinary cross-entropy.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional

from paralleljob_contract.model import padded_vocab_size
from paralleljob_trainer import weights
from paralleljob_trainer.tensor_parallel import (
    TensorParallel,
    all_reduce,
    enter_parallel_region,
    leave_parallel_region,
    mark_replicated,
    mark_sharded,
)


def vocab_rows(vocab_size: int, hidden: int, tp: TensorParallel, seed: int, layer: int, name: str) -> torch.Tensor:
    """This rank's rows of the padded [Vp, h] seeded matrix: real rows drawn, padding rows zero."""
    rows = tp.span(padded_vocab_size(vocab_size, tp.size))
    local = torch.zeros(len(rows), hidden)
    real = range(rows.start, min(rows.stop, vocab_size))
    if len(real):
        local[: len(real)] = weights.normal_slice(seed, layer, name, (vocab_size, hidden), real)
    return local


def _mark(parameter: nn.Parameter, tp: TensorParallel) -> nn.Parameter:
    return mark_sharded(parameter) if tp.size > 1 else mark_replicated(parameter, tp)


class VocabParallelEmbedding(nn.Module):
    """The token embedding; TP rank r holds its rows of the padded vocabulary."""

    def __init__(self, vocab_size: int, hidden: int, tp: TensorParallel, seed: int, layer: int, name: str) -> None:
        super().__init__()
        self.tp = tp
        self.rows = tp.span(padded_vocab_size(vocab_size, tp.size))
        self.weight = _mark(nn.Parameter(vocab_rows(vocab_size, hidden, tp, seed, layer, name)), tp)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return functional.embedding(tokens, self.weight)
        outside = (tokens < self.rows.start) | (tokens >= self.rows.stop)
        local = (tokens - self.rows.start).masked_fill(outside, 0)
        found = functional.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return leave_parallel_region(found, self.tp)  # under sequence parallelism: this rank's sequence shard


def vocab_parallel_logits(hidden: torch.Tensor, head_weight: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """This rank's columns of the logits (b x s x Vp/t) for the whole sequence; the input's gradient is summed
    over TP (and, under sequence parallelism, the sequence gathered first)."""
    return functional.linear(enter_parallel_region(hidden, tp), head_weight)


class VocabParallelHead(nn.Module):
    """The untied LM head; TP rank r holds its rows of the padded vocabulary."""

    def __init__(self, vocab_size: int, hidden: int, tp: TensorParallel, seed: int, layer: int, name: str) -> None:
        super().__init__()
        self.tp = tp
        self.weight = _mark(nn.Parameter(vocab_rows(vocab_size, hidden, tp, seed, layer, name)), tp)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_logits(hidden, self.weight, self.tp)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token loss log(sum_j exp(z_j)) - z_target over logits split by columns across the TP group."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, labels: torch.Tensor, tp: TensorParallel, vocab: int) -> torch.Tensor:
        rows = tp.span(local.shape[-1] * tp.size)
        logits = local.float()
        if rows.stop > vocab:  # padding columns: out of the softmax
            logits = logits.clone()
            logits[..., max(0, vocab - rows.start) :] = float("-inf")
        shifted = logits - all_reduce(logits.max(dim=-1).values, tp, dist.ReduceOp.MAX).unsqueeze(-1)
        outside = (labels < rows.start) | (labels >= rows.stop)
        local_labels = (labels - rows.start).masked_fill(outside, 0)
        target = shifted.gather(-1, local_labels.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        target = all_reduce(target, tp)
        exp = shifted.exp()
        sum_exp = all_reduce(exp.sum(dim=-1), tp)
        softmax = exp.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, local_labels, outside)
        ctx.input_dtype = local.dtype
        return sum_exp.log() - target

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        softmax, local_labels, outside = ctx.saved_tensors
        grad_logits = softmax
        one_hot = (~outside).to(softmax.dtype).unsqueeze(-1)
        grad_logits.scatter_add_(-1, local_labels.unsqueeze(-1), -one_hot)
        grad_logits.mul_(grad.unsqueeze(-1))
        return grad_logits.to(ctx.input_dtype), None, None, None


def vocab_parallel_cross_entropy(
    local_logits: torch.Tensor, labels: torch.Tensor, tp: TensorParallel, vocab_size: int
) -> torch.Tensor:
    """Mean next-token cross-entropy of one micro-batch from this rank's logit columns, in float32."""
    if tp.size == 1:
        return functional.cross_entropy(local_logits.float().reshape(-1, vocab_size), labels.reshape(-1))
    return _VocabParallelCrossEntropy.apply(local_logits, labels, tp, vocab_size).mean()  # type: ignore[no-untyped-call]  # torch leaves apply untyped


class LanguageModelLoss:
    """The pipeline's loss function; `tp` is set once DeepSpeed's grid exists (`model.GPTPipeline._build`)."""

    def __init__(self, vocab_size: int, tp: TensorParallel) -> None:
        self.vocab_size = vocab_size
        self.tp = tp

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_cross_entropy(logits, labels, self.tp, self.vocab_size)
