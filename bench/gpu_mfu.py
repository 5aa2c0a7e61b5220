"""Tokens/s and MFU of the 3D trainer on one GPU, for a GPT or a Llama of about 1B parameters in bf16.

    .venv/bin/python -m bench.gpu_mfu [--model gpt-1b|llama-1b] [--steps 30] [--micro-batch 8] [--peak-tflops T]

llama-1b is Llama 3.2 1B's shape: 16 layers, hidden 2048, 32 heads, 8 kv heads, FFN 8192, rope theta 500000,
tied embeddings, vocabulary 128256, sequence 4096 (1.24B parameters); micro-batch 4 unless given.
gpt-1b: 16 layers, hidden 2048, 16 heads, FFN 8192, sequence 2048, vocabulary 50304 (1.03B parameters with the
untied LM head), bf16, AdamW, no activation recomputation; PP1 x TP1 x DP1 (one rank), synthetic tokens.
MFU is the trainer's own estimate: model FLOPs per step, 3 * B * s * l * (8h^2 + 4hf + 4sh) + 6 * B * s * h * V
(6 per weight and token plus attention, no recomputation; paralleljob_contract.model.training_flops), over the bf16 dense peak of
the GPU, read from its name (A100 312, H100/H200 989 TFLOP/s) or given with --peak-tflops. Prints the medians after 10 warm-up steps. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json

from bench import common
from paralleljob_contract import environment, jobfile
from paralleljob_contract.model import parameter_count

MODEL = {
    "layers": 16,
    "hiddenSize": 2048,
    "attentionHeads": 16,
    "ffnHiddenSize": 8192,
    "sequenceLength": 2048,
    "vocabSize": 50304,
    "precision": "bf16",
    "activationCheckpointInterval": 0,
}
LLAMA_1B = {
    "architecture": "llama",
    "layers": 16,
    "hiddenSize": 2048,
    "attentionHeads": 32,
    "kvHeads": 8,
    "ffnHiddenSize": 8192,
    "ropeTheta": 500000.0,
    "tieEmbeddings": True,
    "sequenceLength": 4096,
    "vocabSize": 128256,
    "precision": "bf16",
    "activationCheckpointInterval": 0,
}
MODELS = {"gpt-1b": (MODEL, 8), "llama-1b": (LLAMA_1B, 4)}
WARMUP = 10


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--model", choices=sorted(MODELS), default="gpt-1b")
    parser.add_argument("--micro-batch", type=int, default=None)
    parser.add_argument("--peak-tflops", type=float, default=None)
    arguments = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_mfu.py needs a CUDA GPU")
    model, default_micro = MODELS[arguments.model]
    micro = arguments.micro_batch or default_micro
    document = common.job_document(
        1, 1, 1, model, steps=arguments.steps, batch=micro, micro=micro, data={"source": "synthetic"}
    )
    env = {environment.PEAK_TFLOPS: str(arguments.peak_tflops)} if arguments.peak_tflops else {}
    records = common.run_trainer(document, env)
    size = parameter_count(jobfile.parse_job_config(document).model.shape)
    print(json.dumps({
        "model": arguments.model,
        "gpu": torch.cuda.get_device_name(),
        "parameters": size,
        "micro_batch": micro,
        "tokens_per_s": round(common.median_after_warmup(records, "tokens_per_s", WARMUP), 1),
        "step_time_s": round(common.median_after_warmup(records, "step_time_s", WARMUP), 4),
        "mfu": common.median_after_warmup(records, "mfu", WARMUP),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
