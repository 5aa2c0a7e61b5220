"""The soak's driver: starts the cluster (`cluster.started`), plays the seeded schedule (jobs applied, kwok jobs
deleted at the end of their lifetime, faults injected and undone), reads the cluster every few seconds and
checks the invariants on what it read, then deletes every job, waits for their dependents to be collected, and
prints the report. Its exit status is 1 when an invariant was violated.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import requests

from bench.soak import faults, invariants, jobs, observe, report, schedule
from bench.soak.cluster import Soaked, started
from bench.soak.invariants import Sample, Track, Violation

CHECK_EVERY = 5.0


@dataclasses.dataclass
class Soak:
    soaked: Soaked
    started: float
    stall_seconds: float
    orphan_seconds: float
    job_kinds: dict[str, str] = dataclasses.field(default_factory=dict)  # namespace/name -> kind
    outcomes: dict[str, str] = dataclasses.field(default_factory=dict)  # namespace/name -> refused, deleted, phase
    faults: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    undo: list[tuple[float, str, Callable[[], None]]] = dataclasses.field(default_factory=list)
    deletions: list[tuple[float, str]] = dataclasses.field(default_factory=list)
    tracks: dict[str, Track] = dataclasses.field(default_factory=dict)
    orphan_seen: dict[str, float] = dataclasses.field(default_factory=dict)
    verified: set[str] = dataclasses.field(default_factory=set)
    violations: dict[tuple[str, str, str], Violation] = dataclasses.field(default_factory=dict)
    samples: list[Sample] = dataclasses.field(default_factory=list)
    log: list[str] = dataclasses.field(default_factory=list)

    def now(self) -> float:
        return time.monotonic() - self.started

    def note(self, line: str) -> None:
        self.log.append(f"{self.now():7.1f} {line}")
        print(self.log[-1], flush=True)

    def count(self, kind: str, what: str) -> None:
        row = self.faults.setdefault(kind, {})
        row[what] = row.get(what, 0) + 1

    def found(self, violations: list[Violation]) -> None:
        for violation in violations:
            if violation.key not in self.violations:
                self.violations[violation.key] = violation
                self.note(f"VIOLATION {violation.invariant} {violation.job} {violation.detail}")

    def jobs_done(self) -> int:
        return sum(1 for outcome in self.outcomes.values() if outcome in ("deleted", "refused", *invariants.TERMINAL))


def apply_job(soak: Soak, event: schedule.Event, index: int) -> None:
    if (
        event.kind == "real"
        and sum(1 for k, o in soak.outcomes.items() if soak.job_kinds[k] == "real" and o == "live") >= 2
    ):
        soak.note("real job skipped: both real nodes' jobs still run")
        return
    name = f"{event.kind}-{index}"
    doc = jobs.document(event.kind, name)
    key = f"{doc['metadata']['namespace']}/{name}"
    soak.job_kinds[key] = event.kind
    try:
        response = soak.soaked.api.send(
            "POST", f"/apis/paralleljob.io/v1alpha1/namespaces/{doc['metadata']['namespace']}/paralleljobs", doc
        )
    except requests.RequestException as error:
        soak.outcomes[key] = "not created (no answer)"
        soak.note(f"job {key} not created: {error!r}"[:300])
        return
    if response.status_code == 422:
        soak.outcomes[key] = "refused"
        return
    if not response.ok:
        soak.outcomes[key] = f"not created ({response.status_code})"
        return
    soak.outcomes[key] = "live"
    if event.hold:
        soak.deletions.append((event.at + event.hold, key))


def inject(soak: Soak, event: schedule.Event) -> None:
    try:
        target, undo = faults.INJECT[event.kind](soak.soaked, event.pick)
    except Exception as error:
        soak.count(event.kind, "failed")
        soak.note(f"fault {event.kind} failed: {error!r}"[:300])
        return
    if target is None:
        soak.count(event.kind, "no target")
        return
    soak.count(event.kind, "injected")
    soak.note(f"fault {event.kind} -> {target}")
    if undo is not None:
        soak.undo.append((event.at + event.hold, event.kind, undo))


def due_undos(soak: Soak, now: float, everything: bool = False) -> None:
    for entry in sorted(soak.undo, key=lambda u: u[0]):
        due, kind, undo = entry
        if due <= now or everything:
            soak.undo.remove(entry)
            try:
                undo()
                soak.note(f"undone {kind}")
            except Exception as error:
                soak.undo.append((now + 5.0, kind, undo))
                soak.note(f"undo {kind} failed, again in 5 s: {error!r}"[:300])


def due_deletions(soak: Soak, now: float) -> None:
    for entry in sorted(soak.deletions):
        due, key = entry
        if due > now:
            continue
        soak.deletions.remove(entry)
        if soak.outcomes.get(key) != "live":
            continue
        namespace, name = key.split("/")
        try:
            response = soak.soaked.api.send(
                "DELETE", f"/apis/paralleljob.io/v1alpha1/namespaces/{namespace}/paralleljobs/{name}"
            )
        except requests.RequestException:  # the API is down (an outage): again in 5 s
            soak.deletions.append((now + 5.0, key))
            continue
        if response.ok or response.status_code == 404:
            soak.outcomes[key] = "deleted"
            soak.tracks.pop(key, None)
        else:
            soak.deletions.append((now + 5.0, key))


def verify_checkpoints(soak: Soak, key: str, now: float) -> None:
    """Every committed checkpoint of a Succeeded real job verified against its manifest (sizes and sha256), as
    `paralleljob export` verifies one."""
    from paralleljob_trainer import checkpoint, export  # torch: imported once a real job has Succeeded

    folder = soak.soaked.checkpoints(key.split("/")[1])
    verdicts: dict[str, str | None] = {}
    for tag in checkpoint.committed_tags(folder):
        try:
            export.verified_manifest(folder / tag)
            verdicts[tag] = None
        except Exception as error:
            verdicts[tag] = str(error)
    latest = (folder / "latest").read_text().strip() if (folder / "latest").exists() else None
    soak.found(invariants.checkpoints(key, latest, verdicts, now))
    soak.note(f"checkpoints of {key}: {sorted(verdicts)} verified, latest {latest}")


def check(soak: Soak, now: float) -> None:
    sample = (
        observe.operator_process(soak.soaked.operator.process.pid, soak.soaked.state.apiserver_port)
        if soak.soaked.operator.process
        else None
    )
    if sample is not None:
        soak.samples.append(Sample(now, soak.jobs_done(), *sample))
    seen = observe.snapshot(soak.soaked.api)
    if seen is None:
        return
    soak.found(invariants.oversubscribed(seen.nodes, seen.pods, now))
    live_uids = set()
    for job in seen.parallel_jobs:
        key = f"{job['metadata']['namespace']}/{job['metadata']['name']}"
        live_uids.add(job["metadata"]["uid"])
        if soak.outcomes.get(key) != "live":
            continue
        soak.tracks[key] = invariants.advance(soak.tracks.get(key), job, now)
        phase = (job.get("status") or {}).get("phase")
        if phase in invariants.TERMINAL:
            soak.outcomes[key] = phase
            soak.tracks.pop(key, None)
            if phase == "Succeeded" and soak.job_kinds.get(key) == "real":
                verify_checkpoints(soak, key, now)
    soak.found(invariants.stalled(soak.tracks, now, soak.stall_seconds))
    dependents = [
        *invariants.owned(seen.pods, "pod"),
        *invariants.owned(seen.configmaps, "configmap"),
        *invariants.owned(seen.workloads, "workload"),
    ]
    found, soak.orphan_seen = invariants.orphans(dependents, live_uids, soak.orphan_seen, now, soak.orphan_seconds)
    soak.found(found)


def play(soak: Soak, events: list[schedule.Event], seconds: float) -> None:
    pending = list(events)
    next_check = 0.0
    while (now := soak.now()) < seconds:
        due_undos(soak, now)
        while pending and pending[0].at <= now:
            event = pending.pop(0)
            if event.is_fault:
                inject(soak, event)
            else:
                apply_job(soak, event, len(events) - len(pending))
        due_deletions(soak, now)
        if now >= next_check:
            check(soak, now)
            next_check = now + CHECK_EVERY
        time.sleep(0.5)
    due_undos(soak, soak.now(), everything=True)


def drain(soak: Soak, timeout: float) -> None:
    """Every job deleted; then, once their dependents are collected (or `timeout` passed), one last check with no
    grace: what is left is an orphan."""
    for key, outcome in soak.outcomes.items():
        if outcome not in ("refused",) and not outcome.startswith("not created"):
            namespace, name = key.split("/")
            with contextlib.suppress(requests.RequestException):
                soak.soaked.api.send(
                    "DELETE", f"/apis/paralleljob.io/v1alpha1/namespaces/{namespace}/paralleljobs/{name}"
                )
    soak.tracks.clear()
    deadline = soak.now() + timeout
    while soak.now() < deadline:
        seen = observe.snapshot(soak.soaked.api)
        if seen is not None and not (
            invariants.owned(seen.pods, "pod")
            + invariants.owned(seen.configmaps, "configmap")
            + invariants.owned(seen.workloads, "workload")
        ):
            break
        time.sleep(2)
    soak.orphan_seconds = 0.0
    check(soak, soak.now())


def outcome_table(soak: Soak) -> dict[str, dict[str, int]]:
    rows: dict[str, dict[str, int]] = {}
    for key, outcome in soak.outcomes.items():
        row = rows.setdefault(soak.job_kinds[key], {})
        row[outcome] = row.get(outcome, 0) + 1
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=39)
    parser.add_argument("--faults-per-minute", type=float, default=14.0)
    parser.add_argument("--jobs-per-minute", type=float, default=5.0)
    parser.add_argument(
        "--stall-seconds", type=float, default=300.0, help="a live job whose status is unchanged this long"
    )
    parser.add_argument("--orphan-seconds", type=float, default=180.0, help="a dependent left this long after its job")
    parser.add_argument("--keep", type=Path, help="keep the cluster's folder (logs) here instead of a temporary one")
    arguments = parser.parse_args()
    events = schedule.build(arguments.seed, arguments.minutes, arguments.faults_per_minute, arguments.jobs_per_minute)
    print(f"schedule: {json.dumps(schedule.counts(events), sort_keys=True)}", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        folder = arguments.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        with started(folder) as soaked:
            soak = Soak(soaked, time.monotonic(), arguments.stall_seconds, arguments.orphan_seconds)
            try:
                play(soak, events, arguments.minutes * 60.0)
                soak.found(invariants.growth(soak.samples))
                drain(soak, timeout=arguments.orphan_seconds)
            except Exception:
                traceback.print_exc()
                due_undos(soak, soak.now(), everything=True)
                raise
            finally:
                printed = report.render(
                    seed=arguments.seed,
                    minutes=arguments.minutes,
                    jobs=outcome_table(soak),
                    faults=soak.faults,
                    violations=list(soak.violations.values()),
                    samples=soak.samples,
                )
                print(printed, flush=True)
                (folder / "report.txt").write_text(printed + "\n")
    raise SystemExit(1 if soak.violations else 0)
