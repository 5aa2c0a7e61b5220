"""Training from folders made by `paralleljob data prepare`: the vocabulary check before any process group, a
weighted blend of two folders drawn in proportion and resumed on the same curve, and the held-out validation
loss of a 2x2x2 gang equal to one process's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from paralleljob.datasets.prepare import load_tokenizer, prepare
from paralleljob_contract import dataset
from paralleljob_contract.errors import ContractError
from paralleljob_contract.jobfile import parse_job_config
from paralleljob_contract.layout import Layout
from paralleljob_contract.training_data import DataConfig, WeightedSource
from paralleljob_trainer import data
from testcluster import trainer_harness as harness
from tests.datasets.corpus import REPO, train_tokenizer
from tests.trainer.reference import train_reference

LAYOUT = Layout(pipeline=2, tensor=2, data=2)
ADAMW = {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}}
TOKENIZER_VOCAB = 400


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two prepared folders of different text (the API's sources, the handlers' sources), one tokenizer."""
    root = tmp_path_factory.mktemp("prepared")
    tokenizer = load_tokenizer(train_tokenizer(root / "tokenizer", vocab_size=TOKENIZER_VOCAB))
    api, handlers = root / "api", root / "handlers"
    prepare([REPO / "operator" / "paralleljob" / "api"], tokenizer, api, workers=1)
    prepare([REPO / "operator" / "paralleljob" / "handlers"], tokenizer, handlers, workers=1)
    return api, handlers


def _document(training_data: dict[str, Any], vocab_size: int, **overrides: Any) -> dict[str, Any]:
    model = {"vocabSize": vocab_size}
    return harness.job_document(LAYOUT, optimizer=ADAMW, model=model, data=training_data, **overrides)


def test_a_vocabulary_larger_than_the_model_is_refused_in_one_line_with_both_numbers(
    folders: tuple[Path, Path],
) -> None:
    document = _document({"source": "tokens", "path": str(folders[0])}, vocab_size=256)
    with pytest.raises(ContractError) as refused:
        parse_job_config(document)
    assert str(refused.value) == (
        f"spec.training.data.path: {folders[0]} was tokenized with a vocabulary of {TOKENIZER_VOCAB}, larger "
        f"than spec.model.vocabSize (256): raise vocabSize to at least {TOKENIZER_VOCAB}"
    )
    assert parse_job_config(_document({"source": "tokens", "path": str(folders[0])}, vocab_size=512))


def test_every_rank_refuses_the_vocabulary_before_any_process_group_forms(
    folders: tuple[Path, Path], tmp_path: Path
) -> None:
    blend = {"sources": [{"path": str(folders[0]), "weight": 1}, {"path": str(folders[1]), "weight": 1}]}
    job = harness.write_job(tmp_path, _document(blend, vocab_size=256))
    gang = harness.Gang()
    # Every rank of the 8-rank gang alone would wait for its peers in the rendezvous; each must exit first.
    gang.start_ranks(job, tmp_path / "out", world=LAYOUT.world_size)
    result = gang.wait(timeout=60)
    assert result.returncodes == [2] * LAYOUT.world_size
    for log in result.logs:
        assert log.strip().endswith(f"vocabulary of {TOKENIZER_VOCAB}, larger than spec.model.vocabSize (256): "
                                    f"raise vocabSize to at least {TOKENIZER_VOCAB}")  # fmt: skip
        assert "Traceback" not in log


def test_an_interrupted_prepare_is_refused_by_the_job_file(folders: tuple[Path, Path], tmp_path: Path) -> None:
    unfinished = tmp_path / ".prepared.staging"
    shutil.copytree(folders[0], unfinished)
    (unfinished / dataset.METADATA_FILE).unlink()
    with pytest.raises(ContractError, match="not a finished `paralleljob data prepare` folder"):
        parse_job_config(_document({"source": "tokens", "path": str(unfinished)}, vocab_size=512))


def test_a_blend_draws_each_folder_in_its_weight_and_each_window_from_that_folder(folders: tuple[Path, Path]) -> None:
    sources = (WeightedSource(folders[0], 3.0), WeightedSource(folders[1], 1.0))
    stream = data.open_stream(DataConfig("tokens", None, "uint16", sources), 512, sequence_length=16, seed=5)
    steps, batch = 200, 64
    which = np.concatenate([stream.draws(step, batch)[0] for step in range(1, steps + 1)])
    share = float(np.mean(which == 0))
    sigma = (0.75 * 0.25 / (steps * batch)) ** 0.5
    assert abs(share - 0.75) < 4 * sigma, f"folder 0 drew {share:.4f} of the rows, expected 0.75 +- {4 * sigma:.4f}"

    tokens = [np.fromfile(f / dataset.TOKENS_FILE, dtype=np.uint16) for f in folders]
    inputs, labels = stream.global_batch(7, slice(None), batch)
    picked, starts = stream.draws(7, batch)
    for row, (source, start) in enumerate(zip(picked, starts, strict=True)):
        assert inputs[row].tolist() == tokens[source][start : start + 16].tolist()
        assert labels[row].tolist() == tokens[source][start + 1 : start + 17].tolist()
    # A data-parallel rank's rows are its slice of the same global batch: draws depend on (seed, step) alone.
    assert stream.global_batch(7, slice(32, 64), batch)[0].tolist() == inputs[32:].tolist()


def test_held_out_documents_are_cut_at_a_document_boundary_and_never_trained_on(folders: tuple[Path, Path]) -> None:
    document = _document({"source": "tokens", "path": str(folders[0])}, 512)
    document["spec"]["training"]["eval"] = {"heldOutFraction": 0.25}
    training = parse_job_config(document).training
    train = data.open_stream(training.data, 512, 16, seed=1, held_out_fraction=0.25)
    held = data.open_eval_stream(training, 512, 16)
    prepared = dataset.read_prepared(folders[0], "test")
    offsets = np.fromfile(prepared.offsets_path, dtype=np.uint64)
    cut = int(offsets[prepared.documents - max(1, round(0.25 * prepared.documents))])
    tokens = np.fromfile(prepared.tokens_path, dtype=np.uint16)
    assert held is not None and len(train.sources[0]) == cut
    assert held.sources[0].tolist() == tokens[cut:].tolist()
    assert int(tokens[cut - 1]) == int(tokens[-1]) == prepared.end_of_document_id


def test_an_eval_folder_is_read_whole_and_the_training_folder_keeps_every_document(
    folders: tuple[Path, Path],
) -> None:
    document = _document({"source": "tokens", "path": str(folders[0])}, 512)
    document["spec"]["training"]["eval"] = {"path": str(folders[1])}
    training = parse_job_config(document).training
    train = data.open_stream(training.data, 512, 16, seed=1)
    held = data.open_eval_stream(training, 512, 16)
    tokens = {folder: np.fromfile(dataset.read_prepared(folder, "test").tokens_path, np.uint16) for folder in folders}
    assert train.sources[0].tolist() == tokens[folders[0]].tolist()
    assert held is not None and [s.tolist() for s in held.sources] == [tokens[folders[1]].tolist()]
    # Every window the evaluation draws is a run of the eval folder's tokens.
    held_tokens = tokens[folders[1]]
    for row in held.global_batch(0, slice(0, 4), 4)[0].numpy():
        starts = np.flatnonzero(held_tokens[: len(held_tokens) - len(row) + 1] == row[0])
        assert any((held_tokens[i : i + len(row)] == row).all() for i in starts), row


@pytest.mark.parametrize(
    ("evaluation", "field"),
    [
        ({"path": "short"}, "spec.training.eval.path: "),
        ({"heldOutFraction": 0.5}, "spec.training.eval.heldOutFraction: the held-out documents of "),
    ],
    ids=["eval-folder", "held-out-tail"],
)
def test_evaluation_tokens_too_few_for_one_window_are_refused_naming_the_eval_field(
    folders: tuple[Path, Path], tmp_path: Path, evaluation: dict[str, Any], field: str
) -> None:
    """The held-out stream's own field, not spec.training.data, which was named for both before."""
    tokenizer = load_tokenizer(train_tokenizer(tmp_path / "tokenizer", vocab_size=TOKENIZER_VOCAB))
    (tmp_path / "docs").mkdir()
    for index, text in enumerate(["a short document.\n", "and another one, also short.\n"]):
        (tmp_path / "docs" / f"{index}.txt").write_text(text)
    short = tmp_path / "short"
    prepare([tmp_path / "docs"], tokenizer, short, workers=1)
    training_folder = short if "heldOutFraction" in evaluation else folders[0]
    document = _document({"source": "tokens", "path": str(training_folder)}, 512)
    document["spec"]["training"]["eval"] = {**evaluation, **({"path": str(short)} if "path" in evaluation else {})}
    training = parse_job_config(document).training

    with pytest.raises(ContractError) as refused:
        data.open_eval_stream(training, 512, 64)
    assert str(refused.value).startswith(field), refused.value
    assert "fewer than sequenceLength + 1 (65)" in str(refused.value)


@pytest.mark.slow
def test_a_blend_with_held_out_evaluation_matches_one_process_at_2x2x2_and_resumes_on_the_same_curve(
    folders: tuple[Path, Path], tmp_path: Path
) -> None:
    blend = {"sources": [{"path": str(folders[0]), "weight": 3}, {"path": str(folders[1]), "weight": 1}]}

    def document(steps: int) -> dict[str, Any]:
        result = _document(blend, 512, steps=steps, checkpoint_interval=4, warmup_steps=0)
        # A constant learning rate: the 4-step run and its 8-step continuation follow one schedule.
        result["spec"]["training"] |= {
            "minLrRatio": 1.0,
            "eval": {"heldOutFraction": 0.2, "intervalSteps": 2, "batches": 2},
        }
        return result

    for steps in (4, 8):
        gang = harness.Gang()
        job = harness.write_job(tmp_path / f"job{steps}", document(steps))
        gang.start(job, tmp_path / "out", nproc=LAYOUT.world_size, checkpoint_dir=tmp_path / "ckpt")
        result = gang.wait(timeout=300)
        assert result.returncodes == [0], result.logs[0][-3000:]

    logged = harness.steps_by_number(tmp_path / "out")
    assert sorted(logged) == list(range(1, 9))
    assert harness.records(tmp_path / "out", "summary")[-1]["resumed_from"] == 4
    reference = train_reference(parse_job_config(document(8)))
    worst = max(abs(logged[s]["loss"] - reference[s].loss) for s in reference)
    assert worst <= 1e-5, f"training losses differ from one process by {worst:.2e}"
    validation = {s: r["validation_loss"] for s, r in logged.items() if "validation_loss" in r}
    assert sorted(validation) == [2, 4, 6, 8]
    for step, loss in validation.items():
        assert reference[step].validation_loss is not None
        assert abs(loss - reference[step].validation_loss) <= 1e-5, (step, loss, reference[step].validation_loss)
    assert all(logged[s]["eval_s"] > 0 and logged[s]["eval_batches"] == 2 for s in validation)
    assert json.dumps(validation)  # the record is plain JSON
