"""Step 1, finished: a job whose attempt record says Succeeded or Failed. Its end is final: an edit afterwards
changes only the Valid condition, whatever the spec says now, and the pods still holding GPUs are deleted
(a Succeeded job keeps its Succeeded pods for their logs).
"""

from __future__ import annotations

import datetime

from paralleljob.handlers.observed import Observed, condition, pods_holding_gpus, status_patch
from paralleljob.handlers.settings import Settings
from paralleljob.manifests.decisions import Decision


def decide(seen: Observed, settings: Settings, now: datetime.datetime) -> Decision:
    """A finished job, first of all: its end stands whatever its spec says now. An edit afterwards changes only
    the Valid condition (False while the spec is invalid, True again once it is fixed), and the pods still
    holding GPUs are deleted."""
    valid = valid_after_end(seen.spec_problems if seen.spec is None else None)
    patch = status_patch(seen, {"conditions": condition(seen, "Valid", *valid, now)})
    outcome = seen.record.outcome if seen.record is not None else None
    return Decision("finished", status=patch, deletes=pods_holding_gpus(seen.pods, outcome))


def valid_after_end(problems: str | None) -> tuple[str, str, str]:
    """The Valid condition (status, reason, message) of a finished job: the only thing an edit still changes.
    `problems`: why the current spec is invalid, None when it is valid."""
    if problems is None:
        return "True", "Validated", "the spec is valid"
    return "False", "InvalidSpec", problems
