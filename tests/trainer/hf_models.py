"""Tiny Hugging Face folders made in the test with transformers (random weights, fp32, no download), and
transformers' own loss on a global batch: what a pretrained start is compared against.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers
from torch.nn import functional

VOCAB = 300
SEQUENCE = 32
# Llama 3.1's scaling on a context this small: head_dim 16 at theta 500000 has wavelengths on every side of
# 16 / low_freq_factor and 16 / high_freq_factor, so all three branches of the formula are used.
LLAMA3_SCALING = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}


def _perturbed(model: transformers.PreTrainedModel, seed: int) -> transformers.PreTrainedModel:
    """Norm weights and biases start at one and zero: move every parameter, so a misplaced one shows."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return model.eval()


def llama(
    folder: Path, *, kv_heads: int = 2, tied: bool = False, layers: int = 4, sharded: bool = False, seed: int = 5
) -> Path:
    """A LlamaForCausalLM folder: hidden 64, 4 heads, ffn 128, byte-sized vocabulary 300, rope_type llama3,
    rms_norm_eps 1e-6; `sharded` writes several safetensors files and model.safetensors.index.json."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        max_position_embeddings=SEQUENCE,
        rms_norm_eps=1e-6,
        rope_parameters=dict(LLAMA3_SCALING),
        tie_word_embeddings=tied,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = _perturbed(transformers.LlamaForCausalLM(config), seed)
    model.save_pretrained(folder, max_shard_size="60KB" if sharded else "10GB")
    return folder


def gpt2(folder: Path, *, layers: int = 4, seed: int = 6) -> Path:
    """A GPT2LMHeadModel folder (gelu_new, tied head, Conv1D weights): hidden 64, 4 heads, 32 positions."""
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_embd=64,
        n_layer=layers,
        n_head=4,
        n_positions=SEQUENCE,
        layer_norm_epsilon=1e-6,
        bos_token_id=0,
        eos_token_id=0,
    )
    _perturbed(transformers.GPT2LMHeadModel(config), seed).save_pretrained(folder)
    return folder


def transformers_loss(folder: Path, inputs: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean next-token cross-entropy of transformers' own model from `folder` on one global batch."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=inputs).logits
    return float(functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)))


def model_section(spec_model: dict[str, Any], folder: Path) -> dict[str, Any]:
    """`paralleljob model-spec`'s section for a tiny job: fp32, 32 tokens, starting from `folder`."""
    return {**spec_model, "sequenceLength": SEQUENCE, "precision": "fp32", "pretrained": {"path": str(folder)}}
