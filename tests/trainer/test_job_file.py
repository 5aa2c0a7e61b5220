"""The trainer's reading of job.json: defaults, and a one-line error naming the field for each bad value."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from paralleljob_contract.errors import ContractError
from paralleljob_contract.jobfile import load_job_config, parse_job_config
from paralleljob_contract.layout import Layout
from testcluster import trainer_harness as harness

SGD = {"type": "SGD", "params": {"lr": 0.1}}


def _job(**changes: Any) -> dict[str, Any]:
    document = harness.job_document(Layout(2, 2, 2), optimizer=SGD)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        target = document
        for key in parents:
            target = target[key]
        target[leaf] = value
    return document


def test_defaults_fill_what_the_spec_leaves_out() -> None:
    document = _job()
    del document["spec"]["model"]["precision"]
    job = parse_job_config(document)
    assert job.model.ffn_hidden_size == 4 * job.model.hidden_size
    assert job.model.precision == "bf16"
    assert job.model.activation_checkpoint_interval == 0
    assert job.plan.axis_order == ("pipe", "data", "model")
    assert job.plan.ranks_per_node == 8
    assert job.train_batch_size == 8 and job.gradient_accumulation_steps == 2


BAD = {
    "layers-below-pipeline": (_job(spec__model__layers=1), "spec.model.layers (1) is smaller than"),
    "heads-not-divisible-by-tp": (_job(spec__model__attentionHeads=3, spec__model__hiddenSize=48), "(3) is not"),
    "hidden-not-divisible-by-heads": (_job(spec__model__hiddenSize=66), "hiddenSize (66) is not divisible"),
    "unknown-precision": (_job(spec__model__precision="fp8"), "spec.model.precision: must be one of"),
    "unknown-source": (_job(spec__training__data={"source": "parquet"}), "spec.training.data.source"),
    "text-without-path": (_job(spec__training__data={"source": "text"}), "data.path: required"),
    "missing-file": (
        _job(spec__training__data={"source": "tokens", "path": "/no/such/file.bin"}),
        "/no/such/file.bin does not exist",
    ),
    "byte-text-needs-256": (
        _job(spec__model__vocabSize=100, spec__training__data={"source": "text", "path": "/"}),
        "vocabSize (100) is below 256",
    ),
    "batch-arithmetic": (_job(deepspeed__train_batch_size=12), "train_batch_size (12) != micro batch 2"),
    "unknown-architecture": (_job(spec__model__architecture="mamba"), "spec.model.architecture: must be one of"),
    "kv-heads-on-gpt": (_job(spec__model__kvHeads=2), "spec.model.kvHeads: grouped-query attention needs"),
    "tied-gpt": (_job(spec__model__tieEmbeddings=True), "spec.model.tieEmbeddings: tied embeddings need"),
    "kv-heads-not-dividing-heads": (
        _job(spec__model__architecture="llama", spec__model__kvHeads=3),
        "kvHeads (3) does not divide attentionHeads (4)",
    ),
    "odd-rotary-head": (
        _job(spec__model__architecture="llama", spec__model__hiddenSize=36),
        "(9) must be even: rotary embeddings",
    ),
    "rope-theta-below-1": (_job(spec__model__ropeTheta=0.5), "spec.model.ropeTheta: must be a number"),
    "sequence-parallel-uneven": (
        _job(spec__parallelism__sequenceParallel=True, spec__model__sequenceLength=33),
        "sequenceParallel needs parallelism.tensor > 1 dividing model.sequenceLength (33)",
    ),
    "unknown-export": (_job(spec__checkpoint__export="onnx"), "spec.checkpoint.export: must be one of hf"),
    "zero-steps": (_job(spec__training__steps=0), "spec.training.steps: must be at least 1"),
    "axis-order": (_job(plan__axisOrder=["pipe", "model"]), "plan.axisOrder: must order exactly"),
    "world-size": (_job(plan__worldSize=4), "plan.worldSize: 4 is not pipeline x tensor x data = 8"),
    "ranks-per-node": (_job(plan__ranksPerNode=3), "plan.ranksPerNode: 3 does not divide worldSize 8"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_job_is_rejected_with_the_field_named(case: str) -> None:
    document, message = BAD[case]
    with pytest.raises(ContractError, match=None) as raised:
        parse_job_config(copy.deepcopy(document))
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_unreadable_job_file_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "job.json").write_text("{not json")
    with pytest.raises(ContractError, match="is not readable JSON"):
        load_job_config(tmp_path / "job.json")
    with pytest.raises(ContractError, match="does not exist"):
        load_job_config(tmp_path / "absent.json")


def test_help_documents_every_option() -> None:
    env = harness.trainer_env(Path("job.json"), Path("out"), None, {})
    help_text = subprocess.run(
        [sys.executable, "-m", "paralleljob_trainer", "--help"], env=env, capture_output=True, text=True, check=True
    ).stdout
    for option, variable in [
        ("--config", "PARALLELJOB_CONFIG"),
        ("--output", "PARALLELJOB_OUTPUT_DIR"),
        ("--checkpoint-dir", "PARALLELJOB_CHECKPOINT_DIR"),
        ("--progress-hook", "PARALLELJOB_PROGRESS_HOOK"),
        ("--peak-tflops", "PARALLELJOB_PEAK_TFLOPS"),
    ]:
        assert option in help_text and variable in help_text


def test_job_file_round_trips_through_json(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_text(json.dumps(_job()))
    assert load_job_config(path).plan.layout.world_size == 8


def test_the_checkpoint_settings_and_the_job_uid_are_read_with_their_defaults() -> None:
    job = parse_job_config(_job())
    assert (job.checkpoint_keep, job.uid, job.zero_stage) == (3, None, 0)
    document = _job(spec__checkpoint__keep=1, metadata__uid="0b6c-uid")
    document["deepspeed"]["zero_optimization"] = {"stage": 1}
    job = parse_job_config(document)
    assert (job.checkpoint_keep, job.uid, job.zero_stage) == (1, "0b6c-uid", 1)
    with pytest.raises(ContractError, match=r"spec.checkpoint.keep: must be at least 1, got 0"):
        parse_job_config(_job(spec__checkpoint__keep=0))


@pytest.mark.parametrize(
    ("steps", "interval", "saved"),
    [(5, 3, [3, 5]), (5, 10, [5]), (6, 3, [3, 6]), (4, 0, [4])],
    ids=["interval-then-last", "interval-beyond-steps", "last-on-interval", "interval-zero"],
)
def test_the_last_step_is_always_a_checkpoint_step(steps: int, interval: int, saved: list[int]) -> None:
    from paralleljob_trainer.training import _is_checkpoint_step

    job = parse_job_config(_job(spec__training__steps=steps, spec__checkpoint__intervalSteps=interval))
    assert [step for step in range(1, steps + 1) if _is_checkpoint_step(job, step)] == saved
