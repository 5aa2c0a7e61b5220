"""`paralleljob data prepare INPUT... --tokenizer PATH --output DIR`: tokenize a corpus into a prepared folder.

The work is `paralleljob.datasets.prepare`'s; this module parses arguments, shows a progress bar (input bytes
and tokens per second) and prints the summary, or one line for bad input. It needs the `data` extra
(`tokenizers`, and `pyarrow` for Parquet inputs).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

PROGRAM = "paralleljob data prepare"


def register(sub: Any) -> None:
    parser = sub.add_parser("data", help="prepare training data: tokenize a corpus into a token folder")
    actions = parser.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    prepare = actions.add_parser(
        "prepare",
        help="tokenize text files or folders, JSON Lines and Parquet into a folder spec.training.data reads",
        description="Tokenize INPUTs (text files or folders: one document per file; .jsonl: one per line; "
        ".parquet: one per row) with a Hugging Face tokenizer into DIR: tokens.bin, offsets.bin and "
        "metadata.json, each document followed by the end-of-document token.",
    )
    prepare.add_argument("inputs", nargs="+", type=Path, metavar="INPUT", help="a file or a folder")
    prepare.add_argument("--tokenizer", type=Path, required=True, help="a tokenizer.json, or a folder with one")
    prepare.add_argument("--output", type=Path, required=True, help="the folder to write (must not exist)")
    prepare.add_argument("--field", default="text", help="the text field of JSON Lines, or column of Parquet")
    prepare.add_argument("--workers", type=int, default=None, help="encoding processes (default: every core)")
    prepare.add_argument("--eod-token", default=None, help="the end-of-document token (default: the tokenizer's)")
    prepare.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        from paralleljob.datasets import prepare as preparing
        from paralleljob.datasets.inputs import InputError, expand
    except ImportError as error:
        print(f"{PROGRAM}: needs {error.name}: pip install 'paralleljob[data]'", file=sys.stderr)
        return 1
    if args.workers is not None and args.workers < 1:
        print(f"{PROGRAM}: --workers must be at least 1, got {args.workers}", file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        tokenizer = preparing.load_tokenizer(args.tokenizer, args.eod_token)
        total = sum(f.size for f in expand(args.inputs))
        with _ProgressBar(total) as bar:
            summary = preparing.prepare(
                args.inputs, tokenizer, args.output, field=args.field, workers=args.workers, progress=bar.advance
            )
    except InputError as error:
        print(f"{PROGRAM}: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        # An unreadable input, or a full or read-only disk under --output: the staging folder is gone already.
        print(f"{PROGRAM}: {error.filename or args.output}: {error.strerror or error}", file=sys.stderr)
        return 1
    seconds = time.monotonic() - started
    print(
        f"{summary.output}: {summary.documents:,} documents, {summary.tokens:,} {summary.dtype} tokens from "
        f"{summary.input_bytes:,} bytes in {seconds:.1f} s ({summary.input_bytes / seconds / 1e6:.1f} MB/s, "
        f"{summary.tokens / seconds:,.0f} tokens/s)"
    )
    return 0


class _ProgressBar:
    """A rich progress bar over the input bytes, with bytes/s and tokens/s."""

    def __init__(self, total_bytes: int) -> None:
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

        self._progress = Progress(
            TextColumn("tokenizing"),
            BarColumn(),
            DownloadColumn(),
            TextColumn("{task.fields[bytes_rate]} {task.fields[token_rate]}"),
            TimeRemainingColumn(),
            transient=True,
        )
        self._task = self._progress.add_task("", total=total_bytes, bytes_rate="", token_rate="")
        self._started = time.monotonic()
        self._bytes = self._tokens = 0

    def __enter__(self) -> _ProgressBar:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def advance(self, size: int, tokens: int) -> None:
        self._bytes += size
        self._tokens += tokens
        seconds = max(time.monotonic() - self._started, 1e-9)
        self._progress.update(
            self._task,
            advance=size,
            bytes_rate=f"{self._bytes / seconds / 1e6:.1f} MB/s",
            token_rate=f"{self._tokens / seconds:,.0f} tokens/s",
        )
