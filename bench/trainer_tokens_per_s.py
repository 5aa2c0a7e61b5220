"""Tokens/s of the quickstart-size GPT under the 3D trainer on this machine's CPUs (PP2 x TP2 x DP2, 8 ranks).

    .venv/bin/python -m bench.trainer_tokens_per_s [--steps 30]

Model: 4 layers, hidden 128, 4 heads, sequence 128, byte vocabulary (256), fp32, AdamW; global batch 16,
micro-batch 4 (2 micro-batches per DP rank and step); data: bytes of the standard library's json package.
Prints the median step time and tokens/s after 5 warm-up steps, and the first and last loss.
"""

from __future__ import annotations

import argparse
import json

from bench import common

QUICKSTART = {
    "layers": 4,
    "hiddenSize": 128,
    "attentionHeads": 4,
    "sequenceLength": 128,
    "vocabSize": 256,
    "precision": "fp32",
}
WARMUP = 5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    steps = parser.parse_args().steps
    data = {"source": "text", "path": common.stdlib_corpus()}
    document = common.job_document(2, 2, 2, QUICKSTART, steps=steps, batch=16, micro=4, data=data)
    records = common.run_trainer(document)
    steps_logged = [r for r in records if r.get("event") == "step"]
    result = {
        "layout": "PP2xTP2xDP2",
        "step_time_s": round(common.median_after_warmup(records, "step_time_s", WARMUP), 4),
        "tokens_per_s": round(common.median_after_warmup(records, "tokens_per_s", WARMUP), 1),
        "first_loss": round(steps_logged[0]["loss"], 4),
        "last_loss": round(steps_logged[-1]["loss"], 4),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
