"""Whole decisions of the admission step (`steps.admission`), on plain data: a job handed to the admission queue,
and the admission pass over the cluster it observed (`observe.for_admission`: the Node watch's nodes, the
reservations of other jobs, the job's `-config` ConfigMap under the lock). No API server: `k8s.apply` writes these
values after the admission lock's fence, and the operator tests show that it does (`test_admission.py`,
`test_layout_choice.py`, `test_network.py`, `test_admission_lock.py`, `test_restart_safety.py`).
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from paralleljob import planning
from paralleljob.api import ResolvedJob, validate_document
from paralleljob.handlers.nodes import NodeWatch
from paralleljob.handlers.observed import Observed
from paralleljob.handlers.placement import ClusterView
from paralleljob.handlers.settings import Settings
from paralleljob.handlers.steps import admission
from paralleljob.manifests import configmap, labels, records
from paralleljob.manifests.decisions import AttemptWrite, Decision, Event
from paralleljob.planning.inventory import ClusterBuilder
from testcluster import admin
from tests.operator.decision_data import EARLIER, NOW, STAMP, UID, condition, job

SETTINGS = Settings(image="trainer:test", resync_seconds=60.0)
DOC = yaml.safe_load((Path(__file__).parents[2] / "examples" / "gpt-small-8gpu.yaml").read_text())
VALID = condition("Valid", "True", "Validated", "the spec is valid")
VALID_NOW = condition("Valid", "True", "Validated", "the spec is valid", at=STAMP)


def spec(**changes: Any) -> tuple[dict[str, Any], ResolvedJob]:
    """The gpt-small example (PP2 x TP2 x DP2, 8 GPUs) as the job named `gpt`, with `changes` to its spec."""
    doc = copy.deepcopy(DOC)
    doc["metadata"] = {"name": "gpt", "namespace": "research"}
    doc["spec"].update(changes)
    resolved = validate_document(doc).resolved
    assert resolved is not None
    return doc, resolved


def view(nodes: int, gpus: int = 4, held: tuple[planning.Reservation, ...] = ()) -> ClusterView:
    """The Node watch's view of `nodes` free local nodes of `gpus` GPUs each, with other jobs' reservations."""
    watch = NodeWatch()
    watch.replace(planning.local_cluster_nodes(nodes, gpus))
    return ClusterView(watch.snapshot(), {}, list(held), ClusterBuilder())


def observed(
    changes: dict[str, Any] | None = None,
    *,
    cluster: ClusterView | None = None,
    record: records.AttemptRecord | None = None,
    previous: dict[str, Any] | None = None,
    status: dict[str, Any] | None = None,
) -> Observed:
    doc, resolved = spec(**(changes or {}))
    owner = {**job(**(status or {})), "spec": doc["spec"]}
    owner["metadata"]["creationTimestamp"] = EARLIER
    return Observed(
        job=owner,
        record=record,
        spec=resolved,
        cluster=cluster if cluster is not None else view(4),
        admission_config_map=previous,
    )


def attempt_of(decision: Decision) -> tuple[AttemptWrite, records.AttemptRecord]:
    """The attempt ConfigMap a decision writes, and the record in it."""
    assert decision.attempt is not None
    found = records.record_of(decision.attempt.config_map)
    assert found is not None
    return decision.attempt, found


# -- handed to the admission queue -------------------------------------------------------------------------

HELD_UNTIL_PAST = records.AttemptRecord(
    attempt=0, spec={}, image="trainer:test", nodes=("local-0", "local-1"), restarted_as=1,
    held_nodes=("local-0",), held_until=EARLIER,
)  # fmt: skip
HELD_FOR_30_S = dataclasses.replace(HELD_UNTIL_PAST, held_until="2026-01-01T12:00:30Z")
HELD_STATUS = {"phase": "Restarting", "heldNodes": ["local-0"], "heldUntil": EARLIER}


@pytest.mark.parametrize(
    ("seen", "decision"),
    [
        pytest.param(observed(), Decision("awaiting-admission"), id="a-new-job-waits-for-its-turn"),
        pytest.param(
            observed(record=HELD_FOR_30_S, status=HELD_STATUS),
            Decision("awaiting-admission", requeue_after=30.5),
            id="a-restarting-gang-holding-its-nodes-looks-again-when-the-hold-ends",
        ),
        pytest.param(
            observed(record=HELD_UNTIL_PAST, status=HELD_STATUS),
            Decision(
                "awaiting-admission",
                record=HELD_UNTIL_PAST.without_hold(),
                status={"heldNodes": None, "heldUntil": None, "observedGeneration": 2},
                wake_others=True,
            ),
            id="a-hold-that-ran-out-lets-the-waiting-jobs-in",
        ),
    ],
)
def test_a_job_without_a_placement_is_handed_to_the_admission_queue(seen: Observed, decision: Decision) -> None:
    assert admission.awaiting(seen, NOW) == decision


def test_the_queue_orders_restarting_gangs_by_their_record_and_others_by_priority_and_age() -> None:
    template = {**DOC["spec"].get("template", {}), "priorityClassName": "research-high"}
    assert admission.request(observed({"template": template})) == admission.AdmissionRequest(
        restarting=False, priority_class="research-high", created=EARLIER
    )
    assert admission.request(observed(record=HELD_UNTIL_PAST)).restarting is True


# -- the admission pass ------------------------------------------------------------------------------------

ADMITTED_MESSAGE = "placed 2 node ranks; creating pods"
PLACEMENT = [
    {"nodeRank": 0, "node": "local-0", "ranks": "0-3", "stages": [0], "pod": "gpt-0"},
    {"nodeRank": 1, "node": "local-1", "ranks": "4-7", "stages": [1], "pod": "gpt-1"},
]


def admitted_status(decision: Decision, *, phase: str = "Pending", restarts: int = 0) -> dict[str, Any]:
    """The status an admission writes for gpt-small on two 4-GPU nodes (its NCCL environment is the attempt's)."""
    attempt, _ = attempt_of(decision)
    scheduled = condition("Scheduled", "True", "Admitted", ADMITTED_MESSAGE, at=STAMP)
    return {
        "phase": phase,
        "message": ADMITTED_MESSAGE,
        "conditions": [VALID_NOW, scheduled],
        "layout": "2x2x2",
        "worldSize": 8,
        "nodes": 2,
        "gpusPerNode": 4,
        "axisOrder": "pipe,data,model",
        "placement": PLACEMENT,
        "spareNodes": None,
        "ncclEnv": configmap.network_of(attempt.config_map)["ncclEnv"],
        "restarts": restarts,
        "podsReady": 0,
        "heldNodes": None,
        "heldUntil": None,
        "observedGeneration": 2,
    }


def test_a_job_that_fits_is_admitted_its_configmap_reserving_the_planned_nodes() -> None:
    decision = admission.decide(observed(), SETTINGS, NOW)
    attempt, record = attempt_of(decision)
    assert attempt.replaces is None and attempt.fenced  # created, after the admission lock's fence
    assert labels.owned_by(attempt.config_map, UID)
    assert (record.attempt, record.nodes, record.gpus_per_node, record.image) == (
        0,
        ("local-0", "local-1"),
        4,
        "trainer:test",
    )
    assert (record.excluded_nodes, record.spare_nodes, record.layout_choice) == ((), (), None)
    assert configmap.plan_of(attempt.config_map).nodes == 2
    assert decision == Decision("admitted", attempt=attempt, status=admitted_status(decision))


def test_a_restart_replaces_the_previous_attempts_configmap_in_one_write_and_keeps_its_counts() -> None:
    before = admission.decide(observed(), SETTINGS, NOW).attempt
    assert before is not None
    previous = {**before.config_map, "metadata": {**before.config_map["metadata"], "resourceVersion": "41"}}
    restarted = records.AttemptRecord(
        attempt=0, spec={}, image="trainer:old", nodes=("local-0", "local-1"), restarted_as=1,
        excluded_nodes=("local-1",), grow_restarts=2,
    )  # fmt: skip
    status = {"phase": "Restarting", "conditions": [VALID]}
    decision = admission.decide(observed(record=restarted, previous=previous, status=status), SETTINGS, NOW)
    attempt, record = attempt_of(decision)
    assert attempt.replaces == previous  # made into the new attempt at the read resourceVersion
    # The node that broke the last attempt is left out where the job fits without it.
    assert (record.attempt, record.nodes, record.excluded_nodes) == (1, ("local-0", "local-2"), ("local-1",))
    assert (record.image, record.grow_restarts) == ("trainer:test", 2)
    assert decision.status is not None
    assert (decision.status["phase"], decision.status["restarts"]) == ("Restarting", 1)
    assert [entry["node"] for entry in decision.status["placement"]] == ["local-0", "local-2"]


def namesake_config_map() -> dict[str, Any]:
    """The `-config` ConfigMap a deleted job of the same name left, not yet collected."""
    attempt = admission.decide(observed(), SETTINGS, NOW).attempt
    assert attempt is not None
    found = copy.deepcopy(dict(attempt.config_map))
    found["metadata"]["ownerReferences"][0]["uid"] = "uid-of-the-deleted-job"
    assert labels.claim_of(found, "gpt", UID) == "namesake"
    return found


UNSCHEDULABLE = "needs 8 GPUs as 2 node ranks of 4"


@pytest.mark.parametrize(
    ("seen", "decision"),
    [
        pytest.param(
            observed(previous=namesake_config_map()),
            Decision("waiting-for-previous-job", requeue_after=2.0),
            id="a-deleted-namesakes-configmap-is-waited-for-not-replaced",
        ),
        pytest.param(
            observed(cluster=view(1)),
            "unschedulable-said",
            id="a-job-that-does-not-fit-says-why-once",
        ),
        pytest.param(
            observed(cluster=view(1), record=HELD_FOR_30_S, status={"phase": "Restarting"}),
            "unschedulable-restarting",
            id="a-restarting-gang-that-does-not-fit-looks-again-when-its-hold-ends",
        ),
    ],
)
def test_an_admission_that_cannot_place_the_job_writes_no_attempt(seen: Observed, decision: Decision | str) -> None:
    decided = admission.decide(seen, SETTINGS, NOW)
    assert decided.attempt is None
    if isinstance(decision, Decision):
        assert decided == decision
        return
    assert decided.step == "unschedulable"
    assert decided.status is not None
    reason = decided.status["message"]
    phase = "Pending" if decision == "unschedulable-said" else "Restarting"
    scheduled = condition("Scheduled", "False", "Unschedulable", reason, at=STAMP)
    assert decided == Decision(
        "unschedulable",
        status={
            "phase": phase, "message": reason, "conditions": [VALID_NOW, scheduled], "placement": None,
            "observedGeneration": 2,
        },
        events=(Event("Warning", "Unschedulable", reason),),
        requeue_after=60.0 if decision == "unschedulable-said" else 30.5,
    )  # fmt: skip
    # The next pass over the same cluster writes nothing: a waiting job is quiet.
    again = admission.decide(seen.with_status(decided.status), SETTINGS, NOW)
    assert (again.status, again.events, again.step) == (None, (), "unschedulable")


def test_a_restarting_gang_that_lost_a_node_resumes_at_a_smaller_data_parallelism_and_says_so_first() -> None:
    restarted = records.AttemptRecord(
        attempt=0, spec={}, image="trainer:test", nodes=("local-0", "local-1"), restarted_as=1
    )
    policy = {**DOC["spec"]["failurePolicy"], "allowDataShrink": True}
    decision = admission.decide(observed({"failurePolicy": policy}, cluster=view(1), record=restarted), SETTINGS, NOW)
    said = Event(
        "Warning",
        "DataShrunk",
        "2x2x2 does not fit on the nodes left (" + _reason(view(1)) + "); resuming as 2x2x1: "
        "data parallelism 2 -> 1, gradient accumulation 8 -> 16, global batch 64 kept; it grows back at a "
        "checkpoint once the full size fits",
    )
    assert decision.first == (Decision("planned", events=(said,)),)  # written whole before the attempt
    _, record = attempt_of(decision)
    assert (record.attempt, record.nodes) == (1, ("local-0",))
    assert decision.status is not None and decision.status["layout"] == "2x2x1"


AFTER_A_CRASH_AND_A_SLOW_LINK = records.AttemptRecord(
    attempt=1, spec={}, image="trainer:test", nodes=("local-0", "local-1"), restarted_as=2,
    excluded_nodes=("local-0", "local-1"), suspect_nodes=("local-0",),
)  # fmt: skip


def test_a_gang_that_fits_only_with_an_excluded_node_takes_back_the_one_a_pod_failed_on_not_the_slow_one() -> None:
    """Found by CI: a job whose slow node (named by the link check) was excluded, then a crash excluded a second
    node; on 3 nodes the 2-node job fit without neither, and planning with both put it on the slow node again,
    where every later attempt failed its preflight. Now the node excluded after a crash comes back first."""
    decision = admission.decide(observed(cluster=view(3), record=AFTER_A_CRASH_AND_A_SLOW_LINK), SETTINGS, NOW)
    _, record = attempt_of(decision)
    assert (record.attempt, sorted(record.nodes)) == (2, ["local-1", "local-2"])
    assert (record.excluded_nodes, record.suspect_nodes) == (("local-0", "local-1"), ("local-0",))
    # With every excluded node suspect, the last resort is still to plan with them: the job is not stranded.
    all_suspect = dataclasses.replace(AFTER_A_CRASH_AND_A_SLOW_LINK, suspect_nodes=("local-0", "local-1"))
    decision = admission.decide(observed(cluster=view(3), record=all_suspect), SETTINGS, NOW)
    assert decision.step == "admitted" and decision.attempt is not None


def _reason(cluster: ClusterView) -> str:
    """The planner's own reason the full-size job does not fit `cluster`."""
    decided = admission.decide(observed(cluster=cluster), SETTINGS, NOW)
    assert decided.status is not None
    return str(decided.status["message"])


def test_verify_fail_on_nodes_without_rdma_ends_the_job_before_any_pod_its_record_failed_first() -> None:
    """With the assertions of test_network.py's operator-process test, moved here: the condition names the nodes
    that offer no RDMA resource, and the message says no pod was created (none is: the attempt's record is
    Failed, so the next pass takes the finished step, which creates nothing)."""
    decision = admission.decide(observed({"network": {"fabric": "infiniband", "verify": "fail"}}), SETTINGS, NOW)
    attempt, record = attempt_of(decision)
    assert not attempt.fenced  # it reserves nothing: the record says Failed
    assert record.outcome == "Failed"
    assert decision.status is not None
    message = decision.status["message"]
    assert message.endswith("; spec.network.verify is fail, so no pod was created")
    reason = message.removesuffix("; spec.network.verify is fail, so no pod was created")
    assert "offer no RDMA resource" in reason
    assert decision.creates == ()
    assert decision == Decision(
        "failed",
        attempt=attempt,
        status={
            "phase": "Failed",
            "message": message,
            "conditions": [
                VALID_NOW,
                condition("NetworkReady", "False", "NoRdmaResource", reason, at=STAMP),
                condition("Failed", "True", "NetworkNotReady", message, at=STAMP),
            ],
            "podsReady": 0,
            "completionTime": STAMP,
            "observedGeneration": 2,
        },
        events=(Event("Warning", "Failed", message),),
        wake_others=True,
    )


# -- a job that gives a GPU budget -------------------------------------------------------------------------

# The example's model on a budget of 8 GPUs: the layout search splits the global batch of 64.
BUDGET = {
    "parallelism": {"gpus": 8},
    "deepspeed": {**{k: v for k, v in DOC["spec"]["deepspeed"].items() if "batch" not in k and "accumulation" not in k},
                  "train_batch_size": 64},
}  # fmt: skip


def test_a_budget_job_says_its_layout_first_then_is_admitted_at_it_and_the_record_keeps_the_choice() -> None:
    decision = admission.decide(observed(BUDGET), SETTINGS, NOW)
    assert len(decision.first) == 1
    chosen = decision.first[0]
    assert chosen.step == "layout-chosen" and chosen.attempt is None
    assert chosen.status is not None
    layout, choice = chosen.status["layout"], chosen.status["layoutChoice"]
    message = chosen.events[0].message
    assert chosen == Decision(
        "layout-chosen",
        status={
            "layoutChoice": choice,
            "layout": layout,
            "conditions": [condition("LayoutChosen", "True", "LayoutChosen", message, at=STAMP)],
            "observedGeneration": 2,
        },
        events=(Event("Normal", "LayoutChosen", message),),
    )
    _, record = attempt_of(decision)
    assert record.layout_choice == choice  # restarts place the same layout
    assert decision.status is not None and decision.status["layout"] == layout
    # The admitted status builds on the conditions the choice wrote.
    assert sorted(c["type"] for c in decision.status["conditions"]) == ["LayoutChosen", "Scheduled", "Valid"]


def test_a_budget_job_no_layout_fits_waits_pending_and_says_so_once() -> None:
    seen = observed(BUDGET, cluster=view(1, gpus=2))
    decision = admission.decide(seen, SETTINGS, NOW)
    assert decision.status is not None
    message = decision.status["message"]
    no_layout = condition("LayoutChosen", "False", "NoLayout", message, at=STAMP)
    assert decision == Decision(
        "no-layout",
        status={"phase": "Pending", "message": message, "conditions": [VALID_NOW, no_layout], "observedGeneration": 2},
        events=(Event("Warning", "NoLayout", message),),
        requeue_after=60.0,
    )
    again = admission.decide(seen.with_status(decision.status), SETTINGS, NOW)
    assert (again.status, again.events) == (None, ())


def test_a_budget_no_layout_uses_waits_with_one_line_and_no_attempt() -> None:
    """Moved from test_layout_choice.py (an operator-process test), with the same assertions: the operator
    tests' job on a budget of 7 GPUs, which no layout of its model uses, on two nodes."""
    doc = admin.job_doc(parallelism={"gpus": 7})
    doc["spec"]["deepspeed"] = {"train_batch_size": 32}
    resolved = validate_document(doc).resolved
    assert resolved is not None
    seen = Observed(job={**job(), "spec": doc["spec"]}, spec=resolved, cluster=view(2))
    decision = admission.decide(seen, SETTINGS, NOW)
    assert decision.status is not None
    chosen = {c["type"]: c for c in decision.status["conditions"]}["LayoutChosen"]
    assert (chosen["status"], chosen["reason"]) == ("False", "NoLayout")
    assert chosen["message"].startswith("no valid layout uses exactly 7 GPUs")
    assert decision.attempt is None  # no attempt ConfigMap, so no pod: the creation step makes pods from it


def test_a_planner_that_raises_is_a_planning_failure_not_a_crash() -> None:
    broken = dataclasses.replace(view(4), usage={"local-0": "not a usage record"})  # type: ignore[dict-item]
    with pytest.raises(admission.PlanningFailed):
        admission.decide(observed(cluster=broken), SETTINGS, NOW)


def test_the_clock_is_the_passes_own() -> None:
    """The hold is measured on the `now` the pass gives (the API server's clock), not the operator's."""
    later = NOW + datetime.timedelta(seconds=20)
    assert admission.awaiting(observed(record=HELD_FOR_30_S), later).requeue_after == 10.5
