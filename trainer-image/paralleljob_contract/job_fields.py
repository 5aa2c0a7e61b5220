"""Readers of job.json's fields: each checks one value's type and range and raises ContractError naming the field,
so that every rank exits with the same one-line message (`jobfile` reads the file with them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from paralleljob_contract.errors import ContractError


def section(parent: Mapping[str, Any], key: str, where: str | None = None) -> Mapping[str, Any]:
    value = parent.get(key)
    if not isinstance(value, Mapping):
        raise ContractError(f"{where or key}: missing or not an object in the job file")
    return value


def optional_section(parent: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    """A section that may be absent (read as empty), but is an object when present."""
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ContractError(f"{where}: must be an object in the job file, got {value!r}")
    return value


def integer(section: Mapping[str, Any], key: str, where: str, *, default: int | None = None, minimum: int = 1) -> int:
    value = section.get(key, default)
    if value is None:
        raise ContractError(f"{where}.{key}: required")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ContractError(f"{where}.{key}: must be an integer, got {value!r}")
    if value < minimum:
        raise ContractError(f"{where}.{key}: must be at least {minimum}, got {value}")
    return value


def boolean(section: Mapping[str, Any], key: str, where: str) -> bool:
    value = section.get(key, False)
    if not isinstance(value, bool):
        raise ContractError(f"{where}.{key}: must be true or false, got {value!r}")
    return value


def choice(section: Mapping[str, Any], key: str, where: str, choices: tuple[str, ...], default: str) -> str:
    value = section.get(key, default)
    if value not in choices:
        raise ContractError(f"{where}.{key}: must be one of {', '.join(choices)}, got {value!r}")
    return str(value)
