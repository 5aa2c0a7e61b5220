"""The soak's invariants, checked from outside the operator: pure functions over what was read from the API
(and, for checkpoints, from the claim's folder), each answering the violations it sees now. Called by `run`;
each has a table test in tests/bench/test_soak.py.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

GPU = "nvidia.com/gpu"
TERMINAL = frozenset({"Succeeded", "Failed"})
JOB_LABEL = "paralleljob.io/job"


@dataclasses.dataclass(frozen=True)
class Violation:
    at: float  # seconds from the start of the soak
    invariant: str
    job: str  # namespace/name, or "" when no job is to blame
    detail: str

    @property
    def key(self) -> tuple[str, str, str]:
        """One violation per invariant, job and object, however often it is seen."""
        return (self.invariant, self.job, self.detail.split(":", 1)[0])


def _gpus(pod: Mapping[str, Any]) -> int:
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        total += int(limits.get(GPU, 0))
    return total


def _job_of(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata") or {}
    name = (metadata.get("labels") or {}).get(JOB_LABEL, "")
    return f"{metadata.get('namespace', '')}/{name}" if name else ""


def oversubscribed(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]], at: float) -> list[Violation]:
    """Nodes whose unfinished pods (Terminating ones included: their processes still hold the GPUs) request more
    GPUs than the node has."""
    capacity = {
        n["metadata"]["name"]: int(((n.get("status") or {}).get("allocatable") or {}).get(GPU, 0)) for n in nodes
    }
    held: dict[str, list[tuple[int, str]]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName") or (
            (pod["metadata"].get("labels") or {}).get("paralleljob.io/node")
        )
        if not node or (pod.get("status") or {}).get("phase") in TERMINAL:
            continue
        held.setdefault(node, []).append((_gpus(pod), _job_of(pod)))
    found = []
    for node, holders in sorted(held.items()):
        used = sum(g for g, _ in holders)
        if node in capacity and used > capacity[node]:
            jobs = sorted({job for _, job in holders if job})
            found.append(
                Violation(at, "oversubscribed", ",".join(jobs), f"{node}: {used} GPUs held of {capacity[node]}")
            )
    return found


def signature(job: Mapping[str, Any]) -> str:
    """What changes while a job makes progress: its phase, restarts, placement and training step."""
    status = job.get("status") or {}
    seen = {
        "phase": status.get("phase"),
        "restarts": status.get("restarts"),
        "inPlace": status.get("inPlaceRestarts"),
        "placement": status.get("placement"),
        "step": (status.get("progress") or {}).get("step"),
        "message": status.get("message"),
    }
    return json.dumps(seen, sort_keys=True, default=str)


@dataclasses.dataclass(frozen=True)
class Track:
    """A job as the soak followed it: its signature, since when, and whether it is terminal."""

    signature: str
    since: float
    phase: str


def advance(track: Track | None, job: Mapping[str, Any], now: float) -> Track:
    mark = signature(job)
    phase = str((job.get("status") or {}).get("phase") or "")
    if track is not None and track.signature == mark:
        return track
    return Track(mark, now, phase)


def stalled(tracks: Mapping[str, Track], now: float, limit: float) -> list[Violation]:
    """Jobs in no terminal phase whose status has not changed for `limit` seconds."""
    return [
        Violation(now, "no progress", job, f"{track.phase or 'no phase'}: unchanged for {now - track.since:.0f} s")
        for job, track in sorted(tracks.items())
        if track.phase not in TERMINAL and now - track.since >= limit
    ]


def owned(objects: Iterable[Mapping[str, Any]], kind: str) -> list[tuple[str, str, str]]:
    """(what, job owner's uid, job) of every object a ParallelJob owns."""
    found = []
    for obj in objects:
        metadata = obj["metadata"]
        for owner in metadata.get("ownerReferences") or []:
            if owner.get("kind") == "ParallelJob":
                what = f"{kind} {metadata.get('namespace', '')}/{metadata['name']}"
                found.append((what, owner["uid"], f"{metadata.get('namespace', '')}/{owner.get('name', '')}"))
    return found


def orphans(
    dependents: Iterable[tuple[str, str, str]],
    live_uids: set[str],
    first_seen: Mapping[str, float],
    now: float,
    grace: float,
) -> tuple[list[Violation], dict[str, float]]:
    """Dependents (`owned`) whose job is gone and which are still there `grace` seconds after that was first seen
    (the garbage collector's time, a controller-manager outage included); and the first-seen times to keep."""
    seen: dict[str, float] = {}
    found = []
    for what, uid, job in dependents:
        if uid in live_uids:
            continue
        seen[what] = first_seen.get(what, now)
        if now - seen[what] >= grace:
            found.append(Violation(now, "orphan", job, f"{what}: left {now - seen[what]:.0f} s after its job"))
    return found, seen


def checkpoints(job: str, latest: str | None, verdicts: Mapping[str, str | None], at: float) -> list[Violation]:
    """A Succeeded job's checkpoints: `latest` names one that exists, and every `global_stepN` folder's manifest
    verified (`verdicts`: folder -> None, or why not)."""
    found = [Violation(at, "checkpoint", job, f"{folder}: {why}") for folder, why in sorted(verdicts.items()) if why]
    if not latest:
        found.append(Violation(at, "checkpoint", job, "latest: no checkpoint named"))
    elif latest not in verdicts:
        found.append(Violation(at, "checkpoint", job, f"latest: names {latest}, which is not there"))
    return found


@dataclasses.dataclass(frozen=True)
class Sample:
    at: float
    jobs_done: int
    rss_mib: float
    connections: int


# Memory may settle, not grow: the last quarter's median within this of the second quarter's (the first is
# start-up), and the operator's connections to the API server (its watches) at most a few more.
GROWTH_FACTOR, GROWTH_SLACK_MIB, CONNECTIONS_SLACK = 1.25, 16.0, 4


def growth(samples: list[Sample]) -> list[Violation]:
    """The operator's memory and open connections do not grow with the jobs done."""
    if len(samples) < 8:
        return []
    quarter = len(samples) // 4
    settled, last = samples[quarter : 2 * quarter], samples[-quarter:]
    found = []
    before, after = statistics.median(s.rss_mib for s in settled), statistics.median(s.rss_mib for s in last)
    if after > before * GROWTH_FACTOR + GROWTH_SLACK_MIB:
        detail = (
            f"RSS: median {before:.0f} MiB at {settled[0].jobs_done} jobs done, {after:.0f} MiB at {last[-1].jobs_done}"
        )
        found.append(Violation(last[-1].at, "operator memory grows", "", detail))
    most_before, most_after = max(s.connections for s in settled), max(s.connections for s in last)
    if most_after > most_before + CONNECTIONS_SLACK:
        detail = f"connections: {most_before} at most, then {most_after}"
        found.append(Violation(last[-1].at, "operator watches grow", "", detail))
    return found
