"""Start from a Hugging Face folder (spec.model.pretrained.path): each rank reads only the slices it holds.

`check_folder` runs on every rank before any process group forms: the folder's safetensors headers (no tensor
data) must hold every tensor `hf_layout`'s table names, at its shape, else one line names the tensor. After
DeepSpeed has built this stage's layers (allocated, no weight drawn: `model.GPTPipeline._build` builds them
inside `weights.undrawn()`), `load_stage` fills each parameter in place with this rank's slice, read through safetensors' `get_slice`, which reads only the
indexed bytes: the peak is the shard plus the largest single slice, never the whole tensor (bench/
trainer_pretrained.py measures it). Files may be one `model.safetensors` or shards listed by
`model.safetensors.index.json`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from paralleljob_contract.errors import ContractError
from paralleljob_contract.jobfile import ModelConfig
from paralleljob_trainer import hf_layout
from paralleljob_trainer.tensor_parallel import TensorParallel

INDEX = "model.safetensors.index.json"
FIELD = "spec.model.pretrained.path"
# Bytes of file a block of a column read maps at once (about, at 2 bytes an element).
ROW_BLOCK_BYTES = 32 * 2**20


class PretrainedError(ContractError):
    """The folder cannot be mapped onto the trainer's layers; the message names the file or tensor."""


class TensorFolder:
    """The tensors of a folder's safetensors files by name. Each read opens its file afresh and closes it, so
    the pages a read touched leave the rank's memory with it (a memory-mapped file's pages count as its RSS)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.where = self._names(folder)

    @staticmethod
    def _names(folder: Path) -> dict[str, str]:
        index = folder / INDEX
        if index.exists():
            try:
                return dict(json.loads(index.read_text(encoding="utf-8"))["weight_map"])
            except (OSError, ValueError, KeyError) as error:
                raise PretrainedError(f"{FIELD}: {index} has no readable weight_map: {error}") from None
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise PretrainedError(f"{FIELD}: {folder} holds no *.safetensors file")
        names: dict[str, str] = {}
        for path in files:
            with safe_open(str(path), framework="pt") as handle:
                names |= dict.fromkeys(handle.keys(), path.name)
        return names

    def slice(self, entry: hf_layout.Entry) -> ReopeningSlice:
        """A lazy slice of `entry` (or of its fallback); PretrainedError when the folder has neither."""
        name = entry.name if entry.name in self.where or entry.fallback is None else entry.fallback
        if name not in self.where:
            raise PretrainedError(f"{FIELD}: {self.folder} has no tensor {entry.name}, which the model needs")
        path = self.folder / self.where[name]
        if not path.exists():
            raise PretrainedError(f"{FIELD}: {path}, which {INDEX} names for {name}, does not exist")
        return ReopeningSlice(path, name)


class ReopeningSlice:
    """safetensors' `get_slice` of one tensor, each read in a file opened for it alone. Columns of a matrix
    (a row-parallel weight) are read in blocks of rows, each in its own opening: a column slice touches a
    page of every row, and would otherwise map the whole tensor into the rank's memory."""

    def __init__(self, path: Path, name: str) -> None:
        self.path, self.name = path, name
        with safe_open(str(path), framework="pt") as handle:
            self.shape = list(handle.get_slice(name).get_shape())

    def get_shape(self) -> list[int]:
        return self.shape

    def __getitem__(self, index: Any) -> torch.Tensor:
        if isinstance(index, tuple) and index[0] == slice(None) and len(self.shape) == 2:
            return self._columns(index[1])
        with safe_open(str(self.path), framework="pt") as handle:
            return handle.get_slice(self.name)[index]

    def _columns(self, columns: slice) -> torch.Tensor:
        out: torch.Tensor | None = None
        rows = self.shape[0]
        block = max(1, ROW_BLOCK_BYTES // max(1, self.shape[1] * 2))
        for start in range(0, rows, block):
            with safe_open(str(self.path), framework="pt") as handle:
                part = handle.get_slice(self.name)[start : start + block, columns]
            if out is None:
                out = torch.empty((rows, part.shape[1]), dtype=part.dtype)
            out[start : start + part.shape[0]] = part
            del part
        assert out is not None
        return out


@contextlib.contextmanager
def opened(folder: Path) -> Iterator[TensorFolder]:
    yield TensorFolder(folder)


def _table(model: ModelConfig, tensor: int) -> list[hf_layout.Entry]:
    return hf_layout.tensor_table(dataclasses.asdict(model), tensor)


def _check_shape(entry: hf_layout.Entry, found: list[int]) -> None:
    expected = list(entry.shape)
    if entry.cut.kind == "positions":  # a GPT may use fewer positions than the folder has
        fits = len(found) == 2 and found[1] == expected[1] and found[0] >= expected[0]
    else:
        fits = found == expected
    if not fits:
        raise PretrainedError(f"{FIELD}: tensor {entry.name} has shape {found}, but spec.model needs {expected}")


def check_folder(model: ModelConfig, tensor: int, folder: Path) -> None:
    """Every tensor the layers need is in the folder at its shape (headers only); PretrainedError otherwise."""
    with opened(folder) as tensors:
        for entry in _table(model, tensor):
            _check_shape(entry, tensors.slice(entry).get_shape())


def _layers(module: Any) -> Iterator[tuple[int, nn.Module]]:
    """(pipeline layer, module) of every layer this stage built; the tied head is the embedding (layer 0)."""
    for local, layer in enumerate(module.forward_funcs):
        if isinstance(layer, nn.Module):
            yield local + module._local_start, layer
        elif isinstance(layer, functools.partial) and isinstance(layer.args[0], nn.Module):
            yield 0, layer.args[0]


def load_stage(module: Any, model: ModelConfig, tp: TensorParallel, folder: Path) -> None:
    """Overwrite this stage's parameters (a built PipelineModule's) with this rank's slices of the folder."""
    load_modules(_layers(module), model, tp, folder)


def load_modules(layers: Iterable[tuple[int, nn.Module]], model: ModelConfig, tp: TensorParallel, folder: Path) -> None:
    """Load each (pipeline layer, module) of this rank from the folder; a module met twice is loaded once."""
    by_layer: dict[int, list[hf_layout.Entry]] = {}
    for entry in _table(model, tp.size):
        by_layer.setdefault(entry.layer, []).append(entry)
    done: set[int] = set()
    with opened(folder) as tensors, torch.no_grad():
        for layer, target in layers:
            if id(target) in done:
                continue
            done.add(id(target))
            load_layer(target, by_layer.get(layer, []), tensors, tp, model)


def load_layer(
    target: nn.Module, entries: list[hf_layout.Entry], tensors: TensorFolder, tp: TensorParallel, model: ModelConfig
) -> None:
    """Copy each entry's slice into `target`'s parameter of the same key, one slice in memory at a time. Every
    parameter must have its entry: the stage was built without drawing its weights (`weights.undrawn`)."""
    parameters = dict(target.named_parameters())
    unmapped = sorted(set(parameters) - {entry.key for entry in entries})
    if unmapped:
        raise PretrainedError(f"{FIELD}: no tensor of the folder maps onto {type(target).__name__}.{unmapped[0]}")
    for entry in entries:
        source = tensors.slice(entry)
        _check_shape(entry, source.get_shape())
        value = entry.cut.read(source, tp, model.vocab_size, rows=model.sequence_length)
        parameter = parameters[entry.key]
        if tuple(value.shape) != tuple(parameter.shape):
            raise PretrainedError(
                f"{FIELD}: tensor {entry.name} gives this rank {list(value.shape)}, its layer holds "
                f"{list(parameter.shape)}"
            )
        parameter.copy_(value)
        del value
