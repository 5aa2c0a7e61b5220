"""`paralleljob data prepare`: a tokenizer trained here on the repository's sources turns text, JSON Lines and
Parquet into a folder that decodes back to the documents; the folder does not depend on the worker count; an
interrupted prepare leaves nothing the trainer accepts; bad input is one line naming the file and line or row."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from paralleljob.cli import main
from paralleljob.datasets import inputs
from paralleljob_contract import dataset
from paralleljob_contract.errors import ContractError
from tests.datasets.corpus import END_OF_TEXT, repository_sources, train_tokenizer, write_jsonl, write_parquet


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tokenizer(tmp_path_factory.mktemp("tokenizer")).parent


def _documents_of(folder: Path) -> list[np.ndarray]:
    meta = dataset.read_prepared(folder, "test")
    tokens = np.fromfile(meta.tokens_path, dtype=meta.dtype)
    offsets = np.fromfile(meta.offsets_path, dtype=np.uint64).astype(np.int64)
    return [tokens[a:b] for a, b in itertools.pairwise(offsets)]


def _prepare(*arguments: object) -> int:
    return main(["data", "prepare", *map(str, arguments)])


def test_text_jsonl_and_parquet_decode_back_to_their_documents_each_ended_by_the_separator(
    tokenizer_folder: Path, tmp_path: Path
) -> None:
    sources = repository_sources(limit=9)
    texts = [p.read_text(encoding="utf-8") for p in sources]
    text_folder = tmp_path / "text"
    text_folder.mkdir()
    for index, text in enumerate(texts[:3]):
        (text_folder / f"{index:02d}.py").write_text(text, encoding="utf-8")
    jsonl = write_jsonl(tmp_path / "docs.jsonl", texts[3:6])
    parquet = write_parquet(tmp_path / "docs.parquet", texts[6:9], rows_per_group=2)
    output = tmp_path / "prepared"

    assert _prepare(text_folder, jsonl, parquet, "--tokenizer", tokenizer_folder, "--output", output) == 0

    tokenizer = Tokenizer.from_file(str(tokenizer_folder / "tokenizer.json"))
    end = tokenizer.token_to_id(END_OF_TEXT)
    meta = json.loads((output / dataset.METADATA_FILE).read_text())
    assert meta["dtype"] == "uint16" and meta["tokenizer"]["endOfDocumentId"] == end
    assert meta["tokenizer"]["vocabSize"] == tokenizer.get_vocab_size()
    assert [entry["kind"] for entry in meta["inputs"]] == ["text"] * 3 + ["jsonl", "parquet"]
    assert all(entry["bytes"] > 0 and len(entry["sha256"]) == 64 for entry in meta["inputs"])
    documents = _documents_of(output)
    assert len(documents) == meta["documents"] == 9
    assert all(int(d[-1]) == end and end not in d[:-1].tolist() for d in documents)
    assert [tokenizer.decode(d[:-1].tolist()) for d in documents] == texts


def test_one_and_two_workers_write_byte_identical_folders(
    tokenizer_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Small blocks: the JSON Lines file becomes many chunks, which two workers finish out of order.
    monkeypatch.setattr(inputs, "BLOCK_BYTES", 4096)
    texts = [p.read_text(encoding="utf-8") for p in repository_sources(limit=40)]
    jsonl = write_jsonl(tmp_path / "docs.jsonl", texts)
    folders = {}
    for workers in (1, 2):
        folders[workers] = tmp_path / f"workers{workers}"
        assert _prepare(jsonl, "--tokenizer", tokenizer_folder, "--output", folders[workers], "--workers", workers) == 0
    for name in (dataset.TOKENS_FILE, dataset.OFFSETS_FILE, dataset.METADATA_FILE):
        assert (folders[1] / name).read_bytes() == (folders[2] / name).read_bytes(), name
    assert len(_documents_of(folders[1])) == len(texts)


def test_an_interrupted_prepare_leaves_nothing_the_trainer_accepts_and_a_rerun_completes(
    tokenizer_folder: Path, tmp_path: Path
) -> None:
    texts = [p.read_text(encoding="utf-8") for p in repository_sources()]
    jsonl = write_jsonl(tmp_path / "big.jsonl", texts * 40)
    output = tmp_path / "prepared"
    staging = tmp_path / ".prepared.staging"
    command = [sys.executable, "-m", "paralleljob", "data", "prepare", str(jsonl), "--tokenizer",
               str(tokenizer_folder), "--output", str(output), "--workers", "1"]  # fmt: skip
    process = subprocess.Popen(command, start_new_session=True, env=os.environ | {"PYTHONPATH": ":".join(sys.path)})
    deadline = time.monotonic() + 120
    while not ((staging / dataset.TOKENS_FILE).is_file() and (staging / dataset.TOKENS_FILE).stat().st_size > 0):
        assert process.poll() is None and time.monotonic() < deadline, "prepare ended before it could be interrupted"
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()

    assert not output.exists()
    with pytest.raises(ContractError, match="not a finished `paralleljob data prepare` folder"):
        dataset.read_prepared(staging, "spec.training.data.path")
    assert _prepare(jsonl, "--tokenizer", tokenizer_folder, "--output", output) == 0
    assert not staging.exists()
    assert len(_documents_of(output)) == len(texts) * 40


def test_a_folder_whose_token_file_is_short_is_refused(tokenizer_folder: Path, tmp_path: Path) -> None:
    output = tmp_path / "prepared"
    jsonl = write_jsonl(tmp_path / "docs.jsonl", ["one document", "another one"])
    assert _prepare(jsonl, "--tokenizer", tokenizer_folder, "--output", output) == 0
    tokens = output / dataset.TOKENS_FILE
    tokens.write_bytes(tokens.read_bytes()[:-2])
    with pytest.raises(ContractError, match=r"tokens.bin holds \d+ bytes, but its metadata counts"):
        dataset.read_prepared(output, "spec.training.data.path")


def _bad_inputs(folder: Path) -> dict[str, tuple[Path, str]]:
    not_json = folder / "not_json.jsonl"
    not_json.write_text('{"text": "fine"}\n{"text": oops}\n', encoding="utf-8")
    no_field = folder / "no_field.jsonl"
    no_field.write_text('{"text": "a"}\n\n{"body": "b"}\n', encoding="utf-8")
    no_column = write_parquet(folder / "no_column.parquet", ["a", "b"], column="body")
    empty = folder / "empty.txt"
    empty.write_text("", encoding="utf-8")
    return {
        "line-not-json": (not_json, f"{not_json}:2: not a JSON line"),
        "missing-field": (no_field, f"{no_field}:3: no field 'text'"),
        "parquet-without-column": (no_column, f"{no_column}: no column 'text' (columns: body)"),
        "empty-input": (empty, f"{empty}: empty input"),
    }


@pytest.mark.parametrize("case", ["line-not-json", "missing-field", "parquet-without-column", "empty-input"])
def test_bad_input_is_one_line_naming_the_file_and_line(
    case: str, tokenizer_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, expected = _bad_inputs(tmp_path)[case]
    output = tmp_path / "prepared"

    assert _prepare(path, "--tokenizer", tokenizer_folder, "--output", output) == 1

    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error
    assert error.startswith(f"paralleljob data prepare: {expected}")
    assert not output.exists() and not (tmp_path / ".prepared.staging").exists()
