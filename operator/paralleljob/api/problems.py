"""Problems found in a ParallelJob: errors and warnings, each tied to a field path.

Every layer that judges a job (parser, validator, planner) reports with these, so the CLI, the operator's
conditions and the local runner print the same `spec.path: message` lines.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

Severity = Literal["error", "warning"]


@dataclasses.dataclass(frozen=True)
class Problem:
    """One finding: the field it concerns, what is wrong, and how to fix it, in one sentence."""

    path: str
    message: str
    severity: Severity = "error"

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def render(self) -> str:
        """`spec.path: message`, with warnings marked as such."""
        prefix = "warning: " if self.severity == "warning" else ""
        return f"{self.path}: {prefix}{self.message}"


def error(path: str, message: str) -> Problem:
    return Problem(path, message, "error")


def warning(path: str, message: str) -> Problem:
    return Problem(path, message, "warning")


def errors_of(problems: list[Problem]) -> list[Problem]:
    return [p for p in problems if p.is_error]


def warnings_of(problems: list[Problem]) -> list[Problem]:
    return [p for p in problems if not p.is_error]
