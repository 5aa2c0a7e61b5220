"""What the soak does and when: job arrivals and faults, a pure function of the seed, the length and the rates.

Every fault kind appears once early (in an order the seed shuffles), then kinds are drawn by weight. The
control-plane faults are a stream of their own (about their weight's share of all faults), one after another
and never overlapping; while the API is down (etcd stopped or killed, the API server restarted) nothing else is
scheduled: an event that falls in such a window moves to its end.
Called by `run`; tested in tests/bench/test_soak.py.
"""

from __future__ import annotations

import dataclasses
import random

# Fault kind -> weight of the draw.
FAULTS: dict[str, float] = {
    "pod-kill": 5.0,  # a job's pod deleted at once (its process killed, on a real node)
    "operator-kill": 1.0,  # the operator SIGKILLed and started again
    "node-loss": 2.0,  # a kwok node deleted (its VM gone) and a new one joins
    "node-hang": 1.0,  # a real node's kubelet silenced: no heartbeats, no pod updates, then resumed
    "kueue-evict": 1.5,  # an admitted Workload deactivated (Kueue evicts it, as a preemption does), then reactivated
    "etcd-stop": 0.15,  # etcd stopped (SIGTERM) for 30 s, then started on its data
    "etcd-kill": 0.15,  # etcd SIGKILLed and started again on its data
    "apiserver-restart": 0.15,  # kube-apiserver killed and started again
    "controller-manager-stop": 0.15,  # no garbage collection, no node lifecycle for 60 s
}
# How long a fault lasts before it is undone (the others are instant).
HOLD_SECONDS = {
    "etcd-stop": 30.0,
    "etcd-kill": 3.0,
    "apiserver-restart": 5.0,
    "controller-manager-stop": 60.0,
    "node-hang": 20.0,
    "kueue-evict": 15.0,
}
CONTROL_PLANE = frozenset({"etcd-stop", "etcd-kill", "apiserver-restart", "controller-manager-stop"})
# The API is down meanwhile (plus the time it takes to come back).
OUTAGES = frozenset({"etcd-stop", "etcd-kill", "apiserver-restart"})
OUTAGE_MARGIN = 10.0

# Job kind -> weight. `real` trains on the process-kubelet nodes; the others run on kwok's nodes.
JOBS: dict[str, float] = {
    "valid": 3.0,
    "invalid": 1.0,
    "budget": 1.0,
    "kueue": 2.0,
    "spares": 1.5,
    "shrink": 1.5,
    "real": 1.0,
}
# How long a kwok job lives before the soak deletes it, as its user would (kwok's pods never finish).
LIFETIME = (60.0, 150.0)
WARMUP = 10.0


@dataclasses.dataclass(frozen=True)
class Event:
    at: float  # seconds from the start
    kind: str  # a key of FAULTS or JOBS
    pick: int  # chooses the target among the candidates the cluster has then
    hold: float = 0.0  # a fault's length, a kwok job's lifetime

    @property
    def is_fault(self) -> bool:
        return self.kind in FAULTS


def kinds(rng: random.Random, weights: dict[str, float], count: int) -> list[str]:
    first = list(weights)
    rng.shuffle(first)
    names = list(weights)
    drawn = rng.choices(names, [weights[n] for n in names], k=max(0, count - len(first)))
    return (first + drawn)[:count]


def times(rng: random.Random, count: int, seconds: float) -> list[float]:
    slot = (seconds - WARMUP) / max(count, 1)
    return [WARMUP + i * slot + rng.uniform(0, slot * 0.8) for i in range(count)]


def build(seed: int, minutes: float, faults_per_minute: float = 14.0, jobs_per_minute: float = 5.0) -> list[Event]:
    """The soak's events in time order; the same arguments give the same list."""
    rng = random.Random(seed)
    seconds = minutes * 60.0
    # In FAULTS' order, not the set's: a set of strings iterates in an order that changes with every process
    # (hash randomization), and the same seed gave two runs different schedules.
    plane = {kind: weight for kind, weight in FAULTS.items() if kind in CONTROL_PLANE}
    others = {kind: weight for kind, weight in FAULTS.items() if kind not in CONTROL_PLANE}
    share = sum(plane.values()) / sum(FAULTS.values())
    fault_count, job_count = round(minutes * faults_per_minute), round(minutes * jobs_per_minute)
    plane_count = max(len(plane), round(fault_count * share))
    windows = control_plane(rng, kinds(rng, plane, plane_count), seconds)
    faults = [
        Event(at, kind, rng.randrange(1 << 30), HOLD_SECONDS.get(kind, 0.0))
        for at, kind in zip(
            times(rng, fault_count - plane_count, seconds),
            kinds(rng, others, fault_count - plane_count),
            strict=True,
        )
    ]
    jobs = [
        Event(at, kind, rng.randrange(1 << 30), 0.0 if kind in ("real", "invalid") else rng.uniform(*LIFETIME))
        for at, kind in zip(times(rng, job_count, seconds), kinds(rng, JOBS, job_count), strict=True)
    ]
    return sorted(windows + outside(faults + jobs, windows), key=lambda e: (e.at, e.kind))


def control_plane(rng: random.Random, drawn: list[str], seconds: float) -> list[Event]:
    """The control-plane faults one after another, each ended (and its margin passed) before the next: the time
    left over is shared out at random between them. Those that do not fit in `seconds` are left out (the last)."""
    needed = [HOLD_SECONDS[kind] + OUTAGE_MARGIN for kind in drawn]
    while drawn and sum(needed) > seconds - WARMUP:
        drawn, needed = drawn[:-1], needed[:-1]
    weights = [rng.random() for _ in range(len(drawn) + 1)]
    spare = (seconds - WARMUP - sum(needed)) / sum(weights)
    placed, at = [], WARMUP
    for kind, need, weight in zip(drawn, needed, weights, strict=False):
        at += weight * spare
        placed.append(Event(at, kind, rng.randrange(1 << 30), HOLD_SECONDS[kind]))
        at += need
    return placed


def outside(events: list[Event], windows: list[Event]) -> list[Event]:
    """Each event that falls while the API is down (an outage and its margin) moved to the outage's end."""
    moved = []
    for event in events:
        at = event.at
        for window in windows:
            if window.kind in OUTAGES and window.at <= at < window.at + window.hold + OUTAGE_MARGIN:
                at = window.at + window.hold + OUTAGE_MARGIN
        moved.append(dataclasses.replace(event, at=at))
    return moved


def counts(events: list[Event]) -> dict[str, int]:
    found: dict[str, int] = {}
    for event in events:
        found[event.kind] = found.get(event.kind, 0) + 1
    return found
