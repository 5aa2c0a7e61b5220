"""`paralleljob validate FILE...`: check ParallelJob YAML and say what to fix.

Valid jobs print one summary line each; problems print as `FILE: spec.path: message`, warnings marked. A job
whose spec.model.pretrained.path is readable here (relative to the file's folder, as `paralleljob run` reads
it) is also checked against the folder's config.json; a path only a pod sees is left to the trainer's check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from paralleljob.api import documents, verdicts
from paralleljob.api.problems import errors_of
from paralleljob.api.validation import ValidationResult
from paralleljob.datasets import local_folders
from paralleljob_contract import hf_config
from paralleljob_contract.errors import ContractError


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "validate",
        help="check ParallelJob YAML files",
        description="Check ParallelJob YAML (multi-document files, or - for stdin). Exit 0 when every job is "
        "valid, 1 otherwise; every problem is printed as FILE: spec.path: message.",
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="YAML file, or - for standard input")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    all_valid = True
    for path in args.files:
        docs, problems = documents.load_path(path)
        for problem in errors_of(problems):
            print(f"{path}: {problem.render()}")
            all_valid = False
        for doc in docs:
            label = path if len(docs) == 1 else f"{path} (document {doc.index + 1})"
            result, lines = verdicts.report(doc, label)
            folder_problems = _folder_problems(result)
            disagreement = pretrained_disagreement(doc.body, path)
            lines += [f"{label}: {disagreement}"] if disagreement else []
            all_valid = all_valid and result.ok and not folder_problems and not disagreement
            for line in [*lines, *(f"{label}: {problem}" for problem in folder_problems)]:
                print(line, file=sys.stdout)
    return 0 if all_valid else 1


def _folder_problems(result: ValidationResult) -> list[str]:
    """The prepared folders the job names that are readable here and that its trainer would refuse."""
    if result.resolved is None:
        return []
    return local_folders.problems_of_readable_folders(result.resolved.spec)


def pretrained_disagreement(body: Any, file: str) -> str | None:
    """Where spec.model differs from its pretrained folder's config.json, when that folder is readable here."""
    model = body.get("spec", {}).get("model") if isinstance(body, dict) else None
    if not isinstance(model, dict):
        return None
    try:
        folder = hf_config.pretrained_path(model)
        if folder is None:
            return None
        folder = folder if folder.is_absolute() or file == "-" else Path(file).parent / folder
        if not (folder / hf_config.CONFIG_FILE).is_file():
            return None
        return hf_config.disagreement(model, hf_config.read(folder), folder)
    except (ContractError, KeyError, TypeError, ValueError) as error:
        return f"spec.model.pretrained.path: {error}"
