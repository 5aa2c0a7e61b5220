"""`paralleljob data prepare` against the tokenizers library's own `encode_batch`, and its peak memory by corpus size.

    .venv/bin/python -m bench.data_prepare [--sizes-gb 0.5 4] [--workers N] [--keep]

For each size, a JSON Lines corpus of that many bytes is generated under /tmp (this repository's Python sources,
one document per file, repeated), and a BPE tokenizer (vocabulary 512, `scripts/train_tokenizer.py`) is trained
on the sources. Then, in the same run and over the same text:
- the baseline: `Tokenizer.encode_batch` over the documents in batches of 1,000, on all cores (tokenizers' own
  thread pool), the ids discarded; its rate is the ceiling a prepare could reach with nothing else to do;
- the prepare: `paralleljob data prepare` in a child process (every core, JSON parsing, writing, hashing), with
  the resident memory of the child and its workers summed and sampled every 50 ms for the peak.
Prints one JSON line per size: bytes, seconds, MB/s of each, the ratio prepare / baseline and the peak memory.
Figures are recorded in docs/trainer.md ("Prepared data, blends and held-out evaluation").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
BATCH_DOCUMENTS = 1000


def generate_corpus(path: Path, size: int) -> int:
    """JSON Lines of the repository's sources, repeated until `size` bytes; returns the bytes written."""
    lines = [
        json.dumps({"text": p.read_text(encoding="utf-8")}) + "\n"
        for folder in ("operator", "trainer-image")
        for p in sorted((REPO / folder).rglob("*.py"))
        if p.stat().st_size > 0
    ]
    block = "".join(lines).encode("utf-8")
    written = 0
    with path.open("wb") as out:
        while written < size:
            out.write(block)
            written += len(block)
    return written


def baseline(corpus: Path, tokenizer_file: Path) -> float:
    """Seconds for tokenizers' encode_batch over every document of `corpus`, in batches, on every core."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    started = time.perf_counter()
    batch: list[str] = []
    with corpus.open("rb") as lines:
        for line in lines:
            batch.append(json.loads(line)["text"])
            if len(batch) == BATCH_DOCUMENTS:
                tokenizer.encode_batch(batch, add_special_tokens=False)
                batch = []
    if batch:
        tokenizer.encode_batch(batch, add_special_tokens=False)
    return time.perf_counter() - started


def prepare(corpus: Path, tokenizer: Path, output: Path, workers: int | None) -> tuple[float, int]:
    """Seconds and peak resident bytes (the command and its workers together) of one `paralleljob data prepare`."""
    command = [sys.executable, "-m", "paralleljob", "data", "prepare", str(corpus), "--tokenizer", str(tokenizer)]
    command += ["--output", str(output), *(["--workers", str(workers)] if workers else [])]
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(REPO / "trainer-image")])}
    started = time.perf_counter()
    child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    parent = psutil.Process(child.pid)
    while child.poll() is None:
        peak = max(peak, _tree_rss(parent))
        time.sleep(0.05)
    seconds = time.perf_counter() - started
    if child.returncode != 0:
        raise SystemExit(f"prepare failed: {child.stderr.read() if child.stderr else ''}")
    return seconds, peak


def _tree_rss(parent: psutil.Process) -> int:
    total = 0
    for process in [parent, *parent.children(recursive=True)]:
        try:
            total += process.memory_info().rss
        except psutil.Error:
            continue
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-gb", type=float, nargs="+", default=[0.5, 4.0])
    parser.add_argument("--workers", type=int, default=None, help="prepare's workers (default: every core)")
    parser.add_argument("--keep", action="store_true", help="keep the generated corpus and folders in /tmp")
    parser.add_argument(
        "--memory-only", action="store_true", help="skip the encode_batch baseline: prepare's time and peak memory"
    )
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="pj-data-bench-"))
    try:
        subprocess.run(
            [sys.executable, str(REPO / "scripts" / "train_tokenizer.py"), "--output", str(root / "tokenizer")],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        for size_gb in args.sizes_gb:
            corpus = root / f"corpus-{size_gb}gb.jsonl"
            size = generate_corpus(corpus, int(size_gb * 1e9))
            base_s = None if args.memory_only else baseline(corpus, root / "tokenizer" / "tokenizer.json")
            prep_s, peak = prepare(corpus, root / "tokenizer", root / f"prepared-{size_gb}gb", args.workers)
            figures = {
                "size_gb": size_gb,
                "bytes": size,
                "cores": os.cpu_count(),
                "encode_batch_s": None if base_s is None else round(base_s, 1),
                "encode_batch_mb_s": None if base_s is None else round(size / base_s / 1e6, 2),
                "prepare_s": round(prep_s, 1),
                "prepare_mb_s": round(size / prep_s / 1e6, 2),
                "ratio": None if base_s is None else round(base_s / prep_s, 3),
                "peak_rss_mb": round(peak / 1e6, 1),
            }
            print(json.dumps(figures), flush=True)
            if not args.keep:
                corpus.unlink()
                shutil.rmtree(root / f"prepared-{size_gb}gb")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
