"""`manifests.records`: the reservations the jobs' attempt records hold, and the label that lists those records."""

from __future__ import annotations

import dataclasses
import datetime
import json
from typing import Any

import pytest

from paralleljob.manifests import labels, records
from paralleljob.planning.inventory import Reservation

NOW = datetime.datetime(2026, 12, 1, 12, 0, 0, tzinfo=datetime.UTC)
LIVE = records.AttemptRecord(0, {}, "trainer:1", ("gpu-1", "gpu-2"), gpus_per_node=4)
RESTARTED = LIVE.with_restart("pod failed", (), into=1, held=("gpu-2",), until="2026-12-01T12:00:30Z")


def config_map(record: records.AttemptRecord, *, owned: bool = True, plan: dict[str, Any] | None = None) -> dict:
    metadata: dict[str, Any] = {"name": "gpt-config", "namespace": "research", "labels": {labels.JOB_LABEL: "gpt"}}
    if owned:
        metadata["ownerReferences"] = [{"kind": "ParallelJob", "name": "gpt", "uid": "u1", "controller": True}]
    data = {"plan.json": json.dumps(plan)} if plan is not None else {}
    return records.stamp({"metadata": metadata, "data": data}, record)


CASES = {
    "a live attempt holds every node whose pod is not bound": (
        config_map(LIVE),
        {("research", "gpt-0")},
        [Reservation("gpu-2", 4, "research/gpt")],
    ),
    "a restart holds its old nodes until its hold ends": (
        config_map(RESTARTED),
        set(),
        [Reservation("gpu-2", 4, "research/gpt")],
    ),
    "a hold that ended holds nothing": (
        config_map(dataclasses.replace(RESTARTED, held_until="2026-12-01T11:59:59Z")),
        set(),
        [],
    ),
    "a finished job holds nothing": (config_map(LIVE.with_outcome("Succeeded")), set(), []),
    "a name conflict released the nodes": (config_map(LIVE.with_conflict("Service gpt already exists")), set(), []),
    "a ConfigMap no ParallelJob controls is no record": (config_map(LIVE, owned=False), set(), []),
    "hot spares are held while every pod is bound": (
        config_map(dataclasses.replace(LIVE, spare_nodes=("gpu-3",))),
        {("research", "gpt-0"), ("research", "gpt-1")},
        [Reservation("gpu-3", 4, "research/gpt")],
    ),
    "a node rank moved to a spare holds the spare, not the lost node": (
        config_map(dataclasses.replace(LIVE, spare_nodes=("gpu-3", "gpu-4")).with_spares_taken({1: "gpu-4"})),
        {("research", "gpt-0")},
        [Reservation("gpu-4", 4, "research/gpt"), Reservation("gpu-3", 4, "research/gpt")],
    ),
    "an older record's GPUs come from its plan": (
        config_map(dataclasses.replace(LIVE, gpus_per_node=0), plan={"ranksPerNode": 8}),
        {("research", "gpt-1")},
        [Reservation("gpu-1", 8, "research/gpt")],
    ),
}


@pytest.mark.parametrize(("found", "bound", "expected"), CASES.values(), ids=CASES.keys())
def test_reservations_of_the_records(found: dict, bound: set, expected: list[Reservation]) -> None:
    assert records.reservations_of([found], bound=bound, now=NOW) == expected


def test_the_job_being_planned_counts_none_of_its_own() -> None:
    assert records.reservations_of([config_map(LIVE)], exclude=("research", "gpt"), now=NOW) == []


@pytest.mark.parametrize(
    ("record", "reserving"),
    [(LIVE, True), (RESTARTED, True), (RESTARTED.without_hold(), False), (LIVE.with_outcome("Failed"), False)],
    ids=["live", "holding-after-a-restart", "restarted-without-a-hold", "finished"],
)
def test_only_records_that_reserve_nodes_carry_the_label_the_admissions_list(record, reserving) -> None:
    found = config_map(record)["metadata"]["labels"]
    assert (found.get(labels.RESERVING_LABEL) == "true") is reserving
    assert records.labels_of(record) == {labels.RESERVING_LABEL: "true" if reserving else None}


def test_a_record_reads_back_as_written() -> None:
    record = dataclasses.replace(
        RESTARTED,
        layout_choice={"pipeline": 2},
        started_at="2026-12-01T11:00:00Z",
        network_report={"verified": "True"},
        in_place_restarts=2,
        excluded_nodes=("gpu-1", "gpu-3"),
        suspect_nodes=("gpu-3",),
    )
    assert records.parse_record(record.to_json()) == record
    record = dataclasses.replace(LIVE, spare_nodes=("gpu-3", "gpu-4")).with_spares_taken({0: "gpu-3"}, ("gpu-4",))
    assert (record.nodes, record.spare_nodes, record.replacing) == (("gpu-3", "gpu-2"), (), (0,))
    grown = LIVE.with_grow_after(10).with_grow_restart()
    assert records.parse_record(grown.to_json()) == grown
    assert (grown.grow_after, grown.grow_restarts) == (10, 1)
    restarted = RESTARTED.with_grow_restart()
    assert (restarted.next_attempt, restarted.counted_restarts) == (1, 0)  # a grow-back counts for nothing
    assert records.parse_record(record.to_json()) == record


def test_in_place_restarts_count_against_backoff_limit_with_the_attempt_number() -> None:
    record = dataclasses.replace(RESTARTED, restarted_as=None, attempt=1).with_in_place_restarts(2)
    assert record.restarts == 3
    # What counts against backoffLimit: both kinds, less a grow-back to full size.
    assert (record.counted_restarts, record.with_grow_restart().counted_restarts) == (3, 2)
