"""Peak host memory of TP rank 0 of 8 loading its shard of one 70B-shaped Llama layer from a Hugging Face folder.

    .venv/bin/python -m bench.trainer_pretrained [--rounds 2] [--dtype bf16|fp32]

The folder is one `model.safetensors` holding layer 0 of Llama 2/3 70B (hidden 8192, 64 heads, 8 kv heads, FFN
28672; 0.86 billion parameters, 1.6 GiB in bf16), written sparse (a header, then a hole: nothing but the header
on disk, and every page read is real). Each round runs in a fresh interpreter: `build` is the trainer's
`LlamaBlock` with seeded random weights (what a pretrained start builds first); `build+load` then overwrites
its parameters with rank 0's slices through `paralleljob_trainer.pretrained.load_layer` (safetensors'
get_slice). Peak RSS counts the file's pages the slices touch, as a rank's memory limit would. Prints seconds,
peak RSS over the torch import and that figure against the rank's shard.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHAPE = {"hidden": 8192, "heads": 64, "kv_heads": 8, "ffn": 28672}
TENSOR = 8
DTYPES = {"bf16": ("BF16", 2), "fp32": ("F32", 4)}

_CHILD = r"""
import json, resource, sys, time
from pathlib import Path
import torch
torch.set_num_threads(1)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
mode, shape, tensor, folder = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
import dataclasses
from paralleljob_contract.jobfile import ModelConfig
from paralleljob_trainer import hf_layout, llama, pretrained
from paralleljob_trainer.tensor_parallel import TensorParallel
model = ModelConfig(1, shape["hidden"], shape["heads"], 4096, 128256, shape["ffn"], "bf16", 0, architecture="llama",
                    kv_heads=shape["kv_heads"])
tp = TensorParallel(rank=0, size=tensor)
started = time.perf_counter()
block = llama.LlamaBlock(model, 1234, 1, tp)
built = time.perf_counter() - started
if mode == "build+load":
    entries = [e for e in hf_layout.tensor_table(dataclasses.asdict(model), tensor) if e.layer == 1]
    with pretrained.opened(folder) as tensors, torch.no_grad():
        pretrained.load_layer(block, entries, tensors, tp, model)
seconds = time.perf_counter() - started
kept = sum(p.numel() * p.element_size() for p in block.parameters())
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"mode": mode, "seconds": seconds, "build_s": built, "peak_rss_mib": peak / 1024,
                  "after_import_mib": base / 1024, "kept_mib": kept / 2**20}))
"""


def layer_tensors() -> dict[str, list[int]]:
    """Layer 0 of a 70B Llama under Hugging Face's names, with its shapes."""
    h, f, kv = SHAPE["hidden"], SHAPE["ffn"], SHAPE["kv_heads"] * SHAPE["hidden"] // SHAPE["heads"]
    name = "model.layers.0"
    return {
        f"{name}.input_layernorm.weight": [h],
        f"{name}.self_attn.q_proj.weight": [h, h],
        f"{name}.self_attn.k_proj.weight": [kv, h],
        f"{name}.self_attn.v_proj.weight": [kv, h],
        f"{name}.self_attn.o_proj.weight": [h, h],
        f"{name}.post_attention_layernorm.weight": [h],
        f"{name}.mlp.gate_proj.weight": [f, h],
        f"{name}.mlp.up_proj.weight": [f, h],
        f"{name}.mlp.down_proj.weight": [h, f],
    }


def write_sparse_folder(folder: Path, dtype: str) -> int:
    """model.safetensors with the layer's header and a hole for its data; the file's size in bytes."""
    code, size = DTYPES[dtype]
    header: dict[str, object] = {}
    offset = 0
    for name, shape in layer_tensors().items():
        count = 1
        for edge in shape:
            count *= edge
        header[name] = {"dtype": code, "shape": shape, "data_offsets": [offset, offset + count * size]}
        offset += count * size
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "model.safetensors").open("wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)) + encoded)
        handle.truncate(8 + len(encoded) + offset)
    return 8 + len(encoded) + offset


def measure(mode: str, folder: Path) -> dict[str, float]:
    env_path = f"{REPO / 'trainer-image'}:{REPO}"
    command = [sys.executable, "-c", _CHILD, mode, json.dumps(SHAPE), str(TENSOR), str(folder)]
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
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="the folder's dtype")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pj-pretrained-bench-") as temporary:
        folder = Path(temporary)
        size = write_sparse_folder(folder, args.dtype)
        print(f"70B-shaped llama layer ({size / 2**30:.2f} GiB {args.dtype} file), TP rank 0 of {TENSOR}, on CPU")
        for _ in range(args.rounds):
            for mode in ("build", "build+load"):
                row = measure(mode, folder)
                over = row["peak_rss_mib"] - row["after_import_mib"]
                print(
                    f"{mode:11s} {row['seconds']:6.2f} s (build {row['build_s']:5.2f} s)  peak RSS "
                    f"{row['peak_rss_mib']:6.0f} MiB, {over:5.0f} MiB over the torch import = "
                    f"{over / row['kept_mib']:.2f}x the rank's shard ({row['kept_mib']:.0f} MiB fp32)"
                )


if __name__ == "__main__":
    main()
