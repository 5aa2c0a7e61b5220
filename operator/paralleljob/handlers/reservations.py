"""GPUs promised to other ParallelJobs whose pods are not bound yet. Pure, with a table test.

Bound pods count through their GPU requests (the planner subtracts them); a placed job's node ranks whose
pod is not bound yet (not created, or waiting for the scheduler) would be invisible there, so each such rank
reserves its planned GPUs on its planned node. Without this, two jobs admitted a moment apart would be
planned onto the same GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from paralleljob.planning.inventory import TERMINAL_POD_PHASES, Reservation, pod_gpu_claim


def _bound_pods(pods: Iterable[Mapping[str, Any]]) -> set[tuple[str, str]]:
    found = set()
    for pod in pods:
        node, gpus = pod_gpu_claim(pod)
        if node and gpus:
            found.add((pod["metadata"].get("namespace", ""), pod["metadata"]["name"]))
    return found


def job_reservations(
    jobs: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]], exclude: tuple[str, str] | None = None
) -> list[Reservation]:
    """Reservations of every placed, unfinished job except `exclude` (namespace, name)."""
    bound = _bound_pods(pods)
    found: list[Reservation] = []
    for job in jobs:
        metadata, status = job["metadata"], job.get("status") or {}
        key = (metadata.get("namespace", ""), metadata["name"])
        if key == exclude or status.get("phase") in TERMINAL_POD_PHASES or not status.get("placement"):
            continue
        gpus = int(status.get("gpusPerNode") or 0)
        for entry in status["placement"]:
            if (key[0], entry.get("pod") or "") not in bound:
                found.append(Reservation(entry["node"], gpus, f"ParallelJob {key[0]}/{key[1]}"))
    return found
