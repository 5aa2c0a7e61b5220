"""Start-up time and peak host memory of building one 70B-shaped Llama layer on TP rank 0 of 8, on CPU.

    .venv/bin/python -m bench.trainer_init [--rounds 2]

Two ways, each in a fresh interpreter (so peak RSS is the build's alone, plus the torch import measured
first): `full-then-slice`, what the trainer did before per-shard initialisation (generate every weight
full-size from one generator per tensor, keep this rank's slice), and `per-shard`, the trainer's
`LlamaBlock` today (draw only the 256 x 256 tiles of the slice it keeps, `paralleljob_trainer.weights`).
The layer is Llama 2/3 70B's: hidden 8192, 64 heads, 8 kv heads, FFN 28672. Prints seconds and peak RSS.
"""

from __future__ import annotations

import argparse

from bench import common

_CHILD = r"""
from paralleljob_trainer import llama
h, f, d = shape["hidden"], shape["ffn"], shape["hidden"] // shape["heads"]
started = time.perf_counter()
if mode == "per-shard":
    block = llama.LlamaBlock(model, 1234, 1, tp)
    kept = sum(p.numel() for p in block.parameters())
else:
    # The trainer before per-shard initialisation: each tensor full-size from its own generator, then a slice.
    shapes = {"q": ((h, h), 0), "k": ((shape["kv_heads"] * d, h), 0), "v": ((shape["kv_heads"] * d, h), 0),
              "o": ((h, h), 1), "gate": ((f, h), 0), "up": ((f, h), 0), "down": ((h, f), 1)}
    kept_tensors = []
    for index, (name, (full_shape, dim)) in enumerate(shapes.items()):
        generator = torch.Generator().manual_seed(1234 + index)
        full = torch.randn(full_shape, generator=generator) * 0.02
        kept_tensors.append(full.chunk(tensor, dim=dim)[0].contiguous())
        del full
    kept = sum(t.numel() for t in kept_tensors)
report(seconds=time.perf_counter() - started, kept_mib=kept * 4 / 2**20)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(f"70B-shaped llama layer, TP rank 0 of {common.LAYER_TENSOR}, fp32 on CPU (one thread)")
    for _ in range(args.rounds):
        for mode in ("full-then-slice", "per-shard"):
            row = common.llama_layer_child(_CHILD, mode, layers=80)
            over = row["peak_rss_mib"] - row["after_import_mib"]
            print(
                f"{mode:16s} {row['seconds']:6.2f} s  peak RSS {row['peak_rss_mib']:7.0f} MiB "
                f"({over:6.0f} MiB over the torch import; the kept shard is {row['kept_mib']:.0f} MiB)"
            )


if __name__ == "__main__":
    main()
