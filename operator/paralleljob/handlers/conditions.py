"""Status conditions per the Kubernetes API conventions (type, status, reason, message, lastTransitionTime,
observedGeneration). Pure; `lastTransitionTime` changes only when `status` does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from paralleljob.manifests import timestamps

TYPES = (
    "Valid",
    "Scheduled",
    "NetworkReady",
    "NetworkVerified",
    "Ready",
    "SlowerThanModeled",
    "Reconciled",
    "Succeeded",
    "Failed",
)


def find(conditions: Sequence[Mapping[str, Any]] | None, kind: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions or () if c.get("type") == kind), None)


def set_condition(
    conditions: Sequence[Mapping[str, Any]] | None,
    kind: str,
    status: str,
    reason: str,
    message: str,
    generation: int | None,
    at: str | None = None,
) -> list[dict[str, Any]]:
    """The conditions with `kind` set; other types kept, in TYPES order."""
    old = find(conditions, kind)
    moved = old is None or old.get("status") != status
    new = {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": (at or timestamps.now()) if moved or old is None else old.get("lastTransitionTime"),
        "observedGeneration": generation,
    }
    others = [dict(c) for c in conditions or () if c.get("type") != kind]
    merged = [*others, new]
    return sorted(merged, key=lambda c: TYPES.index(c["type"]) if c["type"] in TYPES else len(TYPES))


def is_true(conditions: Sequence[Mapping[str, Any]] | None, kind: str, reason: str | None = None) -> bool:
    found = find(conditions, kind)
    return bool(found and found.get("status") == "True" and (reason is None or found.get("reason") == reason))


def same(a: Sequence[Mapping[str, Any]] | None, b: Sequence[Mapping[str, Any]] | None) -> bool:
    """Equal but for lastTransitionTime (which only moves with status)."""

    def key(items: Sequence[Mapping[str, Any]] | None) -> list[tuple[Any, ...]]:
        return sorted(
            (c.get("type"), c.get("status"), c.get("reason"), c.get("message"), c.get("observedGeneration"))
            for c in items or ()
        )

    return key(a) == key(b)
