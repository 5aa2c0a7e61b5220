"""Peak host memory of TP rank 0 of 8 loading its shard of one 70B-shaped Llama layer from a Hugging Face folder.

    .venv/bin/python -m bench.trainer_pretrained [--rounds 2] [--dtype bf16|fp32]

The folder is one `model.safetensors` holding layer 0 of Llama 2/3 70B (hidden 8192, 64 heads, 8 kv heads, FFN
28672; 0.86 billion parameters, 1.6 GiB in bf16), written sparse (a header, then a hole: nothing but the header
on disk, and every page read is real). Each way runs in a fresh interpreter: the trainer's `LlamaBlock` is built,
then its parameters are filled with rank 0's slices through `paralleljob_trainer.pretrained.load_layer`
(safetensors' get_slice): `drawn+load` builds it with seeded random weights first (the trainer before), and
`undrawn+load` inside `weights.undrawn()`, allocated and not drawn (the trainer's pretrained start now). Peak
RSS counts the file's pages the slices touch, as a rank's memory limit would. Prints seconds (and the build's
share), peak RSS over the torch import and that figure against the rank's shard.
"""

from __future__ import annotations

import argparse
import json
import struct
import tempfile
from pathlib import Path

from bench import common

DTYPES = {"bf16": ("BF16", 2), "fp32": ("F32", 4)}

_CHILD = r"""
import contextlib, dataclasses
from pathlib import Path
from paralleljob_trainer import hf_layout, llama, pretrained, weights
folder = Path(args[0])
started = time.perf_counter()
with weights.undrawn() if mode == "undrawn+load" else contextlib.nullcontext():
    block = llama.LlamaBlock(model, 1234, 1, tp)
built = time.perf_counter() - started
entries = [e for e in hf_layout.tensor_table(dataclasses.asdict(model), tensor) if e.layer == 1]
with pretrained.opened(folder) as tensors, torch.no_grad():
    pretrained.load_layer(block, entries, tensors, tp, model)
kept = sum(p.numel() * p.element_size() for p in block.parameters())
report(seconds=time.perf_counter() - started, build_s=built, kept_mib=kept / 2**20)
"""


def layer_tensors() -> dict[str, list[int]]:
    """Layer 0 of a 70B Llama under Hugging Face's names, with its shapes."""
    shape = common.LLAMA_70B_LAYER
    h, f, kv = shape["hidden"], shape["ffn"], shape["kv_heads"] * shape["hidden"] // shape["heads"]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="the folder's dtype")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pj-pretrained-bench-") as temporary:
        folder = Path(temporary)
        size = write_sparse_folder(folder, args.dtype)
        print(
            f"70B-shaped llama layer ({size / 2**30:.2f} GiB {args.dtype} file), TP rank 0 of {common.LAYER_TENSOR}, "
            "on CPU"
        )
        for _ in range(args.rounds):
            for mode in ("drawn+load", "undrawn+load"):
                row = common.llama_layer_child(_CHILD, mode, str(folder))
                over = row["peak_rss_mib"] - row["after_import_mib"]
                print(
                    f"{mode:12s} {row['seconds']:6.2f} s (build {row['build_s']:5.2f} s)  peak RSS "
                    f"{row['peak_rss_mib']:6.0f} MiB, {over:5.0f} MiB over the torch import = "
                    f"{over / row['kept_mib']:.2f}x the rank's shard ({row['kept_mib']:.0f} MiB fp32)"
                )


if __name__ == "__main__":
    main()
