"""Deterministic initial weights that depend on the seed alone, generated shard by shard.

A matrix is cut into fixed tiles of `TILE` x `TILE` elements, each drawn from its own generator keyed by
(seed, layer, tensor name, tile row, tile column). A rank generates only the tiles that overlap the slice it
keeps (`normal_slice`), so no rank ever holds a full matrix it does not keep, yet every slice has exactly the
numbers of the same slice of the full matrix (`normal`). The initial model therefore never depends on the
layout: PP2xTP2 and one process start from identical numbers, which is what lets the tests compare loss curves
to 1e-5. Biases start at zero and norms at (1, 0).

A stage whose weights a pretrained folder overwrites next is built inside `undrawn()`: every weight is then
allocated and left as it is, no tile drawn (transformers' `no_init_weights` and torchtitan's meta-device build
skip the same work), and `pretrained.load_stage` fills every parameter.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import zlib
from collections.abc import Iterator

import torch

INIT_STD = 0.02
# Tile edge: small enough that a shard's boundary wastes little, large enough that seeding a generator per tile
# costs nothing next to drawing its 64k numbers.
TILE = 256
_UNDRAWN = contextvars.ContextVar("paralleljob_weights_undrawn", default=False)


@contextlib.contextmanager
def undrawn() -> Iterator[None]:
    """Within this block, `normal_slice` allocates its slice without drawing it: for layers whose every weight is
    loaded next (a pretrained start), where the draw would be thrown away."""
    token = _UNDRAWN.set(True)
    try:
        yield
    finally:
        _UNDRAWN.reset(token)


def _generator(seed: int, layer: int, name: str, tile: tuple[int, int]) -> torch.Generator:
    key = f"{name}/{tile[0]}/{tile[1]}".encode()
    mixed = (seed * 1_000_003 + layer * 10_007 + zlib.crc32(key)) % (2**63 - 1)
    return torch.Generator().manual_seed(mixed)


def _tile_range(span: range) -> range:
    return range(span.start // TILE, math.ceil(span.stop / TILE))


def normal_slice(
    seed: int,
    layer: int,
    name: str,
    shape: tuple[int, int],
    rows: range,
    cols: range | None = None,
    std: float = INIT_STD,
) -> torch.Tensor:
    """Rows `rows` and columns `cols` (default: all) of the full `shape` N(0, std^2) matrix, float32.

    Only the tiles overlapping the slice are drawn, each from the generator of its tile, so the peak memory is
    the slice plus one tile row of it."""
    cols = cols if cols is not None else range(shape[1])
    out = torch.empty(len(rows), len(cols), dtype=torch.float32)
    if _UNDRAWN.get():
        return out
    for tile_row in _tile_range(rows):
        row_start, row_stop = tile_row * TILE, min((tile_row + 1) * TILE, shape[0])
        for tile_col in _tile_range(cols):
            col_start, col_stop = tile_col * TILE, min((tile_col + 1) * TILE, shape[1])
            generator = _generator(seed, layer, name, (tile_row, tile_col))
            tile = torch.randn(row_stop - row_start, col_stop - col_start, generator=generator)
            r0, r1 = max(rows.start, row_start), min(rows.stop, row_stop)
            c0, c1 = max(cols.start, col_start), min(cols.stop, col_stop)
            out[r0 - rows.start : r1 - rows.start, c0 - cols.start : c1 - cols.start] = tile[
                r0 - row_start : r1 - row_start, c0 - col_start : c1 - col_start
            ]
    return out.mul_(std)


def normal(seed: int, layer: int, name: str, shape: tuple[int, int], std: float = INIT_STD) -> torch.Tensor:
    """The full `shape` matrix (what one process holds): the union of every rank's `normal_slice`."""
    return normal_slice(seed, layer, name, shape, range(shape[0]), range(shape[1]), std)


def residual_std(layers: int) -> float:
    """GPT-2's scaled init for projections that write into the residual stream."""
    return INIT_STD / math.sqrt(2 * layers)
