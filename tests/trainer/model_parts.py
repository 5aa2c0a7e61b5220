"""The trainer's pipeline layers built in one process for any TP rank, without process groups.

Building a layer needs no communication, so every TP rank's shard of every layer can be built here and its
state dict handed to the export's merge (`paralleljob_trainer.export.merged_tensors`) exactly as the layer
files of a checkpoint would be. At TP 1 the layers also run forward here, as the trainer's own model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from paralleljob_contract.jobfile import ModelConfig
from paralleljob_trainer import llama
from paralleljob_trainer import model as gpt
from paralleljob_trainer.tensor_parallel import SINGLE, TensorParallel


def layer_modules(model: ModelConfig, seed: int, tp: TensorParallel) -> list[nn.Module]:
    """The layers DeepSpeed would build for `tp`, in pipeline order, tied head left out (it is the embedding)."""
    if model.architecture == "llama":
        blocks: list[nn.Module] = [llama.LlamaBlock(model, seed, layer, tp) for layer in range(1, model.layers + 1)]
        embedding: nn.Module = llama.LlamaEmbedding(model, seed, tp)
        last: nn.Module = llama.FinalNorm(model, seed, tp) if model.tie_embeddings else llama.LlamaHead(model, seed, tp)
        return [embedding, *blocks, last]
    blocks = [gpt.TransformerBlock(model, seed, layer, tp) for layer in range(1, model.layers + 1)]
    return [gpt.Embedding(model, seed, tp), *blocks, gpt.Head(model, seed, tp)]


def manifest_model(model: ModelConfig) -> dict[str, Any]:
    """The model section a checkpoint's manifest records."""
    return {k: v for k, v in dataclasses.asdict(model).items() if k != "activation_checkpoint_interval"}


def shard_loader(model: ModelConfig, seed: int, tensor: int) -> Callable[[int], list[dict[str, torch.Tensor]]]:
    """`load(layer)` over the state dicts every TP rank of a `tensor`-wide layout would save."""
    ranks = [layer_modules(model, seed, TensorParallel(rank=rank, size=tensor)) for rank in range(tensor)]
    return lambda layer: [{k: v.detach() for k, v in modules[layer].state_dict().items()} for modules in ranks]


def trainer_logits(modules: list[nn.Module], model: ModelConfig, tokens: torch.Tensor) -> torch.Tensor:
    """The logits of TP-1 layers: embedding, blocks, head (or the tied embedding's head)."""
    hidden = modules[0](tokens)
    for block in modules[1:-1]:
        hidden = block(hidden)
    hidden = modules[-1](hidden)
    if model.architecture == "llama" and model.tie_embeddings:
        return llama.tied_logits(modules[0], hidden)  # type: ignore[arg-type]
    return hidden


def single(model: ModelConfig, seed: int) -> list[nn.Module]:
    return layer_modules(model, seed, SINGLE)
