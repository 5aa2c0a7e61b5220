"""Train a small byte-level BPE tokenizer on this repository's own Python sources, for the prepared-data example.

    .venv/bin/python scripts/train_tokenizer.py --output runs/data/tokenizer [--vocab-size 512]

Writes OUTPUT/tokenizer.json (end of document: <|endoftext|>, id 0). Nothing is downloaded: the corpus is the
repository, the trainer is the `tokenizers` library's (the `data` extra).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

REPO = Path(__file__).resolve().parents[1]
END_OF_TEXT = "<|endoftext|>"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, required=True, help="the folder to write tokenizer.json into")
    parser.add_argument("--vocab-size", type=int, default=512, help="vocabulary size, special token included")
    args = parser.parse_args()
    sources = sorted(str(p) for folder in ("operator", "trainer-image") for p in (REPO / folder).rglob("*.py"))
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train(sources, trainer)
    args.output.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(args.output / "tokenizer.json"))
    print(f"{args.output / 'tokenizer.json'}: vocabulary {tokenizer.get_vocab_size()}, trained on {len(sources)} files")


if __name__ == "__main__":
    main()
