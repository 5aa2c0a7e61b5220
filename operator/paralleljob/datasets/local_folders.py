"""What `paralleljob validate` can say about the prepared folders a job names, where they are readable here.

A job's paths are the pod's; on the machine that validates it they are usually absent, and then nothing is said.
A folder that is here is read as the trainer reads it (`paralleljob_contract.dataset`): an unfinished prepare,
or a vocabulary larger than spec.model.vocabSize, is a problem now rather than at the pods' start.
"""

from __future__ import annotations

from pathlib import Path

from paralleljob.api.types import ParallelJobSpec
from paralleljob_contract import dataset
from paralleljob_contract.errors import ContractError


def named_folders(spec: ParallelJobSpec) -> list[tuple[Path, str]]:
    """(folder, field path) of every prepared folder the spec names: data.path of tokens, data.sources, eval.path."""
    data, evaluation = spec.training.data, spec.training.eval
    found = []
    if data.source == "tokens" and data.path:
        found.append((Path(data.path), "spec.training.data.path"))
    for index, source in enumerate(data.sources or []):
        found.append((Path(source.path), f"spec.training.data.sources[{index}].path"))
    if evaluation is not None and evaluation.path:
        found.append((Path(evaluation.path), "spec.training.eval.path"))
    return found


def problems_of_readable_folders(spec: ParallelJobSpec) -> list[str]:
    """One line per prepared folder that is here and that the trainer would refuse."""
    vocab_size = spec.model.vocab_size
    problems = []
    for folder, where in named_folders(spec):
        if not folder.is_dir():
            continue
        try:
            dataset.check_vocabulary_fits(dataset.read_prepared(folder, where), vocab_size, where)
        except ContractError as error:
            problems.append(str(error))
    return problems
