"""Reading ParallelJob YAML and cluster files: files, multi-document streams and stdin, with one-line errors.

JSON (what `kubectl get nodes -o json` prints) is read with the standard library's C parser; YAML with
libyaml's C loader where PyYAML was built with it (pure-Python YAML takes minutes on a 10,000-node
NodeList). Malformed input is reported as a Problem naming the line, never as a traceback.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

import yaml

from paralleljob.api.problems import Problem, error

# The same safe constructors either way; libyaml's parser is about ten times faster.
YAML_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclasses.dataclass(frozen=True)
class Document:
    """One YAML document and where it came from."""

    source: str
    index: int
    body: Any


def load_text(text: str, source: str) -> tuple[list[Document], list[Problem]]:
    """Split a YAML stream into documents; empty documents are skipped. A JSON document (text that starts
    with `{` or `[` and parses as JSON) is one document."""
    if text.lstrip()[:1] in ("{", "["):
        try:
            body = json.loads(text)
        except json.JSONDecodeError:
            body = None  # not JSON after all: a YAML flow mapping, or broken; YAML says which
        if body is not None:
            return [Document(source, 0, body)], []
    try:
        bodies = [body for body in yaml.load_all(text, Loader=YAML_LOADER) if body is not None]
    except yaml.YAMLError as exc:
        return [], [error("(yaml)", f"{_yaml_error(exc)}; fix the YAML syntax.")]
    if not bodies:
        return [], [error("(yaml)", "contains no document; write a ParallelJob.")]
    return [Document(source, i, body) for i, body in enumerate(bodies)], []


def _yaml_error(exc: yaml.YAMLError) -> str:
    """Where and what: the construct that was open (libyaml marks the problem where it noticed it, often the
    next line), then the problem."""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    mark = getattr(exc, "problem_mark", None)
    if context and context_mark is not None:
        noticed = f" (noticed at line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        return f"line {context_mark.line + 1}, column {context_mark.column + 1}: {context}, {problem}{noticed}"
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark is not None else problem


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
