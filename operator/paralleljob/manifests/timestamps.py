"""Kubernetes timestamps (RFC 3339, UTC, whole seconds), the one format every status, condition and Event uses.

Pure (it sits below `k8s`, so that the reconcile steps, which may not reach the API, use it too); called by
`k8s.events`, by the handlers' conditions, decisions and gang policy, and by the test cluster's kubelet.
"""

from __future__ import annotations

import datetime


def now() -> str:
    """The current time as the API server writes it, e.g. 2026-01-31T12:00:00Z."""
    return format_time(datetime.datetime.now(datetime.UTC))


def format_time(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse(text: str) -> datetime.datetime:
    """An API timestamp (RFC 3339; `Z` or an offset) as an aware datetime."""
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def seconds_since(text: str | None, at: datetime.datetime | None = None) -> float | None:
    """Seconds from the timestamp `text` to `at` (default: now); None when `text` is absent or unreadable."""
    if not text:
        return None
    try:
        then = parse(text)
    except ValueError:
        return None
    return ((at or datetime.datetime.now(datetime.UTC)) - then).total_seconds()
