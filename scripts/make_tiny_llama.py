#!/usr/bin/env python3
"""Write a tiny Llama (LlamaForCausalLM, random weights, fp32) as a Hugging Face folder, to fine-tune from.

Usage: .venv/bin/python scripts/make_tiny_llama.py [DIR]     # default: examples/tiny-llama

The model is what examples/llama-tiny-pretrained.yaml starts from: 4 layers, hidden 64, 4 heads with 2 kv heads,
a byte vocabulary (256), tied embeddings, rope_theta 500000 with Llama 3.1's rope_scaling, rms_norm_eps 1e-6.
It is made here with transformers (nothing is downloaded); `paralleljob model-spec DIR` prints its spec.model.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import transformers

DEFAULT = Path(__file__).resolve().parents[1] / "examples" / "tiny-llama"


def make(folder: Path, seed: int = 1234) -> Path:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, nargs="?", default=DEFAULT)
    print(f"wrote {make(parser.parse_args().folder)}")


if __name__ == "__main__":
    main()
