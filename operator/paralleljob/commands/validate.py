"""`paralleljob validate FILE...`: check ParallelJob YAML and say what to fix.

Valid jobs print one summary line each; problems print as `FILE: spec.path: message`, warnings marked.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from paralleljob.api import documents, verdicts
from paralleljob.api.problems import errors_of
from paralleljob.api.validation import ValidationResult
from paralleljob.datasets import local_folders


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
            all_valid = all_valid and result.ok and not folder_problems
            for line in [*lines, *(f"{label}: {problem}" for problem in folder_problems)]:
                print(line, file=sys.stdout)
    return 0 if all_valid else 1


def _folder_problems(result: ValidationResult) -> list[str]:
    """The prepared folders the job names that are readable here and that its trainer would refuse."""
    if result.resolved is None:
        return []
    return local_folders.problems_of_readable_folders(result.resolved.spec)
