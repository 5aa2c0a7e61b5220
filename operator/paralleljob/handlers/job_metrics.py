"""Per-job training metrics on the operator's /metrics: one series per job and figure, labelled namespace and
name, built at scrape time from the latest figures of each job this replica has seen.

The job watch (`registry.job_changed`) hands every event's object to `observe` and every deletion to `forget`, so
a deleted job's series are gone from the next scrape. Only jobs the operator manages appear, and each contributes
a fixed number of series (its layout only on `paralleljob_job_info`, and a phase series per phase), which bounds
the cardinality: bench/metrics_scale.py measures memory and scrape time at 1,000 jobs (docs/install.md, "Metrics").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import prometheus_client
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from paralleljob.manifests.job_figures import JobFigures, figures_of

PHASES = ("Pending", "Queued", "Running", "Restarting", "Succeeded", "Failed")
LABELS = ("namespace", "name")

# name, help, the figure it reads (None: not reported, no series).
GAUGES: tuple[tuple[str, str, Callable[[JobFigures], float | None]], ...] = (
    ("step", "Last completed optimizer step.", lambda f: f.step),
    ("total_steps", "spec.training.steps.", lambda f: f.total_steps),
    ("loss", "Training loss at the last reported step.", lambda f: f.loss),
    ("validation_loss", "Held-out loss of the last evaluation, where the job evaluates.", lambda f: f.validation_loss),
    ("tokens_per_second", "Training throughput of the whole job.", lambda f: f.tokens_per_second),
    ("tflops_per_gpu", "Achieved model TFLOP/s per GPU.", lambda f: f.tflops_per_gpu),
    ("mfu", "Model FLOPs utilisation (0-1), where the device's peak is known.", lambda f: f.mfu),
    ("step_seconds", "Measured median step time over the last log window.", lambda f: f.step_seconds),
    ("modeled_step_seconds", "The planner's modeled step time.", lambda f: f.modeled_step_seconds),
    ("progress_timeout_seconds", "spec.failurePolicy.progressTimeoutSeconds.", lambda f: f.progress_timeout_seconds),
    ("last_checkpoint_step", "Step of the newest complete checkpoint.", lambda f: f.last_checkpoint_step),
    ("gpus", "GPUs the job holds now (its gang and its spares while Running or Restarting).", lambda f: f.gpus),
    ("slowest_node_factor", "The slowest named node's step time over its peers'.", lambda f: f.slowest_node_factor),
)


class JobMetrics(Collector):
    """The latest figures of every job, and the metric families made from them when Prometheus scrapes."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._jobs: dict[tuple[str, str], JobFigures] = {}
        self._lock = threading.Lock()
        self._clock = clock

    def observe(self, job: Mapping[str, Any]) -> None:
        figures = figures_of(job)
        with self._lock:
            self._jobs[(figures.namespace, figures.name)] = figures

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._jobs.pop((namespace, name), None)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            jobs = list(self._jobs.values())
        now = self._clock()
        yield from _gauges(jobs)
        yield _info(jobs)
        yield _phases(jobs)
        yield _restarts(jobs)
        yield _ages(jobs, now, "seconds_since_step", "Seconds since rank 0 last reported a step.", "last_step_time")
        yield _ages(jobs, now, "checkpoint_age_seconds", "Seconds since the newest checkpoint.", "last_checkpoint_time")


def _gauges(jobs: list[JobFigures]) -> Iterator[Metric]:
    for name, description, read in GAUGES:
        family = GaugeMetricFamily(f"paralleljob_job_{name}", description, labels=LABELS)
        for job in jobs:
            value = read(job)
            if value is not None:
                family.add_metric([job.namespace, job.name], value)
        yield family


def _info(jobs: list[JobFigures]) -> Metric:
    family = GaugeMetricFamily("paralleljob_job_info", "1 per job, with its layout.", labels=(*LABELS, "layout"))
    for job in jobs:
        family.add_metric([job.namespace, job.name, job.layout or ""], 1.0)
    return family


def _phases(jobs: list[JobFigures]) -> Metric:
    family = GaugeMetricFamily(
        "paralleljob_job_phase", "1 for the job's phase, 0 for the others.", labels=(*LABELS, "phase")
    )
    for job in jobs:
        for phase in PHASES:
            family.add_metric([job.namespace, job.name, phase], 1.0 if job.phase == phase else 0.0)
    return family


def _restarts(jobs: list[JobFigures]) -> Metric:
    family = CounterMetricFamily(
        "paralleljob_job_restarts", "Restarts of the job: gang (new pods) and in_place.", labels=(*LABELS, "kind")
    )
    for job in jobs:
        family.add_metric([job.namespace, job.name, "gang"], job.gang_restarts)
        family.add_metric([job.namespace, job.name, "in_place"], job.in_place_restarts)
    return family


def _ages(jobs: list[JobFigures], now: float, name: str, description: str, field: str) -> Metric:
    family = GaugeMetricFamily(f"paralleljob_job_{name}", description, labels=LABELS)
    for job in jobs:
        since = getattr(job, field)
        if since is not None:
            family.add_metric([job.namespace, job.name], max(now - since, 0.0))
    return family


JOBS = JobMetrics()
prometheus_client.REGISTRY.register(JOBS)
