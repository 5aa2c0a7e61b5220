"""`spec.training.data` and `spec.training.eval` in the job file: the training tokens, a blend of prepared
folders, and the held-out evaluation.

A `tokens` path is either a flat file of ids (nanoGPT style, `tokenDtype` says its integer type) or a folder made
by `paralleljob data prepare`, whose metadata gives the dtype, vocabulary and end-of-document id. `sources`
blends several prepared folders with weights. Every prepared folder is read here, when the job file is parsed:
each rank refuses a folder that an interrupted prepare left, or a vocabulary larger than `model.vocabSize`,
before any process group forms.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from paralleljob_contract import dataset
from paralleljob_contract.errors import ContractError

DATA_SOURCES = ("synthetic", "text", "tokens")
TOKEN_DTYPES = ("uint16", "uint32")
DEFAULT_DATA_SOURCE = "synthetic"
DEFAULT_TOKEN_DTYPE = "uint16"
DEFAULT_EVAL_INTERVAL = 100
DEFAULT_EVAL_BATCHES = 4


@dataclasses.dataclass(frozen=True)
class WeightedSource:
    """One prepared folder of a blend and its share of the rows."""

    path: Path
    weight: float


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where training tokens come from: `path` (one file or folder) or `sources` (a blend of prepared folders)."""

    source: str
    path: Path | None
    token_dtype: str
    sources: tuple[WeightedSource, ...] = ()


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation: a folder of its own, or the last `held_out_fraction` of each training folder's
    documents, evaluated every `interval_steps` steps over `batches` global batches."""

    interval_steps: int
    batches: int
    path: Path | None = None
    held_out_fraction: float = 0.0


def parse_data(section: Mapping[str, Any], where: str) -> DataConfig:
    """`spec.training.data`, with every path checked to exist."""
    sources = _parse_sources(section.get("sources"), f"{where}.sources")
    default_source = "tokens" if sources else DEFAULT_DATA_SOURCE
    source = section.get("source", default_source)
    if source not in DATA_SOURCES:
        raise ContractError(f"{where}.source: must be one of {', '.join(DATA_SOURCES)}, got {source!r}")
    raw_path = section.get("path")
    if sources and (source != "tokens" or raw_path):
        raise ContractError(f"{where}.sources: blends prepared folders; use it alone, without path, source tokens")
    if source != "synthetic" and not raw_path and not sources:
        raise ContractError(f"{where}.path: required when source is {source}")
    path = _existing_path(raw_path, f"{where}.path") if raw_path and source != "synthetic" else None
    dtype = section.get("tokenDtype", DEFAULT_TOKEN_DTYPE)
    if dtype not in TOKEN_DTYPES:
        raise ContractError(f"{where}.tokenDtype: must be one of {', '.join(TOKEN_DTYPES)}, got {dtype!r}")
    return DataConfig(source=str(source), path=path, token_dtype=str(dtype), sources=sources)


def _parse_sources(value: Any, where: str) -> tuple[WeightedSource, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not value:
        raise ContractError(f"{where}: must be a non-empty list of {{path, weight}}")
    sources = []
    for index, entry in enumerate(value):
        here = f"{where}[{index}]"
        if not isinstance(entry, Mapping) or not entry.get("path"):
            raise ContractError(f"{here}.path: required")
        weight = entry.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0:
            raise ContractError(f"{here}.weight: must be a positive number, got {weight!r}")
        sources.append(WeightedSource(_existing_path(entry["path"], f"{here}.path"), float(weight)))
    return tuple(sources)


def _existing_path(raw: Any, where: str) -> Path:
    path = Path(os.path.expanduser(str(raw)))
    if not path.exists():
        raise ContractError(f"{where}: {path} does not exist")
    return path


def parse_eval(section: Any, data: DataConfig, where: str) -> EvalConfig | None:
    """`spec.training.eval`, or None when absent."""
    if section is None:
        return None
    if not isinstance(section, Mapping):
        raise ContractError(f"{where}: must be an object")
    fraction = section.get("heldOutFraction")
    raw_path = section.get("path")
    if (fraction is None) == (raw_path is None):
        raise ContractError(f"{where}: set exactly one of path (a held-out folder) and heldOutFraction")
    if fraction is not None and (isinstance(fraction, bool) or not isinstance(fraction, int | float)):
        raise ContractError(f"{where}.heldOutFraction: must be a number, got {fraction!r}")
    if fraction is not None and not 0 < fraction < 1:
        raise ContractError(f"{where}.heldOutFraction: must be between 0 and 1 (exclusive), got {fraction}")
    if fraction is not None and not prepared_paths(data):
        raise ContractError(f"{where}.heldOutFraction: needs prepared token folders in spec.training.data")
    return EvalConfig(
        interval_steps=_positive(section, "intervalSteps", where, DEFAULT_EVAL_INTERVAL),
        batches=_positive(section, "batches", where, DEFAULT_EVAL_BATCHES),
        path=_existing_path(raw_path, f"{where}.path") if raw_path is not None else None,
        held_out_fraction=float(fraction or 0.0),
    )


def _positive(section: Mapping[str, Any], key: str, where: str, default: int) -> int:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ContractError(f"{where}.{key}: must be an integer of at least 1, got {value!r}")
    return value


def prepared_paths(data: DataConfig) -> tuple[Path, ...]:
    """The prepared folders the training data reads (a tokens path that is a folder, or every blended one)."""
    if data.sources:
        return tuple(s.path for s in data.sources)
    if data.source == "tokens" and data.path is not None and data.path.is_dir():
        return (data.path,)
    return ()


def check_prepared_folders(data: DataConfig, evaluation: EvalConfig | None, vocab_size: int, where: str) -> None:
    """Every prepared folder must be finished and its vocabulary must fit the model; ContractError otherwise."""
    if data.sources:
        places = [(s.path, f"{where}.data.sources[{i}].path") for i, s in enumerate(data.sources)]
    else:
        places = [(p, f"{where}.data.path") for p in prepared_paths(data)]
    if evaluation is not None and evaluation.path is not None:
        places.append((evaluation.path, f"{where}.eval.path"))
    for path, place in places:
        if not path.is_dir():
            raise ContractError(f"{place}: {path} must be a folder made by `paralleljob data prepare`")
        dataset.check_vocabulary_fits(dataset.read_prepared(path, place), vocab_size, place)
