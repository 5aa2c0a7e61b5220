"""In one process: every TP rank's layers loaded from a Hugging Face folder and merged back by the export give
the folder's tensors bit for bit; at TP 1 they compute transformers' logits; a pipeline stage built to be loaded
draws no random weights first; folders that cannot be mapped, and jobs that disagree with config.json, are
refused in one line naming the tensor or the field.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from paralleljob_contract import hf_config
from paralleljob_contract.errors import ContractError
from paralleljob_contract.jobfile import JobConfig, parse_job_config
from paralleljob_contract.layout import Layout
from paralleljob_trainer import export, pretrained
from paralleljob_trainer.tensor_parallel import TensorParallel
from testcluster import trainer_harness as harness
from tests.trainer import hf_models, model_parts

SGD = {"type": "SGD", "params": {"lr": 0.0}}
FOLDERS = {
    "llama-sharded": lambda folder: hf_models.llama(folder, sharded=True),
    "llama-tied-mha": lambda folder: hf_models.llama(folder, kv_heads=4, tied=True),
    "gpt2": hf_models.gpt2,
}


def _section(folder: Path, **changes: Any) -> dict[str, Any]:
    return hf_models.model_section(hf_config.spec_model(hf_config.read(folder)), folder) | changes


def _job(folder: Path, tensor: int, **changes: Any) -> JobConfig:
    return parse_job_config(
        harness.job_document(Layout(1, tensor, 1), optimizer=SGD, model=_section(folder, **changes))
    )


def _folder_tensors(folder: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors |= load_file(path)
    return tensors


@pytest.fixture(scope="module", params=list(FOLDERS))
def folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return FOLDERS[request.param](tmp_path_factory.mktemp(request.param))


@pytest.mark.parametrize("tensor", [1, 2, 4])
def test_loading_then_exporting_gives_the_folders_tensors_bit_for_bit(folder: Path, tensor: int) -> None:
    job = _job(folder, tensor)
    ranks = []
    for rank in range(tensor):
        tp = TensorParallel(rank=rank, size=tensor)
        modules = model_parts.layer_modules(job.model, 0, tp)
        pretrained.load_modules(enumerate(modules), job.model, tp, folder)
        ranks.append(modules)

    def load(layer: int) -> list[dict[str, torch.Tensor]]:
        return [{k: v.detach() for k, v in modules[layer].state_dict().items()} for modules in ranks]

    exported = export.merged_tensors(model_parts.manifest_model(job.model), load, tensor)
    original = _folder_tensors(folder)
    if "transformer.wte.weight" in original:  # GPT-2's head is tied to wte: the trainer holds an untied copy
        assert torch.equal(exported.pop("lm_head.weight"), original["transformer.wte.weight"])
    assert sorted(exported) == sorted(original)
    different = [name for name in original if not torch.equal(exported[name], original[name])]
    assert different == []


def test_the_loaded_layers_compute_transformers_logits(folder: Path) -> None:
    job = _job(folder, 1)
    modules = model_parts.single(job.model, 0)
    pretrained.load_modules(enumerate(modules), job.model, TensorParallel(rank=0, size=1), folder)
    tokens = torch.randint(0, hf_models.VOCAB, (2, hf_models.SEQUENCE), generator=torch.Generator().manual_seed(1))
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        ours = model_parts.trainer_logits(modules, job.model, tokens)
        theirs = reference(input_ids=tokens).logits
    assert (ours - theirs).abs().max().item() < 1e-5


def _build_stage(tmp_path: Path, folder: Path, mode: str) -> dict[str, Any]:
    """The stage `tests/trainer/pipeline_build_worker.py` builds (`pretrained` or `random`), and its draws."""
    job = harness.write_job(
        tmp_path / mode, harness.job_document(Layout(1, 1, 1), optimizer=SGD, model=_section(folder))
    )
    out = tmp_path / mode / "stage.pt"
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(harness.free_port())}
    env |= {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    worker = [sys.executable, "-m", "tests.trainer.pipeline_build_worker", str(job), str(out), mode]
    done = subprocess.run(worker, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    built: dict[str, Any] = torch.load(out, weights_only=True)
    return built


@pytest.mark.parametrize(
    "make", [hf_models.gpt2, lambda folder: hf_models.llama(folder, tied=True)], ids=["gpt2", "llama-tied"]
)
def test_a_stage_built_to_be_loaded_draws_no_random_weights_and_holds_the_folders(tmp_path: Path, make: Any) -> None:
    folder = make(tmp_path / "hf")
    loaded, drawn = _build_stage(tmp_path, folder, "pretrained"), _build_stage(tmp_path, folder, "random")
    assert drawn["draws"], "a random start draws its weights (the count sees them)"
    assert loaded["draws"] == []
    job = _job(folder, 1)
    modules = model_parts.layer_modules(job.model, 0, TensorParallel(rank=0, size=1))
    pretrained.load_modules(enumerate(modules), job.model, TensorParallel(rank=0, size=1), folder)
    expected = {
        f"{layer}.{key}": value for layer, module in enumerate(modules) for key, value in module.state_dict().items()
    }
    state = {key.replace("tied_modules.embeddings.", "0."): value for key, value in loaded["state"].items()}
    assert sorted(state) == sorted(expected)
    assert [key for key in expected if not torch.equal(state[key], expected[key])] == []


def test_config_json_settings_reach_the_model(tmp_path: Path) -> None:
    llama = _job(hf_models.llama(tmp_path / "llama"), 1).model
    assert llama.norm_eps == 1e-6 and llama.rope_theta == 500000.0
    assert llama.rope_scaling is not None and llama.rope_scaling.original_max_position_embeddings == 16
    gpt = _job(hf_models.gpt2(tmp_path / "gpt2"), 1).model
    assert (gpt.activation, gpt.norm_eps) == ("gelu_new", 1e-6)


def test_a_job_that_disagrees_with_config_json_is_refused_naming_the_field(tmp_path: Path) -> None:
    folder = hf_models.llama(tmp_path / "llama", layers=2)
    with pytest.raises(ContractError) as refused:
        _job(folder, 1, ffnHiddenSize=256)
    message = str(refused.value)
    assert "spec.model.ffnHiddenSize is 256" in message and "says 128" in message and "model-spec" in message
    with pytest.raises(ContractError, match=r"spec.model.kvHeads is 4 .* says 2"):
        _job(folder, 1, kvHeads=4)


def test_an_unknown_architecture_is_refused(tmp_path: Path) -> None:
    folder = hf_models.llama(tmp_path / "llama", layers=2)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["MistralForCausalLM"]}))
    with pytest.raises(ContractError, match="architectures \\['MistralForCausalLM'\\] is none this trainer maps"):
        hf_config.spec_model(hf_config.read(folder))


def test_a_missing_or_misshapen_tensor_is_refused_naming_it(tmp_path: Path) -> None:
    folder = hf_models.llama(tmp_path / "llama", layers=2)
    job = _job(folder, 2)
    tensors = load_file(folder / "model.safetensors")
    up = "model.layers.1.mlp.up_proj.weight"
    save_file({k: v for k, v in tensors.items() if k != up}, folder / "model.safetensors")
    with pytest.raises(pretrained.PretrainedError, match=f"has no tensor {up}"):
        pretrained.check_folder(job.model, 2, folder)
    save_file({**tensors, up: tensors[up][:64]}, folder / "model.safetensors")
    with pytest.raises(pretrained.PretrainedError, match=f"tensor {up} has shape \\[64, 64\\], .* needs \\[128, 64\\]"):
        pretrained.check_folder(job.model, 2, folder)
