"""A pretrained start on real multi-process DeepSpeed runs (fp32, CPU, gloo): step 1's logged loss, computed on the
weights each rank loaded from a Hugging Face folder, equals transformers' own loss on the same global batch, and
the export right after loading (the learning rate is 0, so step 1 leaves the weights as loaded) gives back the
folder's tensors bit for bit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from paralleljob_contract import hf_config
from paralleljob_contract.jobfile import parse_job_config
from paralleljob_contract.layout import Layout
from paralleljob_trainer import data
from testcluster import trainer_harness as harness
from tests.trainer import hf_models

TOLERANCE = 1e-5
SGD_STILL = {"type": "SGD", "params": {"lr": 0.0}}


def _document(folder: Path, layout: Layout, sequence_parallel: bool = False) -> dict[str, Any]:
    section = hf_models.model_section(hf_config.spec_model(hf_config.read(folder)), folder)
    document = harness.job_document(
        layout,
        optimizer=SGD_STILL,
        steps=1,
        model=section,
        data={"source": "text", "path": str(harness.text_corpus())},
    )
    document["spec"]["checkpoint"]["export"] = "hf"
    document["spec"]["parallelism"]["sequenceParallel"] = sequence_parallel
    return document


def _run_and_compare(tmp_path: Path, folder: Path, layout: Layout, sequence_parallel: bool = False) -> None:
    document = _document(folder, layout, sequence_parallel)
    job = parse_job_config(document)
    gang = harness.Gang()
    checkpoints = tmp_path / "checkpoints"
    gang.start(
        harness.write_job(tmp_path, document), tmp_path / "out", nproc=layout.world_size, checkpoint_dir=checkpoints
    )
    result = gang.wait(timeout=300)
    assert result.returncodes == [0], result.logs[0][-3000:]
    stream = data.open_stream(job.training.data, job.model.vocab_size, job.model.sequence_length, job.training.seed)
    inputs, labels = stream.global_batch(1, slice(None), job.train_batch_size)
    logged = harness.steps_by_number(tmp_path / "out")[1]["loss"]
    expected = hf_models.transformers_loss(folder, inputs, labels)
    assert abs(logged - expected) <= TOLERANCE, f"step 1 loss {logged} against transformers' {expected}"
    exported = load_file(checkpoints / "export" / "model.safetensors")
    original: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        original |= load_file(path)
    if "transformer.wte.weight" in original:  # GPT-2's tied head comes back as an untied copy
        assert torch.equal(exported.pop("lm_head.weight"), original["transformer.wte.weight"])
    assert sorted(exported) == sorted(original)
    assert [name for name in original if not torch.equal(exported[name], original[name])] == []


@pytest.mark.slow
def test_llama_at_1x1x1_from_a_sharded_folder(tmp_path: Path) -> None:
    _run_and_compare(tmp_path, hf_models.llama(tmp_path / "hf", sharded=True), Layout(1, 1, 1))


@pytest.mark.slow
def test_llama_at_2x2x2_with_sequence_parallelism(tmp_path: Path) -> None:
    # 2 kv heads at TP 2: each rank holds its own kv head.
    _run_and_compare(tmp_path, hf_models.llama(tmp_path / "hf"), Layout(2, 2, 2), sequence_parallel=True)


@pytest.mark.slow
def test_llama_with_gqa_at_tp4_replicates_the_kv_heads(tmp_path: Path) -> None:
    _run_and_compare(tmp_path, hf_models.llama(tmp_path / "hf", kv_heads=2), Layout(1, 4, 1))


@pytest.mark.slow
def test_llama_at_pp2_tp2_with_tied_embeddings(tmp_path: Path) -> None:
    _run_and_compare(tmp_path, hf_models.llama(tmp_path / "hf", tied=True), Layout(2, 2, 1))


@pytest.mark.slow
def test_gpt2_at_2x2x1(tmp_path: Path) -> None:
    _run_and_compare(tmp_path, hf_models.gpt2(tmp_path / "hf"), Layout(2, 2, 1))
