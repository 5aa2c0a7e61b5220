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
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHAPE = {"layers": 80, "hidden": 8192, "heads": 64, "kv_heads": 8, "ffn": 28672}
TENSOR = 8

_CHILD = r"""
import json, resource, sys, time
import torch
torch.set_num_threads(1)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
mode, shape, tensor = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
from paralleljob_contract.jobfile import ModelConfig
from paralleljob_trainer import llama
from paralleljob_trainer.tensor_parallel import TensorParallel
h, f, d = shape["hidden"], shape["ffn"], shape["hidden"] // shape["heads"]
model = ModelConfig(shape["layers"], h, shape["heads"], 4096, 128256, f, "bf16", 0, architecture="llama",
                    kv_heads=shape["kv_heads"])
started = time.perf_counter()
if mode == "per-shard":
    block = llama.LlamaBlock(model, 1234, 1, TensorParallel(rank=0, size=tensor))
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
seconds = time.perf_counter() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"mode": mode, "seconds": seconds, "peak_rss_mib": peak / 1024, "after_import_mib": base / 1024,
                  "kept_mib": kept * 4 / 2**20}))
"""


def measure(mode: str) -> dict[str, float]:
    env_path = f"{REPO / 'trainer-image'}:{REPO}"
    command = [sys.executable, "-c", _CHILD, mode, json.dumps(SHAPE), str(TENSOR)]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": env_path, "OMP_NUM_THREADS": "1"},
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(f"70B-shaped llama layer, TP rank 0 of {TENSOR}, fp32 on CPU (one thread)")
    for _ in range(args.rounds):
        for mode in ("full-then-slice", "per-shard"):
            row = measure(mode)
            over = row["peak_rss_mib"] - row["after_import_mib"]
            print(
                f"{mode:16s} {row['seconds']:6.2f} s  peak RSS {row['peak_rss_mib']:7.0f} MiB "
                f"({over:6.0f} MiB over the torch import; the kept shard is {row['kept_mib']:.0f} MiB)"
            )


if __name__ == "__main__":
    main()
