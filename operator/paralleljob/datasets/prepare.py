"""`paralleljob data prepare`: inputs and a tokenizer in, a prepared token folder out.

The main process reads the inputs in order and hands chunks to a pool of worker processes (one per core by
default), keeping at most two chunks per worker in flight, so memory does not grow with the corpus. Results are
written in the order the chunks were read, whatever worker finished first: the folder is byte-identical for any
number of workers. Everything is written into a staging folder beside the output, `metadata.json` last, and the
staging folder is renamed into place at the end: an interrupted prepare leaves no folder under the output name,
and the next run removes the stale staging folder and starts over.

The layout of the folder is `paralleljob_contract.dataset`'s, which the trainer reads.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import multiprocessing
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from paralleljob.datasets import encoding
from paralleljob.datasets.inputs import Chunk, InputError, InputFile, chunks, expand
from paralleljob_contract import dataset as layout

# Special tokens tried, in order, as the end of document when the tokenizer's folder does not name its eos_token.
END_OF_DOCUMENT_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[SEP]")
IN_FLIGHT_PER_WORKER = 2
# Progress callback: (input bytes done, tokens written) for each chunk as it is written.
ProgressCallback = Callable[[int, int], None]


@dataclasses.dataclass(frozen=True)
class Tokenizer:
    """The tokenizer as the folder records it."""

    json_text: str
    sha256: str
    vocab_size: int
    end_of_document_id: int
    end_of_document_token: str


@dataclasses.dataclass(frozen=True)
class Summary:
    """What a prepare wrote."""

    output: Path
    documents: int
    tokens: int
    input_bytes: int
    dtype: str


def load_tokenizer(path: Path, end_of_document: str | None = None) -> Tokenizer:
    """A tokenizer.json, or a folder holding one; InputError when it is missing, unreadable or lacks an end token."""
    from tokenizers import Tokenizer as HfTokenizer

    file = path / "tokenizer.json" if path.is_dir() else path
    try:
        text = file.read_text(encoding="utf-8")
        tokenizer = HfTokenizer.from_str(text)
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"--tokenizer {file}: not readable ({error.__class__.__name__}: {error})") from None
    except Exception as error:  # tokenizers raises a bare Exception for JSON it cannot read.
        raise InputError(f"--tokenizer {file}: not a Hugging Face tokenizer.json ({error})") from None
    token = end_of_document or _configured_eos(file.parent) or _known_end_token(tokenizer)
    end_id = None if token is None else tokenizer.token_to_id(token)
    if token is None or end_id is None:
        raise InputError(
            f"--tokenizer {file}: no end-of-document token {'(' + token + ') ' if token else ''}in its vocabulary; "
            "name one with --eod-token"
        )
    return Tokenizer(
        json_text=text,
        sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(),
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
        end_of_document_id=end_id,
        end_of_document_token=token,
    )


def _configured_eos(folder: Path) -> str | None:
    """The eos_token of a transformers folder's tokenizer_config.json, when there is one."""
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    eos = config.get("eos_token") if isinstance(config, dict) else None
    if isinstance(eos, dict):
        eos = eos.get("content")
    return eos if isinstance(eos, str) else None


def _known_end_token(tokenizer: Any) -> str | None:
    return next((t for t in END_OF_DOCUMENT_CANDIDATES if tokenizer.token_to_id(t) is not None), None)


def prepare(
    arguments: Sequence[Path],
    tokenizer: Tokenizer,
    output: Path,
    *,
    field: str = "text",
    workers: int | None = None,
    progress: ProgressCallback | None = None,
) -> Summary:
    """Tokenize `arguments` into the folder `output`; InputError (one line) for bad input or an existing output."""
    if output.exists():
        raise InputError(f"--output {output}: already exists; remove it or name another folder")
    files = expand(arguments)
    staging = output.parent / f".{output.name}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        summary = _write_folder(files, tokenizer, staging, field, workers or os.cpu_count() or 1, progress)
        staging.rename(output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return dataclasses.replace(summary, output=output)


def _write_folder(
    files: list[InputFile],
    tokenizer: Tokenizer,
    staging: Path,
    field: str,
    workers: int,
    progress: ProgressCallback | None,
) -> Summary:
    dtype = layout.token_dtype_for(tokenizer.vocab_size)
    encoder = encoding.Encoder(tokenizer.json_text, tokenizer.end_of_document_id, dtype, field)
    documents = tokens = 0
    with (staging / layout.TOKENS_FILE).open("wb") as token_file, (staging / layout.OFFSETS_FILE).open("wb") as ends:
        ends.write(np.zeros(1, dtype=layout.OFFSET_DTYPE).tobytes())
        for encoded in _encoded_in_order(_all_chunks(files, field), encoder, workers):
            token_file.write(encoded.tokens.tobytes())
            _write_offsets(ends, tokens, encoded.lengths)
            documents += len(encoded.lengths)
            tokens += len(encoded.tokens)
            if progress is not None:
                progress(encoded.size, len(encoded.tokens))
    summary = Summary(staging, documents, tokens, sum(f.size for f in files), dtype)
    _write_metadata(staging, tokenizer, files, summary)
    return summary


def _all_chunks(files: list[InputFile], field: str) -> Iterator[Chunk]:
    for file in files:
        yield from chunks(file, field)


def _encoded_in_order(work: Iterator[Chunk], encoder: encoding.Encoder, workers: int) -> Iterator[encoding.Encoded]:
    """Encode chunks on `workers` processes, yielding results in input order with a bounded number in flight."""
    # Each worker encodes on one thread: the processes already fill the cores.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers, initializer=encoding.start_worker, initargs=(encoder,)) as pool:
        pending: collections.deque[Any] = collections.deque()
        for chunk in work:
            pending.append(pool.apply_async(encoding.encode_chunk, (chunk,)))
            if len(pending) >= workers * IN_FLIGHT_PER_WORKER:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def _write_offsets(ends: IO[bytes], start: int, lengths: np.ndarray) -> None:
    ends.write((start + np.cumsum(lengths)).astype(layout.OFFSET_DTYPE).tobytes())


def _write_metadata(staging: Path, tokenizer: Tokenizer, files: list[InputFile], summary: Summary) -> None:
    document = {
        "format": layout.FORMAT,
        "version": layout.VERSION,
        "dtype": summary.dtype,
        "documents": summary.documents,
        "tokens": summary.tokens,
        "inputBytes": summary.input_bytes,
        "tokenizer": {
            "sha256": tokenizer.sha256,
            "vocabSize": tokenizer.vocab_size,
            "endOfDocumentId": tokenizer.end_of_document_id,
            "endOfDocumentToken": tokenizer.end_of_document_token,
        },
        "inputs": [file.record() for file in files],
    }
    (staging / layout.METADATA_FILE).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
