"""Prometheus metrics of the operator, served by prometheus_client on `--metrics-port`.

paralleljob_reconciles_total{outcome}, paralleljob_jobs{phase}, paralleljob_planning_seconds (histogram),
paralleljob_gang_restarts_total, paralleljob_leader (1 while this replica acts), paralleljob_rival_operators
(other operators that manage some of the same namespaces, see `paralleljob.k8s.leadership`). Each job's training
figures (`paralleljob_job_*`) are `job_metrics`'.
"""

from __future__ import annotations

import threading

import prometheus_client

PHASES = ("Pending", "Queued", "Running", "Restarting", "Succeeded", "Failed")

RECONCILES = prometheus_client.Counter("paralleljob_reconciles", "Reconcile passes, by outcome.", ["outcome"])
JOBS = prometheus_client.Gauge("paralleljob_jobs", "ParallelJobs seen by this operator, by phase.", ["phase"])
PLANNING = prometheus_client.Histogram(
    "paralleljob_planning_seconds",
    "Time to plan one job against the live cluster.",
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5),
)
GANG_RESTARTS = prometheus_client.Counter("paralleljob_gang_restarts", "Gang restarts started.")
LEADER = prometheus_client.Gauge("paralleljob_leader", "1 while this replica holds the Lease and acts.")
RIVAL_OPERATORS = prometheus_client.Gauge(
    "paralleljob_rival_operators", "Other operators whose Leases say they manage some of the same namespaces."
)

_phases: dict[tuple[str, str], str] = {}
_lock = threading.Lock()


def observe_phase(namespace: str, name: str, phase: str | None) -> None:
    """Record a job's phase (None: the job is gone) and refresh the per-phase gauge."""
    with _lock:
        if phase is None:
            _phases.pop((namespace, name), None)
        else:
            _phases[(namespace, name)] = phase
        counts = {p: 0 for p in PHASES}
        for value in _phases.values():
            counts[value] = counts.get(value, 0) + 1
    for phase_name, count in counts.items():
        JOBS.labels(phase=phase_name).set(count)


def serve(port: int) -> None:
    """Start the metrics endpoint (a daemon thread); port 0 turns it off."""
    if port:
        prometheus_client.start_http_server(port)
