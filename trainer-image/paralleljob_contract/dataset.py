"""A prepared token folder: what `paralleljob data prepare` writes and the trainer reads.

The folder holds three files:
- `tokens.bin`: every document's token ids followed by the end-of-document id, as little-endian uint16 when the
  vocabulary fits (at most 65,536 ids), else uint32;
- `offsets.bin`: little-endian uint64 token offsets, one per document start and one for the end (documents + 1);
- `metadata.json`: the tokenizer (sha256 of its tokenizer.json, vocabulary size, end-of-document id), the dtype,
  the counts and every input with its size and sha256. It is written last, and the folder is renamed into place
  after it, so a folder without it is an interrupted prepare, and the trainer refuses it.

This module is the one definition of that layout for both sides (the operator's CLI writes it, the trainer and
`paralleljob validate` read it); it uses only the standard library.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from paralleljob_contract.errors import ContractError

FORMAT = "paralleljob-tokens"
VERSION = 1
TOKENS_FILE = "tokens.bin"
OFFSETS_FILE = "offsets.bin"
METADATA_FILE = "metadata.json"
OFFSET_DTYPE = "uint64"
# The largest vocabulary whose ids fit uint16.
UINT16_VOCAB = 1 << 16
DTYPE_SIZES = {"uint16": 2, "uint32": 4}


def token_dtype_for(vocab_size: int) -> str:
    """uint16 when every id of a `vocab_size` vocabulary fits, else uint32."""
    return "uint16" if vocab_size <= UINT16_VOCAB else "uint32"


@dataclasses.dataclass(frozen=True)
class PreparedDataset:
    """What a reader needs from a prepared folder's metadata."""

    path: Path
    dtype: str
    vocab_size: int
    end_of_document_id: int
    documents: int
    tokens: int

    @property
    def tokens_path(self) -> Path:
        return self.path / TOKENS_FILE

    @property
    def offsets_path(self) -> Path:
        return self.path / OFFSETS_FILE


def read_prepared(path: Path, where: str) -> PreparedDataset:
    """The metadata of the prepared folder `path`; ContractError naming `where` and the fix when it is unusable."""
    metadata_path = path / METADATA_FILE
    if not metadata_path.is_file():
        raise ContractError(
            f"{where}: {path} has no {METADATA_FILE}, so it is not a finished `paralleljob data prepare` folder "
            "(an interrupted prepare?): run the prepare again"
        )
    try:
        document = json.loads(metadata_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ContractError(f"{where}: {metadata_path} is not readable JSON: {error}") from None
    dataset = _parse_metadata(document, path, where)
    _check_sizes(dataset, where)
    return dataset


def _parse_metadata(document: Any, path: Path, where: str) -> PreparedDataset:
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ContractError(f"{where}: {path / METADATA_FILE} is not {FORMAT} metadata")
    if document.get("version") != VERSION:
        raise ContractError(
            f"{where}: {path / METADATA_FILE} has version {document.get('version')!r}, this reader reads {VERSION}"
        )
    tokenizer = document.get("tokenizer") or {}
    try:
        dataset = PreparedDataset(
            path=path,
            dtype=str(document["dtype"]),
            vocab_size=int(tokenizer["vocabSize"]),
            end_of_document_id=int(tokenizer["endOfDocumentId"]),
            documents=int(document["documents"]),
            tokens=int(document["tokens"]),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise ContractError(f"{where}: {path / METADATA_FILE} lacks or mistypes {error}") from None
    if dataset.dtype not in DTYPE_SIZES:
        raise ContractError(f"{where}: {path / METADATA_FILE} dtype {dataset.dtype!r} is not uint16 or uint32")
    return dataset


def _check_sizes(dataset: PreparedDataset, where: str) -> None:
    """The token and offset files must hold what the metadata counts: a truncated copy is refused here."""
    expected = {
        dataset.tokens_path: dataset.tokens * DTYPE_SIZES[dataset.dtype],
        dataset.offsets_path: (dataset.documents + 1) * 8,
    }
    for file, size in expected.items():
        actual = file.stat().st_size if file.is_file() else None
        if actual != size:
            found = "is missing" if actual is None else f"holds {actual} bytes"
            raise ContractError(f"{where}: {file} {found}, but its metadata counts {size} bytes: prepare it again")


def check_vocabulary_fits(dataset: PreparedDataset, vocab_size: int, where: str) -> None:
    """The tokenizer's vocabulary must fit the model's embedding: one line with both numbers otherwise."""
    if dataset.vocab_size > vocab_size:
        raise ContractError(
            f"{where}: {dataset.path} was tokenized with a vocabulary of {dataset.vocab_size}, larger than "
            f"spec.model.vocabSize ({vocab_size}): raise vocabSize to at least {dataset.vocab_size}"
        )
