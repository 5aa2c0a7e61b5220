"""Proofs for the llama architecture, the vocab-parallel loss, sequence parallelism and the export, on real
multi-process DeepSpeed runs (fp32, CPU, gloo) against the single-process reference of the same job.

The llama jobs use a 300-token vocabulary over byte text, so at TP 2 and 4 the vocabulary is padded to 512 and
split: every run here also proves that the padded, vocab-parallel loss is the plain one.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from safetensors.torch import load_file

from paralleljob_contract.jobfile import parse_job_config
from paralleljob_contract.layout import Layout
from testcluster import trainer_harness as harness
from tests.trainer import model_parts
from tests.trainer.reference import ReferenceStep, train_reference

TOLERANCE = 1e-5
STEPS = 8
# lr 0.3 (the GPT proofs') spikes the llama's gradient norm to 30 by step 4, and float rounding alone then
# grows to 3e-5 by step 8: 0.1 trains as visibly without the spike.
SGD = {"type": "SGD", "params": {"lr": 0.1}}
ADAMW = {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}}
OPTIMIZERS = {"sgd": (SGD, 0.0), "adamw-clip": (ADAMW, 0.5)}
LLAMA = {"architecture": "llama", "kvHeads": 2, "vocabSize": 300, "ropeTheta": 500000.0}


def _document(layout: Layout, optimizer: str, model: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    section, clip = OPTIMIZERS[optimizer]
    data = {"source": "text", "path": str(harness.text_corpus())}
    return harness.job_document(
        layout, optimizer=section, gradient_clipping=clip, steps=STEPS, data=data, model=model, **overrides
    )


@functools.cache
def _reference(optimizer: str, model_json: str) -> dict[int, ReferenceStep]:
    document = _document(Layout(1, 1, 1), optimizer, json.loads(model_json))
    return train_reference(parse_job_config(document))


def _run(tmp_path: Path, document: dict[str, Any], *, checkpoints: bool = False) -> Path:
    layout = parse_job_config(document).plan.layout
    gang = harness.Gang()
    checkpoint_dir = tmp_path / "checkpoints" if checkpoints else None
    gang.start(
        harness.write_job(tmp_path, document), tmp_path / "out", nproc=layout.world_size, checkpoint_dir=checkpoint_dir
    )
    result = gang.wait(timeout=240)
    assert result.returncodes == [0], result.logs[0][-3000:]
    return tmp_path / "out"


def _assert_matches_reference(output: Path, optimizer: str, model: dict[str, Any]) -> None:
    reference = _reference(optimizer, json.dumps(model, sort_keys=True))
    logged = harness.steps_by_number(output)
    assert sorted(logged) == list(range(1, STEPS + 1))
    loss_diff = max(abs(logged[s]["loss"] - reference[s].loss) for s in reference)
    norm_diff = max(
        abs(logged[s]["grad_norm"] - reference[s].grad_norm) / max(1.0, reference[s].grad_norm) for s in reference
    )
    assert loss_diff <= TOLERANCE, f"loss differs by {loss_diff:.2e}"
    assert norm_diff <= TOLERANCE, f"grad norm differs by {norm_diff:.2e} (relative)"
    assert reference[STEPS].loss < reference[1].loss - 0.05, "the run must have trained"


@pytest.fixture(scope="module")
def exported_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same llama job at PP2xTP2xDP2 and in one process, each exporting its last checkpoint (hf)."""
    runs = {}
    for name, layout in (("pp2-tp2-dp2", Layout(2, 2, 2)), ("pp1-tp1-dp1", Layout(1, 1, 1))):
        folder = tmp_path_factory.mktemp(name)
        document = _document(layout, "adamw-clip", LLAMA)
        document["spec"]["checkpoint"]["export"] = "hf"
        runs[name] = _run(folder, document, checkpoints=True).parent
    return runs


@pytest.mark.slow
def test_llama_at_pp2_tp2_dp2_reproduces_single_process_losses(exported_runs: dict[str, Path]) -> None:
    _assert_matches_reference(exported_runs["pp2-tp2-dp2"] / "out", "adamw-clip", LLAMA)


@pytest.mark.slow
def test_the_exports_of_two_layouts_are_the_same_model(exported_runs: dict[str, Path]) -> None:
    sharded, single = (
        load_file(exported_runs[name] / "checkpoints" / "export" / "model.safetensors") for name in exported_runs
    )
    assert sorted(sharded) == sorted(single)
    worst = max((sharded[key] - single[key]).abs().max().item() for key in single)
    assert worst <= TOLERANCE, f"the exports differ by {worst:.2e}"
    assert sharded["model.embed_tokens.weight"].shape == (300, 64)  # unpadded


@pytest.mark.slow
def test_paralleljob_export_writes_what_the_trainer_exported(exported_runs: dict[str, Path], tmp_path: Path) -> None:
    job_folder = exported_runs["pp2-tp2-dp2"] / "checkpoints"
    command = [sys.executable, "-m", "paralleljob", "export", str(job_folder), "--output", str(tmp_path / "hf")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        assert (tmp_path / "hf" / name).read_bytes() == (job_folder / "export" / name).read_bytes(), name


@pytest.mark.slow
def test_transformers_reproduces_the_trainers_logits_from_the_pp2_tp2_export(exported_runs: dict[str, Path]) -> None:
    model = parse_job_config(_document(Layout(1, 1, 1), "adamw-clip", LLAMA)).model
    # The trainer's own layers at TP 1, loaded from the one-process run's layer files.
    modules = model_parts.single(model, seed=0)
    latest = exported_runs["pp1-tp1-dp1"] / "checkpoints" / "global_step8"
    for index, module in enumerate(modules):
        module.load_state_dict(torch.load(latest / f"layer_{index:02d}-model_00-model_states.pt", weights_only=True))
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        exported_runs["pp2-tp2-dp2"] / "checkpoints" / "export", dtype=torch.float32
    ).eval()
    tokens = torch.randint(0, 300, (2, 32), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        ours = model_parts.trainer_logits(modules, model, tokens)
        theirs = loaded(input_ids=tokens).logits
    assert (theirs - ours).abs().max().item() < 1e-4


@pytest.mark.slow
def test_llama_at_tp4_with_two_kv_heads_replicates_them_exactly(tmp_path: Path) -> None:
    output = _run(tmp_path, _document(Layout(1, 4, 1), "sgd", LLAMA))
    _assert_matches_reference(output, "sgd", LLAMA)


@pytest.mark.slow
def test_tied_embeddings_across_the_first_and_last_stage(tmp_path: Path) -> None:
    model = {**LLAMA, "tieEmbeddings": True}
    output = _run(tmp_path, _document(Layout(2, 2, 1), "adamw-clip", model))
    _assert_matches_reference(output, "adamw-clip", model)


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["gpt", "llama"])
def test_sequence_parallelism_gives_the_losses_of_one_process(tmp_path: Path, architecture: str) -> None:
    model = LLAMA if architecture == "llama" else {"vocabSize": 300}
    document = _document(Layout(2, 2, 1), "sgd", model)
    document["spec"]["parallelism"]["sequenceParallel"] = True
    _assert_matches_reference(_run(tmp_path, document), "sgd", model)
