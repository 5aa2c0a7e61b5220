"""The inputs of `paralleljob data prepare`, cut into chunks in a fixed order.

An argument is a file or a folder (its non-empty files in sorted path order, hidden ones skipped). A file's kind follows
its suffix: `.jsonl`/`.ndjson` are JSON Lines (one document per line, the text under `--field`), `.parquet` is
Parquet (one document per row of the text column), anything else is one text document per file. The chunks come
out in the same order whatever the number of workers, and each is small (a block of lines, one row group, one
text file), so the memory in flight stays bounded by the chunk size times the workers, not by the corpus.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

# Lines of JSON Lines are read in blocks of about this size: big enough that one block keeps a worker busy
# for a while, small enough that a few per worker stay in memory.
BLOCK_BYTES = 4 << 20
JSONL_SUFFIXES = (".jsonl", ".ndjson")
PARQUET_SUFFIX = ".parquet"


class InputError(ValueError):
    """Bad input, as one line naming the file and the line or row."""


@dataclasses.dataclass
class InputFile:
    """One input file; `sha256` is filled as the file is read."""

    path: Path
    kind: str
    size: int
    sha256: str = ""

    def record(self) -> dict[str, Any]:
        """The file's entry in the folder's metadata."""
        return {"path": str(self.path), "kind": self.kind, "bytes": self.size, "sha256": self.sha256}


@dataclasses.dataclass(frozen=True)
class Chunk:
    """A unit of work for one encoder: text bytes (a text file, a block of JSON lines) or one Parquet row group."""

    kind: str
    path: str
    # The first line (JSON Lines) or row (Parquet) of the chunk, counted from 1, for error messages.
    first: int
    payload: bytes
    row_group: int
    # Input bytes the chunk stands for, for the progress bar.
    size: int


def expand(arguments: Sequence[Path]) -> list[InputFile]:
    """Every input file, in argument order and sorted path order inside folders."""
    files: list[InputFile] = []
    for argument in arguments:
        if argument.is_dir():
            # Inside a folder an empty file is no document (an empty __init__.py); named alone, it is bad input.
            members = sorted(
                p
                for p in argument.rglob("*")
                if p.is_file() and not _hidden(p.relative_to(argument)) and p.stat().st_size > 0
            )
        elif argument.is_file():
            members = [argument]
        else:
            raise InputError(f"{argument}: no such file or folder")
        if not members:
            raise InputError(f"{argument}: empty input (a folder without files)")
        files.extend(InputFile(p, _kind_of(p), p.stat().st_size) for p in members)
    return files


def _hidden(relative: Path) -> bool:
    return any(part.startswith(".") for part in relative.parts)


def _kind_of(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        return "jsonl"
    return "parquet" if suffix == PARQUET_SUFFIX else "text"


def chunks(file: InputFile, field: str) -> Iterator[Chunk]:
    """The chunks of one file, in order; hashes the file on the way."""
    if file.size == 0:
        raise InputError(f"{file.path}: empty input")
    if file.kind == "parquet":
        yield from _parquet_chunks(file, field)
    elif file.kind == "jsonl":
        yield from _line_blocks(file)
    else:
        payload = file.path.read_bytes()
        file.sha256 = hashlib.sha256(payload).hexdigest()
        yield Chunk("text", str(file.path), 1, payload, 0, len(payload))


def _line_blocks(file: InputFile) -> Iterator[Chunk]:
    """Blocks of whole lines; a line longer than a block makes its block longer."""
    digest = hashlib.sha256()
    carry, line = b"", 1
    with file.path.open("rb") as stream:
        while block := stream.read(BLOCK_BYTES):
            digest.update(block)
            block = carry + block
            cut = block.rfind(b"\n") + 1
            if cut == 0:
                carry = block
                continue
            carry = block[cut:]
            yield Chunk("jsonl", str(file.path), line, block[:cut], 0, cut)
            line += block.count(b"\n", 0, cut)
    if carry:
        yield Chunk("jsonl", str(file.path), line, carry, 0, len(carry))
    file.sha256 = digest.hexdigest()


def _parquet_chunks(file: InputFile, field: str) -> Iterator[Chunk]:
    """One chunk per row group: the worker reads the group itself, so no rows pass through this process."""
    metadata = _parquet_metadata(file, field)
    file.sha256 = _hash_file(file.path)
    first = 1
    for group in range(metadata.num_row_groups):
        rows = metadata.row_group(group).num_rows
        yield Chunk("parquet", str(file.path), first, b"", group, file.size * rows // max(1, metadata.num_rows))
        first += rows


def _parquet_metadata(file: InputFile, field: str) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(file.path)
    except (OSError, pa.ArrowException) as error:
        raise InputError(f"{file.path}: not a readable Parquet file ({error})") from None
    schema = parquet.schema_arrow
    if field not in schema.names:
        raise InputError(
            f"{file.path}: no column {field!r} (columns: {', '.join(schema.names)}); name the text column with --field"
        )
    kind = schema.field(field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise InputError(f"{file.path}: column {field!r} holds {kind}, not text")
    if parquet.metadata.num_rows == 0:
        raise InputError(f"{file.path}: empty input (no rows)")
    return parquet.metadata


def _hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while block := stream.read(BLOCK_BYTES):
            digest.update(block)
    return digest.hexdigest()
