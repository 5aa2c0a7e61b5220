"""Training tokens: synthetic, bytes of a text corpus, a memory-mapped token file, or prepared token folders
(one, or a weighted blend); the held-out evaluation's tokens; and who reads what.

A global batch is a pure function of (seed, step): row i of step t is a window of sequenceLength + 1 tokens at
an offset (and, for a blend, a source) drawn from a generator seeded with (seed, t). Data-parallel rank d reads rows
[d * B/DP, (d + 1) * B/DP) of that batch, split into micro-batches. Nothing depends on history, so a resumed
run, a different layout, and the single-process reference all see exactly the same tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from paralleljob_contract import dataset
from paralleljob_contract.errors import ContractError
from paralleljob_contract.jobfile import TrainingConfig
from paralleljob_contract.training_data import DataConfig, prepared_paths

_SYNTHETIC = "synthetic"
# The held-out evaluation's salt: its batch j is drawn from (seed, j, salt), apart from every training draw.
_EVAL_SALT = 0x6576616C
# Where a stream's tokens come from, for the message when a part is too short to serve one window.
_TRAINING = ("spec.training.data", "{path} holds")
_EVAL_PATH = ("spec.training.eval.path", "{path} holds")
_HELD_OUT = ("spec.training.eval.heldOutFraction", "the held-out documents of {path} hold")
# Token ids checked per slice of a memory-mapped file: bounds the memory the check touches at once.
_VOCAB_CHECK_CHUNK = 1 << 24


@dataclasses.dataclass(frozen=True)
class TokenStream:
    """Flat arrays of token ids (none for synthetic data), their blend weights, and the vocabulary they fit.

    `salt` separates streams drawn with the same seed: the held-out evaluation draws its batches with its own
    salt, so its windows never depend on, or shift, the training draws.
    """

    sources: tuple[np.ndarray, ...]
    weights: np.ndarray | None
    vocab_size: int
    sequence_length: int
    seed: int
    salt: tuple[int, ...] = ()

    def draws(self, step: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """(source index, start offset) of every row of the global batch of `step`."""
        generator = np.random.default_rng([self.seed, step, *self.salt])
        window = self.sequence_length + 1
        if len(self.sources) == 1:
            # One source draws exactly as the flat token file always has, so existing runs keep their curves.
            starts = generator.integers(0, len(self.sources[0]) - window + 1, size=batch_size)
            return np.zeros(batch_size, dtype=np.int64), starts
        which = generator.choice(len(self.sources), size=batch_size, p=self.weights)
        limits = np.array([len(tokens) - window + 1 for tokens in self.sources], dtype=np.int64)
        return which, generator.integers(0, limits[which])

    def global_batch(self, step: int, rows: slice, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, labels) for `rows` of the global batch of `step`, each [rows, sequence_length] int64."""
        window = self.sequence_length + 1
        if not self.sources:
            generator = np.random.default_rng([self.seed, step, *self.salt])
            sample = generator.integers(0, self.vocab_size, size=(batch_size, window))[rows]
        else:
            which, starts = self.draws(step, batch_size)
            sample = np.stack(
                [
                    np.asarray(self.sources[w][s : s + window], dtype=np.int64)
                    for w, s in zip(which[rows], starts[rows], strict=True)
                ]
            )
        windows = torch.from_numpy(np.ascontiguousarray(sample, dtype=np.int64))
        return windows[:, :-1], windows[:, 1:]


def open_stream(
    data: DataConfig, vocab_size: int, sequence_length: int, seed: int, held_out_fraction: float = 0.0
) -> TokenStream:
    """The training stream of the configured source, without the held-out documents; raises ContractError
    naming the file when it cannot serve a window."""
    if data.source == _SYNTHETIC:
        return TokenStream((), None, vocab_size, sequence_length, seed)
    if data.sources or (data.path is not None and data.path.is_dir() and data.source == "tokens"):
        parts = [_split(folder, held_out_fraction) for folder in prepared_paths(data)]
        return _stream([p[0] for p in parts], data, vocab_size, sequence_length, seed, (), _TRAINING)
    tokens = _read_tokens(data)
    _check_vocabulary(tokens, vocab_size, data.path)
    return _stream([(tokens, data.path)], data, vocab_size, sequence_length, seed, (), _TRAINING)


def open_eval_stream(training: TrainingConfig, vocab_size: int, sequence_length: int) -> TokenStream | None:
    """The held-out stream of spec.training.eval (its folder, or the held-out tail of each training folder)."""
    evaluation = training.evaluation
    if evaluation is None:
        return None
    if evaluation.path is not None:
        held = [_split(evaluation.path, 0.0, _EVAL_PATH[0])[0]]
        return _stream(held, None, vocab_size, sequence_length, training.seed, (_EVAL_SALT,), _EVAL_PATH)
    held = [_split(folder, evaluation.held_out_fraction)[1] for folder in prepared_paths(training.data)]
    return _stream(held, training.data, vocab_size, sequence_length, training.seed, (_EVAL_SALT,), _HELD_OUT)


def _stream(
    parts: Sequence[tuple[np.ndarray, Path | None]],
    data: DataConfig | None,
    vocab_size: int,
    sequence_length: int,
    seed: int,
    salt: tuple[int, ...],
    where: tuple[str, str],
) -> TokenStream:
    """`where`: the field the parts come from and what their tokens are, for the message of a part too short."""
    for tokens, path in parts:
        if len(tokens) < sequence_length + 1:
            field, what = where
            raise ContractError(
                f"{field}: {what.format(path=path)} {len(tokens)} tokens, fewer than sequenceLength + 1 "
                f"({sequence_length + 1}): give it more text or lower spec.model.sequenceLength"
            )
    weights = None
    if data is not None and data.sources:
        raw = np.array([source.weight for source in data.sources], dtype=np.float64)
        weights = raw / raw.sum()
    return TokenStream(tuple(p[0] for p in parts), weights, vocab_size, sequence_length, seed, salt)


def _split(
    folder: Path, held_out_fraction: float, field: str = "spec.training.data"
) -> tuple[tuple[np.ndarray, Path], tuple[np.ndarray, Path]]:
    """A prepared folder's tokens as (training part, held-out part): the last `held_out_fraction` of its
    documents are held out, cut at a document boundary so no document is in both."""
    prepared = dataset.read_prepared(folder, field)
    tokens = np.memmap(prepared.tokens_path, dtype=np.dtype(prepared.dtype), mode="r")
    if held_out_fraction == 0.0:
        return (tokens, folder), (tokens[:0], folder)
    held = max(1, round(held_out_fraction * prepared.documents))
    if held >= prepared.documents:
        raise ContractError(
            f"spec.training.eval.heldOutFraction: {folder} has {prepared.documents} documents, too few to hold "
            f"out {held_out_fraction} of them and train on the rest"
        )
    offsets = np.memmap(prepared.offsets_path, dtype=np.dtype(dataset.OFFSET_DTYPE), mode="r")
    cut = int(offsets[prepared.documents - held])
    return (tokens[:cut], folder), (tokens[cut:], folder)


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
