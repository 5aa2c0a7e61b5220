"""The progress watchdog: a Running gang whose rank 0 stopped advancing is restarted. Pure, with a table test.

`spec.failurePolicy.progressTimeoutSeconds` (off when absent). Rank 0 reports its step, with the time it
reached it, in its `<job>-progress` ConfigMap; the pass reads it from there, validated as
`manifests.progress.status_of` validates it (never from the job's status, which is for people). A gang that has been Running for longer than the timeout without a newer
step than the one reported that long ago is hung (a collective that never returns holds its GPUs until the
process-group timeout otherwise, 30 minutes by default, while `kubectl get pj` says Running). The verdict is
a broken gang with cause `NoProgress`, naming the last step and when it was reached; the restart counts
against backoffLimit like any other.

The pods go first. Their supervisors watch the same timeout on every rank's heartbeat
(`paralleljob_contract.heartbeat`) and restart a hung gang in place, inside the pods it has, while the attempt
has in-place restarts left; the operator then waits twice the timeout (the supervisors act at one, and the
gang they restart gets a whole timeout for its next step), so it restarts with new pods only a gang the pods
could not heal. With no in-place restart left, the operator judges at the timeout itself.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any

from paralleljob.manifests import timestamps

NO_PROGRESS = "NoProgress"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Hung (with the message), or not yet, with when to look again (None: no watchdog)."""

    hung: bool
    message: str = ""
    recheck_in: float | None = None


def judge_progress(
    progress: Mapping[str, Any] | None,
    running_since: str | None,
    timeout: float | None,
    at: datetime.datetime | None = None,
    in_place_first: bool = False,
) -> Verdict:
    """Whether the gang is hung: no step reported for `timeout` seconds (twice that with `in_place_first`: the
    pods may still restart the gang in place) since the later of the last report and the moment it started
    Running (so a restarted gang gets the whole timeout for its first step)."""
    if timeout is None:
        return Verdict(False)
    limit = 2 * timeout if in_place_first else timeout
    backstop = " (twice progressTimeoutSeconds: the pods did not restart it in place)" if in_place_first else ""
    step = (progress or {}).get("step")
    reported = timestamps.seconds_since((progress or {}).get("updated"), at)
    started = timestamps.seconds_since(running_since, at)
    ages = [age for age in (reported, started) if age is not None]
    if not ages:
        return Verdict(False, recheck_in=limit)
    quiet = min(ages)
    if quiet < limit:
        return Verdict(False, recheck_in=limit - quiet + 0.5)
    if step is None or reported is None or (started is not None and started < reported):
        message = f"rank 0 reported no training step within {limit:.0f}s of the gang starting{backstop}"
    else:
        message = (
            f"rank 0 has not advanced past step {step} (reached at {progress.get('updated') if progress else '?'}) "
            f"for {quiet:.0f}s, above progressTimeoutSeconds {timeout:.0f}{backstop}"
        )
    return Verdict(True, message)
