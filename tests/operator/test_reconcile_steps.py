"""The decisions of each reconcile step (`handlers.steps`), on plain data: one table per step, as the gang
judgment's (`test_policies.py`). The operator tests drive the same steps against an API server."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from paralleljob import planning
from paralleljob.api import validate_document
from paralleljob.handlers import observe
from paralleljob.handlers.observed import INVALID_NOTE
from paralleljob.handlers.steps import admission, conflicts, creation, draining, finished, invalid, supervision
from paralleljob.manifests import configmap, labels
from tests.api.helpers import BASE


def pod(name: str, node: str = "n0", *, terminating: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if terminating:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": metadata, "spec": {"nodeName": node}}


# Step 1, finished: an edit after the end changes only the Valid condition.
@pytest.mark.parametrize(
    ("problems", "valid"),
    [
        (None, ("True", "Validated", "the spec is valid")),
        ("spec.model.layers: 0 is below 1", ("False", "InvalidSpec", "spec.model.layers: 0 is below 1")),
    ],
    ids=["valid-edit", "invalid-edit"],
)
def test_a_finished_job_reports_only_whether_its_current_spec_is_valid(problems, valid):
    assert finished.valid_after_end(problems) == valid


# Step 2, invalid: the gang's own message survives an invalid edit, without the note the edit added.
@pytest.mark.parametrize(
    ("status_message", "kept"),
    [
        ("all 4 pods running", "all 4 pods running"),
        (f"all 4 pods running{INVALID_NOTE}spec.model.layers: 0 is below 1", "all 4 pods running"),
        ("", "supervising the running attempt"),
        (f"{INVALID_NOTE}spec.x: bad", "supervising the running attempt"),
    ],
    ids=["plain", "noted", "empty", "only-the-note"],
)
def test_an_invalid_edit_keeps_the_running_gangs_own_message(status_message, kept):
    assert invalid.running_message(status_message) == kept


# Step 3, draining: which Terminating pods of an older attempt are forced, and when to look again.
@pytest.mark.parametrize(
    ("lost", "alone_on_partitioned_node", "deleting_for", "verdict"),
    [
        (False, False, 500.0, (draining.KUBELET, None)),
        (True, True, 500.0, (draining.WAIT_FOR_NODE, None)),
        (True, False, 120.0, (draining.FORCE, None)),
        (True, False, 500.0, (draining.FORCE, None)),
        (True, False, 100.0, (draining.WAIT, 20.5)),
    ],
    ids=["node-alive", "only-pod-on-partitioned-node", "just-overdue", "long-overdue", "not-yet-overdue"],
)
def test_a_terminating_pod_of_an_older_attempt_is_forced_only_on_a_lost_node_once_overdue(
    lost, alone_on_partitioned_node, deleting_for, verdict
):
    found = draining.terminating_verdict(
        on_lost_node=lost,
        alone_on_partitioned_node=alone_on_partitioned_node,
        deleting_for=deleting_for,
        force_after=120.0,
    )
    assert found == verdict


# Step 4, name conflicts: a job waiting for a deleted namesake's pods names them, the stuck ones first.
@pytest.mark.parametrize(
    ("previous", "said"),
    [
        ([pod("a-0"), pod("a-1", "n1")], "waiting for 2 pods of a deleted job of the same name to go (still there): "
         "a-0 (node n0), a-1 (node n1)"),
        ([pod("a-0"), pod("a-1", "n1", terminating=True)], "waiting for 2 pods of a deleted job of the same name to "
         "go (stuck Terminating): a-1 (node n1)"),
        ([pod(f"a-{i}") for i in range(7)], "waiting for 7 pods of a deleted job of the same name to go (still "
         "there): a-0 (node n0), a-1 (node n0), a-2 (node n0), a-3 (node n0), a-4 (node n0) and 2 more"),
    ],
    ids=["still-there", "stuck-first", "at-most-five"],
)  # fmt: skip
def test_a_job_waiting_for_its_namesakes_pods_says_which(previous, said):
    assert conflicts.waiting_message(previous) == said


# Step 5, admission (what it observes): the usage index's pods of this job that the API no longer has are not counted against it.
@pytest.mark.parametrize(
    ("claims", "present", "departed"),
    [
        ([("ns", "job-0"), ("ns", "job-1")], {"job-0"}, [("ns", "job-1")]),
        ([("ns", "job-0"), ("other", "job-1")], set(), [("ns", "job-0")]),
        ([("ns", "job-extra-0"), ("ns", "jobs-1"), ("ns", "job-x")], set(), []),
        ([("ns", "job-0")], {"job-0"}, []),
    ],
    ids=["one-gone", "other-namespace", "other-jobs-names", "none-gone"],
)
def test_an_admission_does_not_wait_on_its_own_departed_pods(claims, present, departed):
    assert observe.departed_pods("ns", "job", claims, present) == departed


def plan_config_map(uid: str, attempt: int, nodes: int) -> dict[str, Any]:
    """A `-config` ConfigMap whose job file plans `nodes` pods of one rank each."""
    plan = {"layout": {"pipeline": 1, "tensor": 1, "data": nodes}, "ranksPerNode": 1}
    return {
        "metadata": {
            "ownerReferences": [{"kind": "ParallelJob", "controller": True, "uid": uid}],
            "labels": {labels.ATTEMPT_LABEL: str(attempt)},
        },
        "data": {configmap.JOB_FILE: json.dumps({"plan": plan})},
    }


# Step 6, creation: pods are created only from this attempt's plan for the nodes its record placed.
@pytest.mark.parametrize(
    ("owner", "attempt", "planned_nodes", "lost"),
    [
        ("uid-1", 2, 2, False),
        ("uid-2", 2, 2, True),
        ("uid-1", 1, 2, True),
        ("uid-1", 2, 3, True),
    ],
    ids=["this-attempts-plan", "another-owners", "an-older-attempts", "another-node-count"],
)
def test_pods_are_created_only_from_this_attempts_plan(owner, attempt, planned_nodes, lost):
    found = plan_config_map(owner, attempt, planned_nodes)
    assert creation.plan_lost(found, "uid-1", 2, ["n0", "n1"]) is lost


# Step 7, supervision: a lost node breaks the gang at once when deleted, after the grace period when NotReady.
@pytest.mark.parametrize(
    ("lost", "not_ready_for", "broken", "due"),
    [
        ({"n1": "no longer exists"}, {}, {"n1": "no longer exists"}, None),
        ({"n1": "is NotReady"}, {"n1": 100.0}, {}, 200.5),
        ({"n1": "is NotReady"}, {"n1": 300.0}, {"n1": "has been NotReady for 300s (grace 300s)"}, None),
        ({"n1": "is NotReady", "n2": "is NotReady"}, {"n1": 10.0, "n2": 250.0}, {}, 50.5),
    ],
    ids=["deleted", "not-ready-within-grace", "not-ready-past-grace", "next-due-first"],
)
def test_a_lost_node_breaks_the_gang_at_once_when_deleted_and_after_the_grace_when_not_ready(
    lost, not_ready_for, broken, due
):
    assert supervision.breaking_nodes(lost, not_ready_for, 300.0) == (broken, due)


@pytest.mark.parametrize(
    ("attempt", "limit", "restarts"),
    [(0, 3, True), (2, 3, True), (3, 3, False), (0, 0, False)],
    ids=["first-failure", "last-restart", "limit-reached", "no-restarts-allowed"],
)
def test_a_broken_gang_restarts_until_its_backoff_limit(attempt, limit, restarts):
    assert supervision.restarts_left(attempt, limit) is restarts


def test_an_admitted_jobs_placement_names_each_pods_node_ranks_and_stages():
    doc = yaml.safe_load(BASE)  # 2x2x2 on nodes of 4 GPUs
    doc["spec"]["topology"] = {"axisOrder": "pipe,data,model"}
    resolved = validate_document(doc).resolved
    assert resolved is not None
    plan = planning.plan_job(resolved, planning.build_cluster(planning.local_cluster_nodes(2, 4)))
    assert isinstance(plan, planning.Plan)
    entries = admission.placement_entries("gpt", plan)
    assert [(e["nodeRank"], e["ranks"], e["stages"], e["pod"]) for e in entries] == [
        (0, "0-3", [0], "gpt-0"),
        (1, "4-7", [1], "gpt-1"),
    ]
    assert {entry["node"] for entry in entries} == {node.node for node in plan.nodes}
