"""Deterministic full-size initial weights, one generator per (seed, layer, tensor name).

Every rank generates the full tensor for the layers it holds and keeps its shard. The weights therefore depend
on the seed alone, never on the layout: PP2xTP2 and one process start from identical numbers, which is what
lets the tests compare loss curves to 1e-5. Biases start at zero and LayerNorms at (1, 0).
"""

from __future__ import annotations

import math
import zlib

import torch

INIT_STD = 0.02


def _generator(seed: int, layer: int, name: str, device: torch.device) -> torch.Generator:
    mixed = (seed * 1_000_003 + layer * 10_007 + zlib.crc32(name.encode())) % (2**63 - 1)
    return torch.Generator(device=device).manual_seed(mixed)


def normal(
    seed: int,
    layer: int,
    name: str,
    shape: tuple[int, ...],
    std: float = INIT_STD,
    device: torch.device | None = None,
) -> torch.Tensor:
    """A float32 tensor of N(0, std^2) numbers that depends only on (seed, layer, name, shape)."""
    device = device or torch.device("cpu")
    generator = _generator(seed, layer, name, device)
    return torch.randn(shape, generator=generator, device=device, dtype=torch.float32) * std


def residual_std(layers: int) -> float:
    """GPT-2's scaled init for projections that write into the residual stream."""
    return INIT_STD / math.sqrt(2 * layers)
