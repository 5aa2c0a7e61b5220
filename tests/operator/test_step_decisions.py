"""Whole decisions of the reconcile steps (`handlers.steps`), on plain data: what a step writes (the status patch,
its Events, the attempt record, the pods deleted and forced) and what it asks of the scheduler, for each case, from
one `Observed` built here. No API server: `k8s.apply` writes these values, and the operator tests show that it
does (`test_invalid.py`, `test_recreated_job.py`, `test_name_conflicts.py`, `test_not_ready.py`, and for the spare
step `test_lost_nodes.py`, `test_out_of_service.py`, `test_stragglers.py`, `test_killed_after_the_record.py`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from paralleljob import planning
from paralleljob.api import validate_document
from paralleljob.handlers import reported
from paralleljob.handlers.observed import INVALID_NOTE, Observed
from paralleljob.handlers.settings import Settings
from paralleljob.handlers.steps import conflicts, creation, draining, finished, invalid, replacement
from paralleljob.manifests import children, labels, records
from paralleljob.manifests.decisions import Decision, Event
from tests.operator.decision_data import EARLIER, NOW, READY, STAMP, condition, job, pod, seconds_before_now

SETTINGS = Settings(image="trainer:test", force_delete_after_seconds=120.0, resync_seconds=60.0)
SPEC = validate_document(
    yaml.safe_load((Path(__file__).parents[2] / "examples" / "gpt-small-8gpu.yaml").read_text())
).resolved
INVALID = "spec.template.env[0].name: PARALLELJOB_NODE_RANK is set by the operator"


VALID = condition("Valid", "True", "Validated", "the spec is valid")
SUCCEEDED = condition("Succeeded", "True", "TrainingFinished", "training finished after 0 restarts")


def record(**fields: Any) -> records.AttemptRecord:
    return records.AttemptRecord(**{"attempt": 0, "spec": {}, "image": "trainer:test", "nodes": ("n0", "n1"), **fields})


def seen(job_: dict[str, Any], **fields: Any) -> Observed:
    fields.setdefault("spec", SPEC)
    return Observed(job=job_, **fields)


# -- step 1, finished ---------------------------------------------------------------------------------------

FINISHED = {
    "phase": "Succeeded",
    "message": "training finished",
    "conditions": [VALID, SUCCEEDED],
    "observedGeneration": 2,
}


@pytest.mark.parametrize(
    ("observed", "decision"),
    [
        pytest.param(
            seen(job(**FINISHED), record=record(outcome="Succeeded"), pods=(pod("gpt-0", phase="Succeeded"),)),
            Decision("finished"),
            id="quiet-succeeded-job-writes-nothing",
        ),
        pytest.param(
            seen(
                job(**FINISHED),
                record=record(outcome="Succeeded"),
                pods=(pod("gpt-0", phase="Succeeded"), pod("gpt-1"), pod("gpt-2", deleting_since=EARLIER)),
            ),
            Decision("finished", deletes=("gpt-1",)),
            id="succeeded-keeps-its-succeeded-pods-for-their-logs",
        ),
        pytest.param(
            seen(
                job(phase="Failed", conditions=[VALID], observedGeneration=2),
                record=record(outcome="Failed"),
                pods=(pod("gpt-0", phase="Succeeded"), pod("gpt-1", phase="Failed"), pod("gpt-2")),
            ),
            Decision("finished", deletes=("gpt-0", "gpt-2")),
            id="failed-deletes-every-pod-not-failed",
        ),
        pytest.param(
            seen(job(**FINISHED), record=record(outcome="Succeeded"), spec=None, spec_problems=INVALID),
            Decision(
                "finished",
                status={
                    "conditions": [condition("Valid", "False", "InvalidSpec", INVALID, STAMP), SUCCEEDED],
                    "observedGeneration": 2,
                },
            ),
            id="an-invalid-edit-after-the-end-changes-only-valid",
        ),
    ],
)
def test_a_finished_job_changes_only_its_valid_condition_and_frees_the_gpus(observed, decision):
    assert finished.decide(observed, SETTINGS, NOW) == decision


def test_an_invalid_edit_after_success_changes_nothing_but_valid():
    """Moved from test_invalid.py (an operator-process test), with the same assertions on the status written."""
    before = {**FINISHED, "completionTime": EARLIER, "startTime": EARLIER, "restarts": 0}
    edited = seen(job(**before), record=record(outcome="Succeeded"), spec=None, spec_problems=INVALID)
    decision = finished.decide(edited, SETTINGS, NOW)
    assert decision.status is not None and not decision.events
    after = {**before, **decision.status}
    unchanged = ("phase", "message", "completionTime", "startTime", "restarts")
    assert {key: after.get(key) for key in unchanged} == {key: before.get(key) for key in unchanged}
    assert [c["type"] for c in after["conditions"] if c not in before["conditions"]] == ["Valid"]


# -- step 2, invalid ----------------------------------------------------------------------------------------

PENDING_INVALID = {
    "phase": "Pending",
    "message": f"invalid spec: {INVALID}",
    "conditions": [condition("Valid", "False", "InvalidSpec", INVALID, STAMP)],
    "placement": None,
    "heldNodes": None,
    "heldUntil": None,
    "observedGeneration": 2,
}
SAID = {key: value for key, value in PENDING_INVALID.items() if value is not None}
RESTARTED = record(restarted_as=1, held_nodes=("n0",), held_until=STAMP)


@pytest.mark.parametrize(
    ("observed", "decision"),
    [
        pytest.param(
            seen(job(), spec=None, spec_problems=INVALID),
            Decision("invalid", status=PENDING_INVALID, events=(Event("Warning", "InvalidSpec", INVALID),)),
            id="new-job-valid-false-and-one-event",
        ),
        pytest.param(
            seen(job(**SAID), spec=None, spec_problems=INVALID),
            Decision("invalid"),
            id="said-already-no-write-no-event",
        ),
        pytest.param(
            seen(job(phase="Restarting"), record=RESTARTED, spec=None, spec_problems=INVALID),
            Decision(
                "invalid",
                status=PENDING_INVALID,
                events=(Event("Warning", "InvalidSpec", INVALID),),
                record=RESTARTED.without_hold(),
                wake_others=True,
            ),
            id="restart-into-an-invalid-spec-releases-its-hold",
        ),
    ],
)
def test_an_invalid_job_without_an_attempt_waits_pending_and_holds_nothing(observed, decision):
    assert invalid.decide(observed, SETTINGS, NOW) == decision


def test_an_invalid_edit_to_a_running_job_keeps_the_running_attempt():
    """Moved from test_invalid.py (an operator-process test): the same assertions, on the decision."""
    running = {"phase": "Running", "message": "all 2 pods running", "conditions": [VALID, READY]}
    pods = (pod("gpt-0"), pod("gpt-1", node="n1"))
    edited = seen(job(**running), record=record(placed=True), spec=None, spec_problems=INVALID, pods=pods)
    decision = invalid.decide(dataclasses.replace(edited, spec_problem=INVALID), SETTINGS, NOW)
    assert decision.status is not None
    status = {**running, **decision.status}
    valid = next(c for c in status["conditions"] if c["type"] == "Valid")
    assert (valid["status"], valid["reason"]) == ("False", "InvalidSpec")
    assert status["phase"] == "Running"
    assert "the running attempt continues" in status["message"]
    assert status["message"] == f"all 2 pods running{INVALID_NOTE}{INVALID}"
    assert not (decision.deletes or decision.force_deletes or decision.record)
    assert decision.events == (Event("Warning", "InvalidSpec", f"{INVALID}{INVALID_NOTE.split('; invalid')[0]}"),)


# -- step 3, draining ---------------------------------------------------------------------------------------


def stale(**fields: Any) -> Observed:
    """A job on attempt 1 whose attempt-0 pods are still there."""
    return seen(job(phase="Restarting", message="gang restart 1/2"), record=record(restarted_as=1), **fields)


STUCK_ALONE = (
    "pod gpt-0 is stuck Terminating on NotReady node n0; it is the gang's only pod, so it is not force-deleted: "
    "delete the node, or taint it node.kubernetes.io/out-of-service=nodeshutdown:NoExecute once it is known to be "
    "down"
)


@pytest.mark.parametrize(
    ("observed", "decision"),
    [
        pytest.param(
            stale(pods=(pod("gpt-0"), pod("gpt-1", node="n1"), pod("gpt-2", attempt=1))),
            Decision("deleting-old-generation", deletes=("gpt-0", "gpt-1")),
            id="old-pods-deleted-gracefully-the-new-kept",
        ),
        pytest.param(
            stale(pods=(pod("gpt-0", deleting_since=seconds_before_now(130)),), lost={"n0": "no longer exists"}),
            Decision("deleting-old-generation", force_deletes=("gpt-0",), requeue_after=120.0),
            id="forced-on-a-lost-node-once-overdue",
        ),
        pytest.param(
            stale(pods=(pod("gpt-0", deleting_since=seconds_before_now(100)),), lost={"n0": "no longer exists"}),
            Decision("deleting-old-generation", requeue_after=20.5),
            id="waited-for-until-overdue",
        ),
        pytest.param(
            stale(pods=(pod("gpt-0", deleting_since=seconds_before_now(10)),)),
            Decision("deleting-old-generation", requeue_after=120.0),
            id="left-to-a-live-kubelet",
        ),
        pytest.param(
            stale(
                pods=(pod("gpt-0", deleting_since=seconds_before_now(500), gang_size=1),),
                lost={"n0": "is NotReady"},
                not_ready=frozenset({"n0"}),
            ),
            Decision(
                "deleting-old-generation",
                status={"message": STUCK_ALONE, "observedGeneration": 2},
                events=(Event("Warning", "StuckTerminating", STUCK_ALONE),),
                requeue_after=60.0,
            ),
            id="only-pod-on-a-partitioned-node-waits-for-the-node",
        ),
        pytest.param(
            stale(
                pods=(pod("gpt-0", deleting_since=seconds_before_now(500), gang_size=1),),
                lost={"n0": "is NotReady"},
                not_ready=frozenset({"n0"}),
                out_of_service=frozenset({"n0"}),
            ),
            Decision("deleting-old-generation", force_deletes=("gpt-0",), requeue_after=120.0),
            id="only-pod-forced-once-its-node-is-out-of-service",
        ),
    ],
)
def test_an_older_attempts_pods_are_deleted_and_forced_only_on_a_lost_node(observed, decision):
    assert draining.decide(observed, SETTINGS, NOW) == decision


def test_a_pod_stuck_terminating_on_a_live_node_is_named_once():
    stuck = stale(pods=(pod("gpt-0", deleting_since=EARLIER),))
    decision = draining.decide(stuck, SETTINGS, NOW)
    assert (
        decision.status is not None
        and "gpt-0 of the previous attempt is stuck Terminating" in decision.status["message"]
    )
    assert [event.reason for event in decision.events] == ["StuckTerminating"]
    assert not decision.force_deletes
    said = dataclasses.replace(stuck, job=job(**{**stuck.status, **decision.status}))
    assert draining.decide(said, SETTINGS, NOW) == dataclasses.replace(decision, status=None, events=())


# -- step 4, name conflicts ---------------------------------------------------------------------------------

CONFLICT = (
    "Service gpt already exists and is not this ParallelJob's (its controller: someone); delete or rename it, and "
    "the job is admitted again"
)
WAITING = "waiting for 1 pods of a deleted job of the same name to go (still there): gpt-0 (node n0)"


@pytest.mark.parametrize(
    ("observed", "decision"),
    [
        pytest.param(
            seen(job(phase="Pending"), namesake=(pod("gpt-0", owner="uid-0"),)),
            Decision(
                "waiting-for-previous-job",
                status={"phase": "Pending", "message": WAITING, "observedGeneration": 2},
                events=(Event("Normal", "WaitingForPreviousJob", WAITING),),
                deletes=("gpt-0",),
                requeue_after=2.0,
            ),
            id="namesakes-pods-deleted-and-waited-for",
        ),
        pytest.param(
            seen(job(phase="Pending", message=WAITING, observedGeneration=2), namesake=(pod("gpt-0", owner="uid-0"),)),
            Decision("waiting-for-previous-job", deletes=("gpt-0",), requeue_after=2.0),
            id="said-already",
        ),
    ],
)
def test_a_job_waits_for_its_deleted_namesakes_pods(observed, decision):
    drained = draining.drain(observed, observed.namesake, SETTINGS, NOW)
    assert conflicts.wait_for_previous_job(observed, drained) == decision


@pytest.mark.parametrize(
    ("observed", "decision"),
    [
        pytest.param(
            seen(job(phase="Pending", conditions=[VALID]), record=record(), refused=CONFLICT, pods=(pod("gpt-0"),)),
            Decision(
                "name-conflict",
                status={
                    "phase": "Pending",
                    "message": CONFLICT,
                    "conditions": [VALID, condition("Scheduled", "False", "NameConflict", CONFLICT, STAMP)],
                    "placement": None,
                    "podsReady": 0,
                    "observedGeneration": 2,
                },
                events=(Event("Warning", "NameConflict", CONFLICT),),
                record=record(conflict=CONFLICT),
                deletes=("gpt-0",),
                requeue_after=30.0,
                wake_others=True,
            ),
            id="refused-create-releases-the-attempt",
        ),
        pytest.param(
            seen(job(), record=record(conflict=CONFLICT), pods=(pod("gpt-0"), pod("gpt-1", deleting_since=EARLIER))),
            Decision("name-conflict", deletes=("gpt-0",), requeue_after=30.0),
            id="released-attempts-pods-go-first",
        ),
        pytest.param(
            seen(job(), record=record(conflict=CONFLICT), conflict_held=True),
            Decision("name-conflict", requeue_after=30.0),
            id="waits-while-the-name-is-someone-elses",
        ),
        pytest.param(seen(job(), record=record(conflict=CONFLICT)), None, id="admitted-again-once-it-is-gone"),
        pytest.param(seen(job(), record=record()), None, id="no-conflict"),
    ],
)
def test_a_name_someone_else_holds_releases_the_attempt_until_it_is_gone(observed, decision):
    assert conflicts.decide(observed, SETTINGS, NOW) == decision


# -- step 6, creation ---------------------------------------------------------------------------------------


def admitted(*, config_map: bool = True, **fields: Any) -> Observed:
    """The gpt-small example admitted on two local 4-GPU nodes: its record, its ConfigMap, no pod yet."""
    placement = [{"nodeRank": 0, "node": "local-0"}, {"nodeRank": 1, "node": "local-1"}]
    owner = {**job(phase="Pending", conditions=[VALID], placement=placement, observedGeneration=2), "spec": {}}
    nodes = planning.local_cluster_nodes(2, 4)
    plan = planning.plan_job(SPEC, planning.build_cluster(nodes))
    assert isinstance(plan, planning.Plan)
    placed = tuple(entry.node for entry in sorted(plan.nodes, key=lambda entry: entry.node_rank))
    admitted_record = records.AttemptRecord(attempt=0, spec={}, image="trainer:test", nodes=placed, gpus_per_node=4)
    attempt = children.build_attempt(owner, SPEC, plan, nodes, attempt=0, record=admitted_record)
    fields.setdefault("record", admitted_record)
    return seen(owner, pinned=SPEC, config_map=attempt.config_map if config_map else None, **fields)


def test_an_admitted_attempt_creates_its_children_then_records_them_placed():
    observed = admitted()
    decision = creation.decide(observed, SETTINGS, NOW)
    kinds = [child["kind"] for child in decision.creates]
    assert kinds == ["Service", "ConfigMap", "ServiceAccount", "Role", "RoleBinding", "Pod", "Pod"]
    assert [child["metadata"]["name"] for child in decision.creates if child["kind"] == "Pod"] == [
        f"{SPEC.name}-0",
        f"{SPEC.name}-1",
    ]
    assert decision.record == observed.record.with_placed()
    assert decision.status is not None
    assert set(decision.status) == {"conditions", "message", "observedGeneration"}
    assert decision.status["message"].startswith("2 pods created on 2 nodes; fabric ")
    scheduled = next(c for c in decision.status["conditions"] if c["type"] == "Scheduled")
    assert (scheduled["status"], scheduled["reason"], scheduled["message"]) == (
        "True",
        "Placed",
        decision.status["message"],
    )
    assert [event.reason for event in decision.events] == ["Placed"]
    assert decision.events[0].message.startswith("layout 2x2x2, fabric ")
    assert decision.events[0].message.endswith("0->local-0, 1->local-1")
    assert (decision.step, decision.deletes, decision.requeue_after) == ("created", (), None)


def test_a_pod_that_exists_already_is_not_created_again():
    decision = creation.decide(admitted(pods=(pod(f"{SPEC.name}-1", node="local-1"),)), SETTINGS, NOW)
    assert [child["metadata"]["name"] for child in decision.creates if child["kind"] == "Pod"] == [f"{SPEC.name}-0"]


@pytest.mark.parametrize(
    "observed",
    [
        pytest.param(admitted(config_map=False), id="configmap-deleted"),
        pytest.param(admitted(record=record(nodes=("local-0",))), id="plan-for-another-node-count"),
    ],
)
def test_an_attempt_whose_plan_is_lost_is_planned_again_and_creates_nothing(observed):
    decision = creation.decide(observed, SETTINGS, NOW)
    assert decision == Decision("replanning", status={"placement": None, "observedGeneration": 2})


# -- the spare step, replacement ----------------------------------------------------------------------------

SPARED_DOC = yaml.safe_load((Path(__file__).parents[2] / "examples" / "gpt-small-8gpu.yaml").read_text())
SPARED_DOC["spec"]["failurePolicy"] = {"backoffLimit": 3, "spareNodes": 1, "stragglers": {"action": "Replace"}}
SPARED = validate_document(SPARED_DOC).resolved
# Two 4-GPU node ranks on local-0 and local-1, local-2 held as their spare; local-3 free.
SPARE_NODES = planning.local_cluster_nodes(4, 4)
HELD = records.AttemptRecord(
    attempt=0,
    spec={},
    image="trainer:test",
    nodes=("local-0", "local-1"),
    gpus_per_node=4,
    spare_nodes=("local-2",),
    placed=True,
)
MOVED = HELD.with_spares_taken({1: "local-2"})  # node rank 1 moves from local-1 to the spare local-2
PLACEMENT = [{"nodeRank": 0, "node": "local-0", "ranks": "0-3"}, {"nodeRank": 1, "node": "local-1", "ranks": "4-7"}]
RUNNING = {"phase": "Running", "message": "all 2 pods running", "placement": PLACEMENT, "spareNodes": ["local-2"]}
MOVE = "moving node rank 1 from local-1 (no longer exists) to spare local-2; the pods on healthy nodes stay"
MADE = "recreated the pods of node ranks on their spares (1->local-2); the gang re-forms in place"
SLOW = (
    "moving node rank 1 from local-1 (is slower than its peers (1.8x, stage 1)) to spare local-2; the pods on "
    "healthy nodes stay"
)
NAME = SPARED.name


def _spare_config_map() -> dict[str, Any]:
    owner = {**job(), "metadata": {**job()["metadata"], "name": NAME}, "spec": {}}
    plan = planning.plan_job(SPARED, planning.build_cluster(SPARE_NODES[:3]))
    assert isinstance(plan, planning.Plan)
    return children.build_attempt(owner, SPARED, plan, SPARE_NODES[:3], attempt=0, record=HELD).config_map


SPARE_CONFIG_MAP = _spare_config_map()


def gang_pod(rank: int, node: str, **fields: Any) -> dict[str, Any]:
    return pod(labels.pod_name(NAME, rank), node=node, rank=rank, **fields)


def spared(record_: records.AttemptRecord = HELD, *, status: dict[str, Any] | None = None, **fields: Any) -> Observed:
    """The gpt-small example placed with a hot spare (`HELD`), its pods on their nodes, as the pass observed it."""
    fields.setdefault("pods", (gang_pod(0, "local-0"), gang_pod(1, "local-1")))
    fields.setdefault("config_map", SPARE_CONFIG_MAP)
    fields.setdefault("known", frozenset(node["metadata"]["name"] for node in SPARE_NODES))
    fields.setdefault("watched_nodes", {node["metadata"]["name"]: node for node in SPARE_NODES})
    owner = {**job(**(RUNNING if status is None else status)), "metadata": {**job()["metadata"], "name": NAME}}
    return seen(owner, record=record_, pinned=SPARED, **fields)


def rebuilt(rank: int, record_: records.AttemptRecord) -> dict[str, Any]:
    """Node rank `rank`'s pod as the attempt's ConfigMap and the record's nodes build it (`manifests.children`)."""
    owner = spared().job
    built = children.build_children(owner, SPARED, SPARE_CONFIG_MAP, list(record_.nodes), image=record_.image)
    return next(pod for pod in built.pods if pod["metadata"]["name"] == labels.pod_name(NAME, rank))


MOVED_PLACEMENT = [PLACEMENT[0], {**PLACEMENT[1], "node": "local-2"}]
REPLACED = Decision(
    "replaced-node",
    creates=(rebuilt(1, MOVED),),
    record=MOVED.with_replaced(),
    status={"message": MADE, "placement": MOVED_PLACEMENT, "observedGeneration": 2},
    events=(Event("Normal", "SpareReplaced", MADE),),
    requeue_after=0.0,
)


@pytest.mark.parametrize(
    ("observed", "decision"),
    [
        pytest.param(
            spared(lost_now={"local-1": "no longer exists"}),
            Decision(
                "replacing-node",
                record=MOVED,
                status={"message": MOVE, "spareNodes": None, "observedGeneration": 2},
                events=(Event("Warning", "SpareTaken", MOVE),),
                requeue_after=0.0,
            ),
            id="lost-node-rank-moves-to-the-spare-record-then-status",
        ),
        pytest.param(
            spared(lost_now={"local-1": "no longer exists"}, not_ready=frozenset({"local-2"})),
            None,
            id="no-usable-spare-left-supervision-restarts-the-gang",
        ),
        pytest.param(
            spared(HELD.with_spares_taken({}, ["local-2"]), lost_now={"local-1": "no longer exists"}),
            None,
            id="no-spare-held-nothing-here-applies",
        ),
        pytest.param(spared(), None, id="healthy-gang-writes-nothing"),
        pytest.param(
            spared(lost_now={"local-2": "is NotReady"}),
            Decision(
                "spare-lost",
                record=HELD.with_spares_taken({}, ["local-2"]),
                status={"spareNodes": None, "observedGeneration": 2},
                events=(
                    Event(
                        "Warning",
                        "SpareLost",
                        "spare local-2 is NotReady: it is no longer held; another is held once a node is free",
                    ),
                ),
            ),
            id="lost-spare-dropped-and-supervision-goes-on",
        ),
        pytest.param(
            spared(status={**RUNNING, "progress": {"stragglers": [{"node": "local-1", "factor": 1.8, "stage": 1}]}}),
            Decision(
                "replacing-node",
                record=dataclasses.replace(
                    HELD, excluded_nodes=("local-1",), suspect_nodes=("local-1",)
                ).with_spares_taken({1: "local-2"}),
                status={"excludedNodes": ["local-1"], "message": SLOW, "spareNodes": None, "observedGeneration": 2},
                events=(Event("Warning", "SpareTaken", SLOW),),
                requeue_after=0.0,
            ),
            id="slow-node-excluded-and-its-rank-moved-in-one-record",
        ),
        pytest.param(
            spared(MOVED),
            Decision("replacing-node", deletes=(labels.pod_name(NAME, 1),), requeue_after=0.5),
            id="move-under-way-old-pod-deleted-gracefully",
        ),
        pytest.param(
            spared(MOVED, known=frozenset({"local-0", "local-2", "local-3"})),
            Decision("replacing-node", force_deletes=(labels.pod_name(NAME, 1),), requeue_after=0.5),
            id="move-under-way-old-pod-on-a-deleted-node-forced",
        ),
        pytest.param(
            spared(MOVED, peers_lost={"local-1": "stopped answering its gang"}),
            Decision("replacing-node", force_deletes=(labels.pod_name(NAME, 1),), requeue_after=0.5),
            id="move-under-way-old-pod-its-gang-reports-lost-forced",
        ),
        pytest.param(
            spared(
                MOVED,
                pods=(gang_pod(0, "local-0"), gang_pod(1, "local-1", deleting_since=seconds_before_now(100))),
            ),
            Decision("replacing-node", requeue_after=20.5),
            id="move-under-way-terminating-old-pod-waited-for-until-overdue",
        ),
        pytest.param(
            spared(
                MOVED,
                pods=(gang_pod(0, "local-0"), gang_pod(1, "local-1", deleting_since=seconds_before_now(130))),
            ),
            Decision("replacing-node", force_deletes=(labels.pod_name(NAME, 1),), requeue_after=0.5),
            id="move-under-way-terminating-old-pod-forced-once-overdue",
        ),
        pytest.param(
            spared(MOVED, pods=(gang_pod(0, "local-0"),)),
            REPLACED,
            id="old-pod-gone-pod-made-on-the-spare-then-record-then-status",
        ),
        pytest.param(
            spared(MOVED, pods=(gang_pod(0, "local-0"), gang_pod(1, "local-2"))),
            dataclasses.replace(REPLACED, creates=()),
            id="pod-already-made-on-the-spare-not-made-again",
        ),
        pytest.param(
            spared(MOVED, pods=(gang_pod(0, "local-0"),), config_map=None),
            Decision("replacing-node", record=MOVED.with_replaced(), requeue_after=0.0),
            id="plan-gone-the-move-ends-and-supervision-restarts-the-gang",
        ),
    ],
)
def test_a_lost_node_rank_moves_to_a_spare_and_only_its_pod_is_made_again(observed, decision):
    assert replacement.decide(observed, SETTINGS, NOW) == decision


ADDED = "holding local-3 as hot spare; 1 of 1 held"


@pytest.mark.parametrize(
    ("observed", "free", "decision"),
    [
        pytest.param(
            spared(HELD.with_spares_taken({}, ["local-2"])),
            SPARE_NODES,
            Decision(
                "spares-added",
                record=HELD.with_spares_taken({}, ["local-2"]).with_spares_added(["local-2"]),
                status={"spareNodes": ["local-2"], "observedGeneration": 2},
                events=(Event("Normal", "SpareAdded", "holding local-2 as hot spare; 1 of 1 held"),),
            ),
            id="a-free-node-becomes-the-spare",
        ),
        pytest.param(
            spared(dataclasses.replace(MOVED.with_replaced(), excluded_nodes=("local-1",))),
            [node for node in SPARE_NODES if node["metadata"]["name"] != "local-1"],
            Decision(
                "spares-added",
                record=dataclasses.replace(MOVED.with_replaced(), excluded_nodes=("local-1",)).with_spares_added(
                    ["local-3"]
                ),
                status={"spareNodes": ["local-3"], "observedGeneration": 2},
                events=(Event("Normal", "SpareAdded", ADDED),),
            ),
            id="an-excluded-node-is-no-spare",
        ),
        pytest.param(
            spared(MOVED.with_replaced()),
            SPARE_NODES[:1] + SPARE_NODES[2:3],
            Decision("spares-short", requeue_after=60.0),
            id="no-free-node-the-job-keeps-its-place-in-the-queue",
        ),
        pytest.param(
            spared(MOVED.with_replaced(), config_map=None),
            SPARE_NODES,
            Decision("spares-short", requeue_after=60.0),
            id="without-its-plan-nothing-is-held",
        ),
    ],
)
def test_a_job_short_of_spares_holds_more_where_the_cluster_allows(observed, free, decision):
    assert replacement.spares_short(observed, SPARED)
    assert replacement.top_up(observed, SPARED, planning.build_cluster(free)) == decision


@pytest.mark.parametrize(
    ("observed", "fits", "decision"),
    [
        pytest.param(spared(), False, Decision("shrunk", requeue_after=60.0), id="full-size-does-not-fit-yet"),
        pytest.param(
            spared(checkpoint_step=400),
            True,
            Decision(
                "grow-back-due",
                record=HELD.with_grow_after(400),
                events=(
                    Event(
                        "Normal",
                        "GrowBack",
                        "2x2x2 fits again: the gang grows back from 2x2x2 after its next checkpoint (newer than step 400)",
                    ),
                ),
            ),
            id="fits-grows-back-after-the-next-checkpoint",
        ),
        pytest.param(
            spared(),
            True,
            Decision(
                "grow-back-due",
                record=HELD.with_grow_after(-1),
                events=(
                    Event(
                        "Normal",
                        "GrowBack",
                        "2x2x2 fits again: the gang grows back from 2x2x2 after its next checkpoint "
                        "(newer than the start of this attempt)",
                    ),
                ),
            ),
            id="fits-before-any-checkpoint",
        ),
    ],
)
def test_a_shrunk_job_grows_back_once_its_full_size_fits(observed, fits, decision):
    assert replacement.grow_when_fits(observed, SPARED, SPARED, fits) == decision


# -- the Decision itself ------------------------------------------------------------------------------------


def test_a_decision_followed_by_another_writes_both_and_asks_what_the_later_asks():
    warned, noted = Event("Warning", "A", "x"), Event("Normal", "B", "y")
    first = Decision("a", status={"message": "x", "podsReady": 0}, events=(warned,), deletes=("p0",))
    later = Decision(
        "b", status={"message": "y"}, events=(noted,), record=record(), deletes=("p0", "p1"), requeue_after=2.0
    )
    assert first.then(later) == Decision(
        "b",
        status={"message": "y", "podsReady": 0},
        events=(warned, noted),
        record=record(),
        deletes=("p0", "p1"),
        requeue_after=2.0,
    )
    assert Decision("quiet").writes_nothing and not later.writes_nothing
    # The parts each must write whole before it stay, in order: a running pass's part before an in-place restart
    # it counts, then the final word (supervision.decide).
    assert Decision("c", first=(first,)).then(Decision("d", first=(later,))).first == (first, later)


# -- the live attempt's report (`handlers.reported`): what a pass killed between the record and the status missed --


def test_a_status_that_does_not_report_the_record_is_written_again_and_only_then() -> None:
    unreported = spared(status={"phase": "Running", "message": "all 2 pods running"})
    decision = reported.decide(unreported, SPARED)
    assert decision is not None and decision.step == "reported"
    fields = reported.fields(NAME, HELD, SPARE_CONFIG_MAP, SPARED)
    assert fields is not None and fields["spareNodes"] == ["local-2"]
    assert [entry["node"] for entry in fields["placement"]] == ["local-0", "local-1"]
    assert decision == Decision("reported", status={**fields, "observedGeneration": 2})
    # Once written, the next pass writes nothing; nor while a spare's move is under way.
    assert reported.decide(unreported.with_status(decision.status), SPARED) is None
    moving = HELD.with_spares_taken({1: "local-2"})
    assert moving.replacing
    assert reported.decide(spared(moving, status={"phase": "Running"}), SPARED) is None
