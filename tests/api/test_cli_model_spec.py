"""`paralleljob model-spec DIR` prints the spec.model of a Hugging Face folder, and `paralleljob validate` checks a
job against the folder's config.json when the folder is readable (folders made in the test with transformers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from paralleljob.cli import main
from tests.api.jobs import job
from tests.trainer import hf_models


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hf_models.llama(tmp_path_factory.mktemp("hf") / "tiny-llama", layers=2)


def test_model_spec_prints_the_section_a_job_needs(llama_folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model-spec", str(llama_folder)]) == 0
    model = yaml.safe_load(capsys.readouterr().out)["model"]
    assert model == {
        "architecture": "llama",
        "layers": 2,
        "hiddenSize": 64,
        "attentionHeads": 4,
        "kvHeads": 2,
        "sequenceLength": 32,
        "vocabSize": 300,
        "ffnHiddenSize": 128,
        "ropeTheta": 500000.0,
        "tieEmbeddings": False,
        "pretrained": {"path": str(llama_folder)},
    }


def test_model_spec_of_gpt2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model-spec", str(hf_models.gpt2(tmp_path / "gpt2", layers=1))]) == 0
    model = yaml.safe_load(capsys.readouterr().out)["model"]
    assert (model["architecture"], model["ffnHiddenSize"], model["sequenceLength"]) == ("gpt", 256, 32)


def test_model_spec_refuses_an_unknown_architecture(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    assert main(["model-spec", str(tmp_path)]) == 1
    assert "BertModel" in capsys.readouterr().err


def _write_job(folder: Path, model: dict) -> Path:
    document = job(spec__model={**model, "precision": "fp32"})
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_validate_accepts_the_printed_section_and_names_a_disagreeing_field(
    llama_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["model-spec", str(llama_folder)])
    model = yaml.safe_load(capsys.readouterr().out)["model"]
    assert main(["validate", str(_write_job(tmp_path, model))]) == 0
    capsys.readouterr()
    # A relative path is read against the job file's folder, as `paralleljob run` reads it.
    relative = {**model, "hiddenSize": 128, "pretrained": {"path": "../" + llama_folder.parent.name + "/tiny-llama"}}
    assert main(["validate", str(_write_job(tmp_path, relative))]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert any("spec.model.hiddenSize is 128 but" in line and "says 64" in line for line in lines), lines


def test_validate_leaves_a_pod_only_path_to_the_trainer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = {"architecture": "llama", "layers": 2, "hiddenSize": 64, "attentionHeads": 4, "sequenceLength": 32}
    model |= {"vocabSize": 300, "pretrained": {"path": "/models/not-here"}}
    assert main(["validate", str(_write_job(tmp_path, model))]) == 0
