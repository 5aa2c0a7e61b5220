"""The planner's step time as a checked promise: whether a running job steps persistently slower than modeled.

Pure, on plain data: the measured median step time and the modeled one (rank 0's report, validated into
`status.progress`), the job's `spec.failurePolicy.slowerThanModeledFactor`, the SlowerThanModeled condition as it
stands, and the time now. `decide` returns the condition's next status, reason and message, or None to leave it as
it is. A job above the factor is Unknown (checking) first and True once it has stayed above it for HOLD_SECONDS, so
one slow window (a checkpoint, a restart's first steps, which the median of a log window already mostly absorbs)
does not set it; back within the factor, it turns False. A job that never went above it never gets the condition.
The running pass (`steps.supervision`) applies it.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any

TYPE = "SlowerThanModeled"
# How long the measured step time must stay above the factor before the condition turns True.
HOLD_SECONDS = 300.0


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The SlowerThanModeled condition's next status, reason and message."""

    status: str
    reason: str
    message: str


def decide(
    measured: float | None,
    modeled: float | None,
    factor: float,
    current: Mapping[str, Any] | None,
    now: datetime.datetime,
) -> Verdict | None:
    """The condition's next state, or None to leave it (no figures yet, or never above the factor)."""
    if not measured or not modeled or measured <= 0 or modeled <= 0:
        return None
    ratio = measured / modeled
    figures = f"measured median step {measured:.4g} s is {ratio:.3g}x the modeled {modeled:.4g} s (factor {factor:g})"
    status = (current or {}).get("status")
    if ratio <= factor:
        return Verdict("False", "AsModeled", figures) if status in ("True", "Unknown") else None
    if status == "True":
        return Verdict("True", TYPE, figures)
    since = _instant((current or {}).get("lastTransitionTime")) if status == "Unknown" else None
    if since is not None and (now - since).total_seconds() >= HOLD_SECONDS:
        return Verdict("True", TYPE, f"{figures} for {HOLD_SECONDS:.0f} s or more")
    return Verdict("Unknown", "Checking", f"{figures}; True once it stays above for {HOLD_SECONDS:.0f} s")


def _instant(stamp: Any) -> datetime.datetime | None:
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
