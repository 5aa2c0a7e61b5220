"""Export a checkpoint of any layout to one Hugging Face folder that `transformers` loads.

`python -m paralleljob_trainer.export CHECKPOINT --output DIR` (also `paralleljob export`, and the trainer
itself after its final save when spec.checkpoint.export is hf). CHECKPOINT is a `global_stepN` folder or a
job's checkpoint folder (its `latest` is taken). The checkpoint's manifest is read first and every file's size
and sha256 verified; then the per-stage, per-TP-rank layer files (`layer_XX-model_YY-model_states.pt`,
DeepSpeed's pipeline format) are merged: column-parallel weights and the vocab-parallel embedding and head
concatenated by rows, row-parallel weights by columns, replicated tensors taken from TP rank 0, GPT's
head-grouped QKV rows put back in q, k, v order, and the vocabulary unpadded. The result is `config.json`
(LlamaForCausalLM or GPT2LMHeadModel), `model.safetensors` and `generation_config.json`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from paralleljob_trainer import checkpoint, hf_layout, manifest, storage

Shards = list[dict[str, torch.Tensor]]
# one state dict per TP rank, of one pipeline layer
LEGACY_MODEL_DEFAULTS: dict[str, Any] = {
    "architecture": "gpt",
    "kv_heads": None,
    "tie_embeddings": False,
    "norm_eps": 1e-5,
    "rope_scaling": None,
    "activation": "gelu",
}


class ExportError(RuntimeError):
    """The checkpoint cannot be exported; the message names the file or field and why."""


def checkpoint_folder(path: Path) -> Path:
    """`path` itself when it holds a manifest, else the checkpoint its `latest` names."""
    if (path / manifest.MANIFEST).exists():
        return path
    latest = path / checkpoint.LATEST
    if latest.exists():
        return path / latest.read_text(encoding="utf-8").strip()
    raise ExportError(f"{path} is neither a checkpoint (no {manifest.MANIFEST}) nor a job folder with `latest`")


def verified_manifest(folder: Path) -> dict[str, Any]:
    """The manifest of `folder`, after every file it lists matched its size and sha256."""
    saved = manifest.read(folder)
    if saved is None:
        raise ExportError(f"{folder / manifest.MANIFEST} is missing or unreadable")
    for name, expected in sorted(saved["files"].items()):
        path = folder / name
        if not path.exists() or path.stat().st_size != expected["bytes"]:
            raise ExportError(f"{path} is missing or not {expected['bytes']} bytes as the manifest says")
        if storage.sha256_of(path) != expected["sha256"]:
            raise ExportError(f"{path} does not match its checksum in the manifest")
    return saved


def _layer_shards(folder: Path, layer: int, tensor: int) -> Shards:
    shards = []
    for rank in range(tensor):
        path = folder / f"layer_{layer:02d}-model_{rank:02d}-model_states.pt"
        if not path.exists():
            raise ExportError(f"{path} is missing: the checkpoint has no layer {layer} for TP rank {rank}")
        shards.append(torch.load(path, map_location="cpu", weights_only=True))
    return shards


def hf_config(model: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """config.json of the exported model."""
    dtype_name = str(dtype).removeprefix("torch.")
    if model["architecture"] == "llama":
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": model["hidden_size"],
            "intermediate_size": model["ffn_hidden_size"],
            "num_hidden_layers": model["layers"],
            "num_attention_heads": model["attention_heads"],
            "num_key_value_heads": model["kv_heads"] or model["attention_heads"],
            "head_dim": model["hidden_size"] // model["attention_heads"],
            "max_position_embeddings": model["sequence_length"],
            "vocab_size": model["vocab_size"],
            "rms_norm_eps": model.get("norm_eps", 1e-5),
            "rope_theta": model["rope_theta"],
            "rope_scaling": _rope_scaling(model.get("rope_scaling")),
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": model["tie_embeddings"],
            "torch_dtype": dtype_name,
        }
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "n_embd": model["hidden_size"],
        "n_inner": model["ffn_hidden_size"],
        "n_layer": model["layers"],
        "n_head": model["attention_heads"],
        "n_positions": model["sequence_length"],
        "vocab_size": model["vocab_size"],
        "activation_function": model.get("activation", "gelu"),
        "layer_norm_epsilon": model.get("norm_eps", 1e-5),
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "tie_word_embeddings": False,
        "torch_dtype": dtype_name,
    }


def _rope_scaling(scaling: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if scaling is None else {"rope_type": "llama3", **scaling}


def export(source: Path, output: Path) -> Path:
    """Write the Hugging Face folder of the checkpoint at `source` (verified first) to `output`."""
    folder = checkpoint_folder(source)
    saved = verified_manifest(folder)
    model, tensor = saved["model"], int(saved["layout"]["tensor"])
    for key, default in LEGACY_MODEL_DEFAULTS.items():
        model.setdefault(key, default)  # checkpoints saved before these fields existed are GPTs

    def load(layer: int) -> Shards:
        return _layer_shards(folder, layer, tensor)

    write_folder(merged_tensors(model, load, tensor), model, output)
    return output


def merged_tensors(model: dict[str, Any], load: Callable[[int], Shards], tensor: int) -> dict[str, torch.Tensor]:
    """The unsharded, unpadded weights under Hugging Face's names, from `load(layer)`: each TP rank's state
    dict of pipeline layer `layer` (0 the embedding, 1..l the blocks, l+1 the head or final norm). The cut of
    every tensor is `hf_layout`'s table, which a pretrained start reads the other way."""
    return hf_layout.merged(model, load, tensor)


def write_folder(tensors: dict[str, torch.Tensor], model: dict[str, Any], output: Path) -> None:
    """config.json, model.safetensors and generation_config.json of `tensors` in `output`."""
    tensors = {name: value.contiguous().clone() for name, value in tensors.items()}
    dtype = next(iter(tensors.values())).dtype
    output.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(output / "model.safetensors"), metadata={"format": "pt"})
    _write_json(output / "config.json", hf_config(model, dtype))
    _write_json(output / "generation_config.json", {"_from_model_config": True, "max_length": model["sequence_length"]})


def _write_json(path: Path, content: dict[str, Any]) -> None:
    path.write_text(json.dumps(content, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m paralleljob_trainer.export",
        description="Merge a checkpoint of any PP x TP layout into one Hugging Face folder (safetensors).",
    )
    parser.add_argument("checkpoint", type=Path, help="a global_stepN folder, or a job folder (its `latest`)")
    parser.add_argument("--output", type=Path, required=True, help="the folder to write")
    args = parser.parse_args(argv)
    try:
        written = export(args.checkpoint, args.output)
    except (ExportError, OSError) as error:
        print(f"paralleljob export: error: {error}", file=sys.stderr)
        return 2
    print(f"exported {checkpoint_folder(args.checkpoint)} to {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
