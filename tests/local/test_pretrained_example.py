"""The worked fine-tuning example, run as docs/trainer.md tells a user to: scripts/make_tiny_llama.py writes the
folder, `paralleljob model-spec` prints the example's spec.model, and `paralleljob run` fine-tunes it at TP 2 with
sequence parallelism. Step 1's loss is transformers' own loss of that folder on the same global batch, so the run
started from the folder's weights, not from a random initialisation."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest
import torch
import yaml
from safetensors.torch import load_file

from paralleljob_contract.jobfile import parse_job_config
from paralleljob_trainer import data
from tests.trainer import hf_models

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama-tiny-pretrained.yaml"
PARALLELJOB = [sys.executable, "-m", "paralleljob"]
TOLERANCE = 1e-5


def made_folder(tmp_path: pathlib.Path) -> pathlib.Path:
    folder = tmp_path / "tiny-llama"
    made = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_tiny_llama.py"), str(folder)], capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr[-2000:]
    return folder


def test_the_scripts_folder_gives_the_examples_model_section(tmp_path: pathlib.Path) -> None:
    folder = made_folder(tmp_path)
    printed = subprocess.run([*PARALLELJOB, "model-spec", str(folder)], capture_output=True, text=True)
    assert printed.returncode == 0, printed.stderr
    example = yaml.safe_load(EXAMPLE.read_text())["spec"]["model"]
    section = yaml.safe_load(printed.stdout)
    section = section.get("model", section)
    # The example trains at fp32 on short sequences and names the folder; every shape field is the script's.
    ours = {k: v for k, v in example.items() if k not in ("pretrained", "precision", "sequenceLength")}
    assert {k: section.get(k) for k in ours} == ours


@pytest.mark.slow
def test_the_worked_example_fine_tunes_the_scripts_llama_from_its_weights(tmp_path: pathlib.Path) -> None:
    folder = made_folder(tmp_path)
    document = yaml.safe_load(EXAMPLE.read_text())
    spec = document["spec"]
    spec["model"]["pretrained"]["path"] = str(folder)
    spec["training"]["data"]["path"] = str(ROOT / "operator" / "paralleljob")
    spec["training"]["logInterval"] = 1
    job_file, output = tmp_path / "job.yaml", tmp_path / "out"
    job_file.write_text(yaml.safe_dump(document))

    run = subprocess.run(
        [*PARALLELJOB, "run", str(job_file), "--output", str(output)], capture_output=True, text=True, timeout=400
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = json.loads((output / "summary.json").read_text())
    assert summary["succeeded"] and summary["steps_done"] == spec["training"]["steps"]
    assert summary["last_loss"] < summary["first_loss"]

    job = parse_job_config(json.loads((output / "job.json").read_text()))  # what the trainer read
    stream = data.open_stream(job.training.data, job.model.vocab_size, job.model.sequence_length, job.training.seed)
    inputs, labels = stream.global_batch(1, slice(None), job.train_batch_size)
    records = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in records if r["event"] == "step" and r["step"] == 1)
    expected = hf_models.transformers_loss(folder, inputs, labels)
    assert abs(first["loss"] - expected) <= TOLERANCE, f"step 1 loss {first['loss']} against transformers' {expected}"

    # The export is a folder transformers reads, with the fine-tuned weights (moved from the folder's).
    export = output / "checkpoints" / "export"
    exported, original = load_file(export / "model.safetensors"), load_file(folder / "model.safetensors")
    assert sorted(exported) == sorted(original)
    assert not torch.equal(exported["model.embed_tokens.weight"], original["model.embed_tokens.weight"])
    assert hf_models.transformers_loss(export, inputs, labels) < expected
