"""`paralleljob validate` reads the prepared folders a job names when they are readable where it runs, and says
what the trainer would refuse: a vocabulary larger than spec.model.vocabSize, or an unfinished prepare."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from paralleljob.cli import main
from paralleljob_contract import dataset
from tests.datasets.corpus import REPO, train_tokenizer, write_jsonl

EXAMPLE = REPO / "examples" / "quickstart-prepared.yaml"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("validate")
    tokenizer = train_tokenizer(root / "tokenizer", vocab_size=400).parent
    corpus = write_jsonl(root / "docs.jsonl", ["def first(): pass", "class Second: ...", "third = 3"])
    assert main(["data", "prepare", str(corpus), "--tokenizer", str(tokenizer), "--output", str(root / "out")]) == 0
    return root / "out"


def _job(tmp_path: Path, folder: Path, vocab_size: int) -> Path:
    document = yaml.safe_load(EXAMPLE.read_text())
    document["spec"]["model"]["vocabSize"] = vocab_size
    document["spec"]["training"]["data"]["path"] = str(folder)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_validate_refuses_a_readable_folder_whose_vocabulary_exceeds_the_model(
    prepared: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _job(tmp_path, prepared, vocab_size=256)
    assert main(["validate", str(job)]) == 1
    assert (
        f"{job}: spec.training.data.path: {prepared} was tokenized with a vocabulary of 400, larger than "
        "spec.model.vocabSize (256): raise vocabSize to at least 400"
    ) in capsys.readouterr().out.splitlines()
    assert main(["validate", str(_job(tmp_path, prepared, vocab_size=512))]) == 0


def test_validate_refuses_a_readable_folder_an_interrupted_prepare_left(prepared: Path, tmp_path: Path) -> None:
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / dataset.TOKENS_FILE).write_bytes((prepared / dataset.TOKENS_FILE).read_bytes())
    assert main(["validate", str(_job(tmp_path, unfinished, vocab_size=512))]) == 1
