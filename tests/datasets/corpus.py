"""A tokenizer trained in the test on this repository's own sources, and small corpora to prepare with it."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

REPO = Path(__file__).resolve().parents[2]
END_OF_TEXT = "<|endoftext|>"


def repository_sources(limit: int | None = None) -> list[Path]:
    """The operator's Python sources, in sorted order."""
    files = sorted((REPO / "operator" / "paralleljob").rglob("*.py"))
    return files[:limit] if limit else files


def train_tokenizer(folder: Path, vocab_size: int = 400) -> Path:
    """A byte-level BPE tokenizer trained on the repository's sources, saved as folder/tokenizer.json."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train([str(p) for p in repository_sources()], trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def write_jsonl(path: Path, documents: list[str], field: str = "text") -> Path:
    path.write_text("".join(json.dumps({field: d, "id": i}) + "\n" for i, d in enumerate(documents)), encoding="utf-8")
    return path


def write_parquet(path: Path, documents: list[str], column: str = "text", rows_per_group: int = 3) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({column: documents}), path, row_group_size=rows_per_group)
    return path
