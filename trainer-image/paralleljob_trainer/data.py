"""Training tokens: synthetic, bytes of a text corpus, or a memory-mapped token file; and who reads what.

A global batch is a pure function of (seed, step): row i of step t is a window of sequenceLength + 1 tokens at
an offset drawn from a generator seeded with (seed, t). Data-parallel rank d reads rows
[d * B/DP, (d + 1) * B/DP) of that batch, split into micro-batches. Nothing depends on history, so a resumed
run, a different layout, and the single-process reference all see exactly the same tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from paralleljob_contract.errors import ContractError
from paralleljob_contract.jobfile import DataConfig

_SYNTHETIC = "synthetic"
# Token ids checked per slice of a memory-mapped file: bounds the memory the check touches at once.
_VOCAB_CHECK_CHUNK = 1 << 24


@dataclasses.dataclass(frozen=True)
class TokenStream:
    """A flat array of token ids (absent for synthetic data) and the vocabulary they must fit."""

    tokens: np.ndarray | None
    vocab_size: int
    sequence_length: int
    seed: int

    def global_batch(self, step: int, rows: slice, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, labels) for `rows` of the global batch of `step`, each [rows, sequence_length] int64."""
        generator = np.random.default_rng([self.seed, step])
        window = self.sequence_length + 1
        if self.tokens is None:
            sample = generator.integers(0, self.vocab_size, size=(batch_size, window))[rows]
        else:
            starts = generator.integers(0, len(self.tokens) - window + 1, size=batch_size)[rows]
            sample = np.stack([np.asarray(self.tokens[s : s + window], dtype=np.int64) for s in starts])
        windows = torch.from_numpy(np.ascontiguousarray(sample, dtype=np.int64))
        return windows[:, :-1], windows[:, 1:]


def open_stream(data: DataConfig, vocab_size: int, sequence_length: int, seed: int) -> TokenStream:
    """Open the configured source; raises ContractError naming the file when it cannot serve a window."""
    tokens = None if data.source == _SYNTHETIC else _read_tokens(data)
    if tokens is not None and len(tokens) < sequence_length + 1:
        raise ContractError(
            f"spec.training.data.path: {data.path} holds {len(tokens)} tokens, fewer than "
            f"sequenceLength + 1 ({sequence_length + 1})"
        )
    if tokens is not None:
        _check_vocabulary(tokens, vocab_size, data.path)
    return TokenStream(tokens=tokens, vocab_size=vocab_size, sequence_length=sequence_length, seed=seed)


def _read_tokens(data: DataConfig) -> np.ndarray:
    assert data.path is not None
    if not data.path.exists():
        raise ContractError(f"spec.training.data.path: {data.path} does not exist")
    if data.source == "text":
        return np.frombuffer(_read_text_bytes(data.path), dtype=np.uint8)
    if not data.path.is_file():
        raise ContractError(f"spec.training.data.path: {data.path} must be a file for source tokens")
    return np.memmap(data.path, dtype=np.dtype(data.token_dtype), mode="r")


def _check_vocabulary(tokens: np.ndarray, vocab_size: int, path: Path | None) -> None:
    """Every token id must be below vocab_size; checked over the whole file, once, before training.

    Checking here rather than on the windows a step samples means every rank finds a bad id at start-up, before
    any process group exists: otherwise only the stages that read tokens (first and last) would fail, late,
    and the middle stages would wait for them until the process-group timeout.
    """
    if np.iinfo(tokens.dtype).max < vocab_size:
        return
    largest = max(
        int(tokens[start : start + _VOCAB_CHECK_CHUNK].max()) for start in range(0, len(tokens), _VOCAB_CHECK_CHUNK)
    )
    if largest >= vocab_size:
        raise ContractError(
            f"spec.training.data.path: {path} holds token id {largest}, outside spec.model.vocabSize ({vocab_size})"
        )


def _read_text_bytes(path: Path) -> bytes:
    """A file's bytes, or every regular file under a folder concatenated in sorted path order."""
    if path.is_file():
        return path.read_bytes()
    files = sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    corpus = b"\n".join(p.read_bytes() for p in files)
    if not corpus:
        raise ContractError(f"spec.training.data.path: {path} holds no readable text")
    return corpus


def rows_of_data_rank(batch_size: int, data_parallel: int, data_rank: int) -> slice:
    """The rows of each global batch that data-parallel rank `data_rank` trains on."""
    per_rank = batch_size // data_parallel
    return slice(data_rank * per_rank, (data_rank + 1) * per_rank)


def micro_batches(
    stream: TokenStream,
    step: int,
    batch_size: int,
    micro_batch_size: int,
    data_parallel: int,
    data_rank: int,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The micro-batches of this data-parallel rank for `step`, in the order the pipeline consumes them."""
    inputs, labels = stream.global_batch(step, rows_of_data_rank(batch_size, data_parallel, data_rank), batch_size)
    for start in range(0, inputs.shape[0], micro_batch_size):
        yield inputs[start : start + micro_batch_size], labels[start : start + micro_batch_size]
