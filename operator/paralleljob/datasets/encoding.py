"""Turning one chunk into token ids: what each `paralleljob data prepare` worker process runs.

A worker loads the tokenizer once (`start_worker`) and then encodes chunks (`encode_chunk`): it parses the
chunk's documents, encodes them in one `encode_batch_fast` call, appends the end-of-document id to each, and
returns the ids and each document's length. A document's ids depend only on its text, so the folder is the same
whatever worker encoded which chunk.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

from paralleljob.datasets.inputs import Chunk, InputError


@dataclasses.dataclass(frozen=True)
class Encoder:
    """What a worker needs: the tokenizer's JSON, the end-of-document id, the token dtype and the text field."""

    tokenizer_json: str
    end_of_document_id: int
    dtype: str
    field: str


@dataclasses.dataclass(frozen=True)
class Encoded:
    """A chunk's token ids (each document followed by the end-of-document id) and its documents' lengths."""

    tokens: np.ndarray
    lengths: np.ndarray
    size: int


_worker: dict[str, Any] = {}


def start_worker(encoder: Encoder) -> None:
    """Load the tokenizer once per worker process (the pool's initializer)."""
    from tokenizers import Tokenizer

    _worker["encoder"] = encoder
    _worker["tokenizer"] = Tokenizer.from_str(encoder.tokenizer_json)


def encode_chunk(chunk: Chunk) -> Encoded:
    """The token ids of `chunk`; InputError naming the file and line or row when a document is unreadable."""
    encoder: Encoder = _worker["encoder"]
    documents = documents_of(chunk, encoder.field)
    encodings = _worker["tokenizer"].encode_batch_fast(documents, add_special_tokens=False)
    lengths = np.fromiter((len(e.ids) + 1 for e in encodings), dtype=np.int64, count=len(encodings))
    tokens = np.empty(int(lengths.sum()), dtype=encoder.dtype)
    ends = np.cumsum(lengths)
    for encoding, end, length in zip(encodings, ends, lengths, strict=True):
        tokens[end - length : end - 1] = encoding.ids
    tokens[ends - 1] = encoder.end_of_document_id
    return Encoded(tokens, lengths, chunk.size)


def documents_of(chunk: Chunk, field: str) -> list[str]:
    """The documents of a chunk as text."""
    if chunk.kind == "jsonl":
        return _json_lines(chunk, field)
    if chunk.kind == "parquet":
        return _parquet_rows(chunk, field)
    try:
        return [chunk.payload.decode("utf-8")]
    except UnicodeDecodeError as error:
        raise InputError(f"{chunk.path}: byte {error.start} is not UTF-8 text") from None


def _json_lines(chunk: Chunk, field: str) -> list[str]:
    documents = []
    for number, line in enumerate(chunk.payload.split(b"\n"), start=chunk.first):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise InputError(f"{chunk.path}:{number}: not a JSON line ({error})") from None
        if not isinstance(record, dict) or field not in record:
            raise InputError(f"{chunk.path}:{number}: no field {field!r}; name the text field with --field")
        if not isinstance(record[field], str):
            raise InputError(f"{chunk.path}:{number}: field {field!r} is {type(record[field]).__name__}, not text")
        documents.append(record[field])
    return documents


def _parquet_rows(chunk: Chunk, field: str) -> list[str]:
    import pyarrow.parquet as pq

    rows: list[str] = pq.ParquetFile(chunk.path).read_row_group(chunk.row_group, columns=[field]).column(0).to_pylist()
    for offset, value in enumerate(rows):
        if value is None:
            raise InputError(f"{chunk.path}: row {chunk.first + offset}: column {field!r} is null")
    return rows
