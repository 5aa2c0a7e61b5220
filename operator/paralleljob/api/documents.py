"""Reading ParallelJob YAML: files, multi-document streams and stdin, with one-line errors.

Malformed YAML is reported as a Problem naming the line, never as a traceback.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import yaml

from paralleljob.api.problems import Problem, error


@dataclasses.dataclass(frozen=True)
class Document:
    """One YAML document and where it came from."""

    source: str
    index: int
    body: Any


def load_text(text: str, source: str) -> tuple[list[Document], list[Problem]]:
    """Split a YAML stream into documents; empty documents are skipped."""
    try:
        bodies = [body for body in yaml.safe_load_all(text) if body is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        return [], [error("(yaml)", f"{where}{problem}; fix the YAML syntax.")]
    if not bodies:
        return [], [error("(yaml)", "contains no document; write a ParallelJob.")]
    return [Document(source, i, body) for i, body in enumerate(bodies)], []


def load_path(path: str) -> tuple[list[Document], list[Problem]]:
    """Load a file, or standard input for '-'."""
    if path == "-":
        return load_text(sys.stdin.read(), "-")
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        return [], [error("(file)", f"cannot be read: {exc.strerror or exc}; check the path.")]
    except UnicodeDecodeError:
        return [], [error("(file)", "is not UTF-8 text; save it as UTF-8 YAML.")]
    return load_text(text, path)
