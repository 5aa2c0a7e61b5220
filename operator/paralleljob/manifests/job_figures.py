"""The training figures of one ParallelJob, read from the object itself, for the operator's per-job metrics.

Pure: a job as the API returns it (its spec, and the status the operator wrote, which holds rank 0's validated
progress) in, a `JobFigures` of plain numbers out; the Prometheus collector (`handlers.job_metrics`) turns them
into one series per job and metric at scrape time. A figure the job has not reported is None, and its series is
left out rather than exported as zero. docs/install.md ("Metrics") lists every figure and its meaning.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
from collections.abc import Mapping
from typing import Any

# Phases in which the job's GPUs are held by its gang (and its spares).
HOLDING_PHASES = ("Running", "Restarting")


@dataclasses.dataclass(frozen=True)
class JobFigures:
    """One job's figures; instants are seconds since the epoch, so ages are computed when scraped."""

    namespace: str
    name: str
    phase: str | None = None
    layout: str | None = None
    step: float | None = None
    total_steps: float | None = None
    loss: float | None = None
    validation_loss: float | None = None
    tokens_per_second: float | None = None
    tflops_per_gpu: float | None = None
    mfu: float | None = None
    step_seconds: float | None = None
    modeled_step_seconds: float | None = None
    gang_restarts: float = 0.0
    in_place_restarts: float = 0.0
    last_step_time: float | None = None
    progress_timeout_seconds: float | None = None
    last_checkpoint_step: float | None = None
    last_checkpoint_time: float | None = None
    gpus: float = 0.0
    slowest_node_factor: float | None = None


def figures_of(job: Mapping[str, Any]) -> JobFigures:
    """The figures of a job object (status and spec); anything malformed counts as not reported."""
    metadata, spec, status = (_mapping(job.get(key)) for key in ("metadata", "spec", "status"))
    progress = _mapping(status.get("progress"))
    restarts, in_place = _number(status.get("restarts")) or 0.0, _number(status.get("inPlaceRestarts")) or 0.0
    phase = status.get("phase") if isinstance(status.get("phase"), str) else None
    return JobFigures(
        namespace=str(metadata.get("namespace") or ""),
        name=str(metadata.get("name") or ""),
        phase=phase,
        layout=status.get("layout") if isinstance(status.get("layout"), str) else None,
        step=_number(progress.get("step")),
        total_steps=_number(progress.get("totalSteps")) or _number(_mapping(spec.get("training")).get("steps")),
        loss=_number(progress.get("loss")),
        validation_loss=_number(progress.get("validationLoss")),
        tokens_per_second=_number(progress.get("tokensPerSecond")),
        tflops_per_gpu=_number(progress.get("tflopsPerGpu")),
        mfu=_number(progress.get("mfu")),
        step_seconds=_number(progress.get("stepSeconds")),
        modeled_step_seconds=_number(progress.get("modeledStepSeconds")),
        gang_restarts=max(restarts - in_place, 0.0),
        in_place_restarts=in_place,
        last_step_time=_instant(progress.get("updated")),
        progress_timeout_seconds=_number(_mapping(spec.get("failurePolicy")).get("progressTimeoutSeconds")),
        last_checkpoint_step=_number(status.get("lastCheckpointStep")),
        last_checkpoint_time=_instant(status.get("lastCheckpointTime")),
        gpus=_gpus_held(status, phase),
        slowest_node_factor=slowest_factor(progress.get("stragglers", status.get("stragglers"))),
    )


def slowest_factor(stragglers: Any) -> float | None:
    """The largest factor among the named slow nodes: a list of objects with `factor`, or that list as JSON
    text (the progress channel's form); None when no node is named."""
    if isinstance(stragglers, str):
        try:
            stragglers = json.loads(stragglers)
        except ValueError:
            return None
    if not isinstance(stragglers, list):
        return None
    factors = [_number(entry.get("factor")) for entry in stragglers if isinstance(entry, Mapping)]
    found = [factor for factor in factors if factor is not None]
    return max(found) if found else None


def _gpus_held(status: Mapping[str, Any], phase: str | None) -> float:
    """The gang's GPUs and its spares' while it holds them; none before it starts or after it ends."""
    if phase not in HOLDING_PHASES:
        return 0.0
    world = _number(status.get("worldSize")) or 0.0
    spares = status.get("spareNodes")
    per_node = _number(status.get("gpusPerNode")) or 0.0
    return world + (len(spares) * per_node if isinstance(spares, list) else 0.0)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _instant(value: Any) -> float | None:
    """Seconds since the epoch of an RFC 3339 UTC stamp, or None."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
