"""In one process: the initial weights do not depend on the layout, the export's merge of every TP rank's
shards gives the unsharded model, transformers computes the trainer's logits from the exported folder, and the
vocab-parallel loss equals the replicated one (on a two-rank gloo group).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import transformers

from paralleljob_contract.jobfile import ModelConfig
from paralleljob_trainer import export
from tests.trainer import model_parts
from tests.trainer.collective_workers import run_on_ranks, vocab_parallel_matches_replicated

SEED = 11
GPT = ModelConfig(2, 64, 4, 16, 300, 256, "fp32", 0)
LLAMA = dataclasses.replace(GPT, architecture="llama", kv_heads=2, rope_theta=500000.0)
MODELS = {
    "gpt": GPT,
    "llama-gqa": LLAMA,
    "llama-tied": dataclasses.replace(LLAMA, tie_embeddings=True),
}


def _merged(model: ModelConfig, tensor: int) -> dict[str, torch.Tensor]:
    return export.merged_tensors(
        model_parts.manifest_model(model), model_parts.shard_loader(model, SEED, tensor), tensor
    )


@pytest.mark.parametrize("name", MODELS)
def test_every_layout_starts_from_the_same_weights(name: str) -> None:
    model = MODELS[name]
    one = _merged(model, 1)
    # TP 4 with 2 kv heads holds all kv heads on every rank; TP 2 holds one whole group per rank.
    for tensor in (2, 4):
        sharded = _merged(model, tensor)
        assert sorted(sharded) == sorted(one)
        different = [key for key in one if not torch.equal(one[key], sharded[key])]
        assert different == [], f"TP {tensor}: {different}"
    assert one["lm_head.weight" if "lm_head.weight" in one else "model.embed_tokens.weight"].shape[0] == 300


@pytest.mark.parametrize("name", MODELS)
def test_transformers_computes_the_trainers_logits_from_the_export(name: str, tmp_path: Path) -> None:
    model = MODELS[name]
    export.write_folder(_merged(model, 4), model_parts.manifest_model(model), tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    expected = "LlamaForCausalLM" if model.architecture == "llama" else "GPT2LMHeadModel"
    assert type(loaded).__name__ == expected
    tokens = torch.randint(0, model.vocab_size, (2, model.sequence_length), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours = model_parts.trainer_logits(model_parts.single(model, SEED), model, tokens)
        theirs = loaded(input_ids=tokens).logits
    assert theirs.shape == ours.shape == (2, model.sequence_length, model.vocab_size)
    assert (theirs - ours).abs().max().item() < 1e-4


def test_export_refuses_a_checkpoint_whose_file_does_not_match_its_checksum(tmp_path: Path) -> None:
    folder = tmp_path / "global_step1"
    folder.mkdir()
    (folder / "layer_00-model_00-model_states.pt").write_bytes(b"changed")
    (folder / "manifest.json").write_text(
        '{"format": 1, "files": {"layer_00-model_00-model_states.pt": {"bytes": 7, "sha256": "00"}}}'
    )
    with pytest.raises(export.ExportError, match="does not match its checksum"):
        export.export(folder, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # a gang of processes: the training runs' lane, and not `make check`
@pytest.mark.parametrize("tensor", [2, 4])
def test_vocab_parallel_loss_and_gradients_equal_the_replicated_ones(tensor: int) -> None:
    # 300 tokens padded to 512: at TP 4 rank 2 holds 44 real rows and rank 3 padding only.
    results = run_on_ranks(vocab_parallel_matches_replicated, tensor, 300)
    assert [outcome for outcome, _ in results] == ["ok"] * tensor, results
    for rank, (_, diffs) in enumerate(results):
        assert max(diffs.values()) < 1e-6, f"rank {rank}: {diffs}"
