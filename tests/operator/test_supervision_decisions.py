"""Whole decisions of the supervision step (`handlers.steps.supervision`), on plain data: what a placed gang's
pass writes (the record, the status patch and its Events, the pods deleted, a slow node's label) and what it asks
of the scheduler, from one `Observed` built here, as `test_step_decisions.py` does for the other steps. No API
server: `k8s.apply` writes these values (its order is checked at the end, on a recording writer), and the
operator tests show the same decisions through a process (`test_restart_safety.py`, `test_stragglers.py`,
`test_lost_peers.py`, `test_start_timeout.py`, `test_in_place_counting.py`, `test_kill_loop.py`).
"""

from __future__ import annotations

import copy
import dataclasses
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from paralleljob.api import validate_document
from paralleljob.handlers import gang
from paralleljob.handlers.observed import Observed
from paralleljob.handlers.settings import Settings
from paralleljob.handlers.steps import supervision
from paralleljob.k8s import apply
from paralleljob.manifests import labels, records
from paralleljob.manifests import pods as pod_manifests
from paralleljob.manifests.decisions import Decision, Event, NodeLabel
from tests.operator.decision_data import EARLIER, NOW, READY, STAMP, condition, job, pod, seconds_before_now

SETTINGS = Settings(
    image="trainer:test",
    resync_seconds=60.0,
    restart_hold_seconds=120.0,
    not_ready_grace_seconds=30.0,
    start_timeout_seconds=300.0,
)
HELD_UNTIL = "2026-01-01T12:02:00Z"  # NOW + restart_hold_seconds
DOC = yaml.safe_load((Path(__file__).parents[2] / "examples" / "gpt-small-8gpu.yaml").read_text())


def spec_with(**failure_policy: Any) -> Any:
    """The gpt-small example (2 node ranks of 4 GPUs, backoffLimit 3) with these failurePolicy fields."""
    doc = copy.deepcopy(DOC)
    doc["spec"]["failurePolicy"] = {"backoffLimit": 3, **failure_policy}
    return validate_document(doc).resolved


SPEC = spec_with()
FOLDER = pod_manifests.job_folder(SPEC)
# The live attempt 0 on n0 and n1, seen running since EARLIER (the record says so: no Started again).
LIVE = records.AttemptRecord(
    attempt=0, spec={}, image="trainer:test", nodes=("n0", "n1"), gpus_per_node=4, placed=True, started_at=EARLIER
)
QUIET = {
    "phase": "Running",
    "message": "all 2 pods running",
    "conditions": [READY],
    "podsReady": 2,
    "startTime": EARLIER,
    "observedGeneration": 2,
}


def rank_pod(rank: int, node: str, **fields: Any) -> dict[str, Any]:
    return pod(labels.pod_name("gpt", rank), node=node, rank=rank, **fields)


def failed(rank: int, node: str, message: str | None = None) -> dict[str, Any]:
    found = rank_pod(rank, node, phase="Failed")
    if message is not None:
        found["status"]["containerStatuses"] = [{"state": {"terminated": {"message": message}}}]
    return found


def finished_rank_0(seconds_ago: float) -> dict[str, Any]:
    found = rank_pod(0, "n0", phase="Succeeded")
    terminated = {"finishedAt": seconds_before_now(seconds_ago)}
    found["status"]["containerStatuses"] = [{"state": {"terminated": terminated}}]
    return found


def unschedulable(rank: int, node: str, since: str) -> dict[str, Any]:
    found = rank_pod(rank, node, phase="Pending")
    found["metadata"]["creationTimestamp"] = since
    scheduled = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/2 nodes fit"}
    found["status"]["conditions"] = [scheduled]
    return found


def report(**data: str) -> dict[str, Any]:
    """Rank 0's progress ConfigMap (the job's own), with these keys."""
    return {"metadata": {"name": "gpt-progress"}, "data": data}


def placed(
    record_: records.AttemptRecord = LIVE,
    *pods: dict[str, Any],
    status: dict[str, Any] | None = None,
    spec: Any = SPEC,
    **fields: Any,
) -> Observed:
    """The placed gang as the pass observed it: its record, its pods (both running unless given), its status."""
    gang_pods = pods or (rank_pod(0, "n0"), rank_pod(1, "n1"))
    return Observed(
        job=job(**(QUIET if status is None else status)),
        record=record_,
        spec=spec,
        pinned=spec,
        pods=gang_pods,
        **fields,
    )


def restarted(
    reason: str,
    *,
    excluded: tuple[str, ...],
    held: tuple[str, ...],
    conditions: list[dict[str, Any]],
    record_: records.AttemptRecord = LIVE,
    restarts: int = 1,
    deletes: tuple[str, ...] = ("gpt-0", "gpt-1"),
    first: tuple[Decision, ...] = (),
    suspect: tuple[str, ...] = (),
) -> Decision:
    """The gang restart a broken gang gets: the record, then the status, the Restarting Event, every pod deleted;
    after the `first` parts of the pass's decision, each written whole before it. `suspect`: the excluded nodes
    a verdict named, which the record keeps apart."""
    message = f"gang restart {restarts}/3: {reason}; resuming from the last checkpoint"
    return Decision(
        "restarting",
        record=record_.with_restart(
            reason, list(excluded), into=restarts, held=list(held), until=HELD_UNTIL, suspect=list(suspect)
        ),
        status={
            "phase": "Restarting",
            "message": message,
            "conditions": conditions,
            "restarts": restarts,
            "network": None,
            "placement": None,
            "spareNodes": None,
            "podsReady": 0,
            "excludedNodes": list(excluded) or None,
            "heldNodes": list(held) or None,
            "heldUntil": HELD_UNTIL if held else None,
            "observedGeneration": 2,
        },
        events=(Event("Warning", "Restarting", message),),
        deletes=deletes,
        first=first,
        wake_others=True,
    )


def cause(reason: str, said: str) -> Decision:
    """A broken gang's cause, its Warning Event written before the restart or the end it brings."""
    return Decision("broken", events=(Event("Warning", reason, said),))


def restart_conditions(cause: str, reason: str, scheduled: str, restarts: int = 1) -> list[dict[str, Any]]:
    message = f"gang restart {restarts}/3: {reason}; resuming from the last checkpoint"
    return [
        condition("Scheduled", "False", scheduled, message, STAMP),
        condition("Ready", "False", cause, reason, STAMP),
    ]


def ended(
    phase: str,
    message: str,
    conditions: list[dict[str, Any]],
    event: Event,
    *,
    deletes: tuple[str, ...],
    record_: records.AttemptRecord = LIVE,
) -> Decision:
    """A job's end: its status and Event, then the record (`record_last`), the pods holding GPUs deleted."""
    return Decision(
        phase.lower(),
        status={
            "phase": phase,
            "message": message,
            "conditions": conditions,
            "podsReady": 0,
            "completionTime": STAMP,
            "observedGeneration": 2,
        },
        events=(event,),
        record=record_.with_outcome(phase),
        record_last=True,
        deletes=deletes,
        wake_others=True,
    )


FAILED_POD = "pod gpt-1 failed (Failed)"
DONE = "training finished after 0 restarts"
DONE_CONDITIONS = [
    condition("Ready", "False", "Finished", DONE, STAMP),
    condition("Succeeded", "True", "TrainingFinished", DONE, STAMP),
]
SAVED = f"training finished after 0 restarts; last checkpoint step 2000 in {FOLDER}/global_step2000"
EXHAUSTED = f"{FAILED_POD}; backoffLimit 3 reached after 3 restarts"
NO_RDMA = "NetworkReady NoRdmaDevice: no RDMA device on node n1"  # the trainer's termination message
NO_RDMA_SAID = "pod gpt-1 on node n1: NetworkReady=False NoRdmaDevice: no RDMA device on node n1"
NO_RDMA_END = f"{NO_RDMA_SAID}; not restarted: fix spec.network or the nodes, then create the job again"
NOT_READY_PAST = "node n1 of pod gpt-1 has been NotReady for 100s (grace 30s)"
PEER_LOST = "stopped answering its gang (40s) and its Lease was last renewed 50s ago (threshold 40s)"
STALLED = "pod gpt-1 did not start within 300s (Unschedulable: 0/2 nodes fit)"
STRAGGLER = {"node": "n1", "nodeRank": 1, "stage": 1, "factor": 1.8, "steps": [100, 200]}
STRAGGLER_SAID = "n1 (node rank 1, stage 1) computed 1.8x its peers' median over steps 100-200"
SLOW_STATUS = {**QUIET, "progress": {"stragglers": [STRAGGLER]}}
SLOW_REPLACED = "node n1 is slower than its peers (1.8x, stage 1)"
STARTED = "2x2x2 on 2 pods, attempt 0"
# The running pass's part when a straggler is named: the Straggler condition and one SlowNode Event.
SLOW_NAMED = Decision(
    "running",
    status={
        **{key: value for key, value in QUIET.items() if key != "observedGeneration"},
        "conditions": [READY, condition("Straggler", "True", "SlowNode", STRAGGLER_SAID, STAMP)],
        "observedGeneration": 2,
    },
    events=(Event("Warning", "SlowNode", STRAGGLER_SAID),),
)
REPLACING = f"gang restart 1/3: {SLOW_REPLACED}; resuming from the last checkpoint"


@pytest.mark.parametrize(
    ("observed", "decision"),
    [
        pytest.param(placed(), Decision("running", requeue_after=60.0), id="quiet-running-gang-writes-nothing"),
        pytest.param(
            placed(records.AttemptRecord(**{**LIVE.__dict__, "started_at": None}), status={"phase": "Placed"}),
            Decision(
                "running",
                record=LIVE.with_started(STAMP, None),
                status={
                    "phase": "Running",
                    "message": "all 2 pods running",
                    "conditions": [condition("Ready", "True", "AllPodsRunning", "all 2 pods running", STAMP)],
                    "podsReady": 2,
                    "startTime": STAMP,
                    "observedGeneration": 2,
                },
                events=(Event("Normal", "Started", STARTED),),
                requeue_after=60.0,
            ),
            id="first-pass-over-a-running-gang-records-since-when-and-says-started-once",
        ),
        pytest.param(
            placed(LIVE, rank_pod(0, "n0"), failed(1, "n1")),
            restarted(
                FAILED_POD,
                excluded=("n1",),
                held=("n0",),
                conditions=restart_conditions("GangRestart", FAILED_POD, "GangRestart"),
            ),
            id="a-failed-pod-restarts-the-gang-record-then-status-every-pod-deleted",
        ),
        pytest.param(
            placed(LIVE, rank_pod(0, "n0"), rank_pod(1, "n1", deleting_since=EARLIER)),
            restarted(
                "pod gpt-1 is being deleted",
                excluded=("n1",),
                held=("n0",),
                conditions=restart_conditions("GangRestart", "pod gpt-1 is being deleted", "GangRestart"),
                deletes=("gpt-0",),
            ),
            id="a-pod-being-deleted-restarts-the-gang-and-is-left-to-its-kubelet",
        ),
        pytest.param(
            placed(LIVE.__class__(**{**LIVE.__dict__, "attempt": 3}), rank_pod(0, "n0"), failed(1, "n1")),
            ended(
                "Failed",
                EXHAUSTED,
                [
                    condition("Ready", "False", "GangFailed", FAILED_POD, STAMP),
                    condition("Failed", "True", "BackoffLimitExceeded", EXHAUSTED, STAMP),
                ],
                Event("Warning", "Failed", EXHAUSTED),
                deletes=("gpt-0",),
                record_=LIVE.__class__(**{**LIVE.__dict__, "attempt": 3}),
            ),
            id="backoff-limit-reached-fails-the-job-status-and-event-before-the-record",
        ),
        pytest.param(
            placed(LIVE, rank_pod(0, "n0"), failed(1, "n1", NO_RDMA)),
            Decision(
                "failed",
                status={
                    "phase": "Failed",
                    "message": NO_RDMA_END,
                    "conditions": [
                        condition("NetworkReady", "False", "NoRdmaDevice", "no RDMA device on node n1", STAMP),
                        condition("Ready", "False", gang.NETWORK, NO_RDMA_SAID, STAMP),
                        condition("Failed", "True", gang.NETWORK, NO_RDMA_END, STAMP),
                    ],
                    "podsReady": 0,
                    "completionTime": STAMP,
                    "observedGeneration": 2,
                },
                events=(Event("Warning", "Failed", NO_RDMA_END),),
                record=LIVE.with_outcome("Failed"),
                record_last=True,
                deletes=("gpt-0",),
                first=(cause(gang.NETWORK, NO_RDMA_SAID),),
                wake_others=True,
            ),
            id="a-network-not-as-planned-fails-the-job-at-once-without-a-restart",
        ),
        pytest.param(
            placed(LIVE, finished_rank_0(10), rank_pod(1, "n1")),
            Decision("finishing", requeue_after=20.0),
            id="rank-0-succeeded-the-others-get-the-rest-of-the-grace-and-a-requeue-at-its-end",
        ),
        pytest.param(
            placed(LIVE, finished_rank_0(40), rank_pod(1, "n1")),
            ended("Succeeded", DONE, DONE_CONDITIONS, Event("Normal", "Completed", DONE), deletes=("gpt-1",)),
            id="grace-over-succeeded-and-the-rank-still-running-deleted",
        ),
        pytest.param(
            placed(LIVE, finished_rank_0(10), rank_pod(1, "n1", phase="Succeeded")),
            ended("Succeeded", DONE, DONE_CONDITIONS, Event("Normal", "Completed", DONE), deletes=()),
            id="the-others-ended-succeeded-at-once-keeping-their-pods-for-the-logs",
        ),
        pytest.param(
            placed(
                LIVE,
                finished_rank_0(10),
                rank_pod(1, "n1", phase="Succeeded"),
                progress=report(lastCheckpointStep="2000"),
            ),
            ended(
                "Succeeded",
                SAVED,
                [
                    condition("Ready", "False", "Finished", SAVED, STAMP),
                    condition("Succeeded", "True", "TrainingFinished", SAVED, STAMP),
                ],
                Event("Normal", "Completed", SAVED),
                deletes=(),
            ),
            id="succeeded-says-where-the-last-checkpoint-lies",
        ),
        pytest.param(
            placed(
                LIVE,
                gang_nodes_lost={"n1": "is NotReady"},
                not_ready=frozenset({"n1"}),
                not_ready_since={"n1": seconds_before_now(10)},
            ),
            Decision("running", requeue_after=20.5),
            id="a-node-notready-within-the-grace-costs-nothing-but-a-requeue-when-it-falls-due",
        ),
        pytest.param(
            placed(
                LIVE,
                gang_nodes_lost={"n1": "is NotReady"},
                not_ready=frozenset({"n1"}),
                not_ready_since={"n1": seconds_before_now(100)},
            ),
            restarted(
                NOT_READY_PAST,
                excluded=("n1",),
                held=("n0",),
                conditions=restart_conditions("GangRestart", NOT_READY_PAST, "GangRestart"),
            ),
            id="a-node-notready-past-the-grace-restarts-the-gang-without-it",
        ),
        pytest.param(
            placed(LIVE, gang_nodes_lost={"n1": "no longer exists"}),
            restarted(
                "node n1 of pod gpt-1 no longer exists",
                excluded=("n1",),
                held=("n0",),
                conditions=restart_conditions("GangRestart", "node n1 of pod gpt-1 no longer exists", "GangRestart"),
            ),
            id="a-deleted-node-restarts-the-gang-at-once",
        ),
        pytest.param(
            placed(LIVE, peers_lost={"n1": PEER_LOST}, peers_recheck_in=None),
            restarted(
                f"node n1 of pod gpt-1 {PEER_LOST}",
                excluded=("n1",),
                held=("n0",),
                conditions=restart_conditions("GangRestart", f"node n1 of pod gpt-1 {PEER_LOST}", "GangRestart"),
            ),
            id="a-lost-peer-with-its-lease-unrenewed-restarts-the-gang-without-the-grace",
        ),
        pytest.param(
            placed(LIVE, peers_recheck_in=12.5),
            Decision("running", requeue_after=12.5),
            id="a-reported-peer-whose-lease-is-not-yet-stale-is-looked-at-again-when-it-falls-due",
        ),
        pytest.param(
            placed(LIVE, rank_pod(0, "n0"), unschedulable(1, "n1", seconds_before_now(100)), status={**QUIET}),
            Decision(
                "starting",
                status={"podsReady": 1, "message": "pod gpt-1: Unschedulable: 0/2 nodes fit", "observedGeneration": 2},
                requeue_after=60.0,
            ),
            id="a-stalled-pod-within-its-timeout-says-what-it-waits-on",
        ),
        pytest.param(
            placed(LIVE, rank_pod(0, "n0"), unschedulable(1, "n1", seconds_before_now(400))),
            restarted(
                STALLED,
                excluded=("n1",),
                held=("n0",),
                conditions=restart_conditions(gang.START_TIMEOUT, STALLED, "GangRestart"),
                first=(cause(gang.START_TIMEOUT, STALLED),),
                suspect=("n1",),  # the node its stalled pod waited on
            ),
            id="a-stalled-pod-past-its-timeout-restarts-the-gang-blaming-its-node",
        ),
        pytest.param(
            placed(LIVE, status=SLOW_STATUS),
            dataclasses.replace(SLOW_NAMED, requeue_after=60.0),
            id="a-straggler-named-sets-the-condition-and-one-slownode-event",
        ),
        pytest.param(
            placed(
                LIVE,
                status={
                    **SLOW_STATUS,
                    "conditions": [READY, condition("Straggler", "True", "SlowNode", STRAGGLER_SAID)],
                },
            ),
            Decision("running", requeue_after=60.0),
            id="the-same-straggler-named-again-writes-nothing",
        ),
        pytest.param(
            placed(
                LIVE,
                status=SLOW_STATUS,
                spec=spec_with(stragglers={"action": "Replace"}),
            ),
            restarted(
                SLOW_REPLACED,
                excluded=("n1",),
                held=("n0",),
                conditions=[
                    condition("Scheduled", "False", "GangRestart", REPLACING, STAMP),
                    condition("Ready", "False", "SlowNode", SLOW_REPLACED, STAMP),
                    condition("Straggler", "True", "SlowNode", STRAGGLER_SAID, STAMP),
                ],
                first=(SLOW_NAMED, cause("SlowNode", SLOW_REPLACED)),
                suspect=("n1",),  # the straggler
            ),
            id="a-straggler-to-replace-without-a-spare-restarts-the-gang-without-its-node",
        ),
        pytest.param(
            placed(
                records.AttemptRecord(**{**LIVE.__dict__, "grow_after": 100}),
                progress=report(lastCheckpointStep="200"),
            ),
            restarted(
                "growing back to full size after checkpoint step 200",
                excluded=(),
                held=("n0", "n1"),
                conditions=restart_conditions(
                    supervision.GROW_BACK, "growing back to full size after checkpoint step 200", "GangRestart"
                ),
                record_=records.AttemptRecord(**{**LIVE.__dict__, "grow_after": 100}).with_grow_restart(),
                first=(cause(supervision.GROW_BACK, "growing back to full size after checkpoint step 200"),),
            ),
            id="a-shrunk-gang-grows-back-after-a-newer-checkpoint",
        ),
    ],
)
def test_a_placed_gang_is_judged_and_its_whole_decision_written(observed, decision):
    assert supervision.decide(observed, SETTINGS, NOW) == decision


IN_PLACE = spec_with(inPlaceRestarts=1)
NO_IN_PLACE = spec_with(inPlaceRestarts=0)  # the pods never restart in place (3 by default)
IN_PLACE_SAID = (
    "in-place restart 1/3: a rank failed and every pod restarted its ranks from the last checkpoint; no pod was "
    "recreated (1/1 in place for these pods)"
)
REPORTED = report(step="150", updated="2026-01-01T11:30:00Z", inPlaceRestarts="1")
COUNTED = Decision(
    "running",
    record=LIVE.with_in_place_restarts(1),
    status={"restarts": 1, "inPlaceRestarts": 1, "observedGeneration": 2},
    events=(Event("Warning", "RestartedInPlace", IN_PLACE_SAID),),
)


@pytest.mark.parametrize(
    ("observed", "decision"),
    [
        pytest.param(
            placed(LIVE, spec=IN_PLACE, progress=REPORTED),
            dataclasses.replace(COUNTED, requeue_after=60.0),
            id="running-an-in-place-restart-rank-0-reports-is-counted-once-with-its-event",
        ),
        pytest.param(
            placed(LIVE.with_in_place_restarts(1), spec=IN_PLACE, progress=REPORTED, status={**QUIET, "restarts": 1}),
            Decision("running", requeue_after=60.0),
            id="running-the-same-report-again-counts-nothing",
        ),
        pytest.param(
            placed(LIVE, spec=IN_PLACE, progress=REPORTED, status=SLOW_STATUS),
            dataclasses.replace(COUNTED, requeue_after=60.0, first=(SLOW_NAMED,)),
            id="running-a-straggler-named-in-the-pass-that-counts-a-restart-keeps-its-condition-and-event",
        ),
        pytest.param(
            placed(LIVE, rank_pod(0, "n0"), failed(1, "n1"), spec=IN_PLACE, progress=REPORTED),
            restarted(
                FAILED_POD,
                excluded=("n1",),
                held=("n0",),
                conditions=restart_conditions("GangRestart", FAILED_POD, "GangRestart", restarts=2),
                record_=LIVE.with_in_place_restarts(1),
                restarts=2,
                first=(COUNTED,),
            ),
            id="broken-before-the-report-was-seen-counts-it-first-then-restarts-after-it",
        ),
    ],
)
def test_in_place_restarts_rank_0_reports_are_counted_before_anything_else(observed, decision):
    assert supervision.decide(observed, SETTINGS, NOW) == decision


def test_a_create_refused_for_good_restarts_the_gang_as_create_failed():
    refused = "pods gpt-1 is forbidden: exceeded quota"
    state = gang.GangState("broken", 0, refused, cause=gang.CREATE_FAILED)
    creating = records.AttemptRecord(**{**LIVE.__dict__, "started_at": None, "placed": False})
    decision = supervision.broken(placed(creating, status={"phase": "Admitted"}), state, SETTINGS, NOW)
    assert decision == restarted(
        refused,
        excluded=(),
        held=("n0", "n1"),
        conditions=restart_conditions(gang.CREATE_FAILED, refused, gang.CREATE_FAILED),
        record_=creating,
        first=(cause(gang.CREATE_FAILED, refused),),
    )


def test_a_slow_node_is_labelled_for_the_administrators_once():
    node_labels = {"n0": {"metadata": {"labels": {}}}, "n1": {"metadata": {"labels": {}}}}
    labelled = {**node_labels, "n1": {"metadata": {"labels": {"example.com/slow": "true"}}}}
    told = Settings(**{**SETTINGS.__dict__, "slow_node_label": "example.com/slow"})
    first = supervision.decide(placed(LIVE, status=SLOW_STATUS, watched_nodes=node_labels), told, NOW)
    assert first.node_labels == (NodeLabel("n1", "example.com/slow", "true"),)
    assert not supervision.decide(placed(LIVE, status=SLOW_STATUS, watched_nodes=labelled), told, NOW).node_labels
    assert not supervision.decide(
        placed(LIVE, status=SLOW_STATUS, watched_nodes=node_labels), SETTINGS, NOW
    ).node_labels


VERIFIED = {"verified": "True", "reason": "AsPlanned", "message": "NCCL chose what the job planned"}
VERIFIED_LIVE = records.AttemptRecord(**{**LIVE.__dict__, "network_report": VERIFIED})


@pytest.mark.parametrize(
    ("observed", "reads"),
    [
        pytest.param(placed(VERIFIED_LIVE, spec=NO_IN_PLACE), False, id="quiet"),
        pytest.param(placed(spec=NO_IN_PLACE), True, id="running-network-verdict-not-yet-in"),
        pytest.param(
            placed(records.AttemptRecord(**{**LIVE.__dict__, "network_report": VERIFIED}), spec=IN_PLACE),
            True,
            id="running-with-in-place-restarts",
        ),
        pytest.param(
            placed(
                records.AttemptRecord(**{**LIVE.__dict__, "network_report": VERIFIED}),
                spec=spec_with(progressTimeoutSeconds=600, inPlaceRestarts=0),
            ),
            True,
            id="running-under-a-progress-timeout",
        ),
        pytest.param(placed(LIVE, finished_rank_0(10), rank_pod(1, "n1", phase="Succeeded")), True, id="succeeded"),
        pytest.param(placed(LIVE, finished_rank_0(10), rank_pod(1, "n1")), False, id="finishing"),
        pytest.param(
            placed(LIVE, rank_pod(0, "n0"), failed(1, "n1"), spec=NO_IN_PLACE),
            False,
            id="broken-without-in-place-budget",
        ),
        pytest.param(
            placed(LIVE, rank_pod(0, "n0"), failed(1, "n1"), spec=IN_PLACE), True, id="broken-with-in-place-budget"
        ),
        pytest.param(
            placed(LIVE, rank_pod(0, "n0"), failed(1, "n1", NO_RDMA), spec=IN_PLACE), False, id="network-failure"
        ),
        pytest.param(placed(LIVE, rank_pod(0, "n0"), rank_pod(1, "n1", phase="Pending")), False, id="starting"),
    ],
)
def test_rank_0s_report_is_read_only_when_the_decision_uses_it(observed, reads):
    assert supervision.reads_report(observed, supervision.judge(observed, SETTINGS, NOW)) is reads


def test_the_pass_counts_a_gang_restart_for_each_restart_event():
    failed_gang = placed(LIVE, rank_pod(0, "n0"), failed(1, "n1"), spec=IN_PLACE, progress=REPORTED)
    assert supervision.restarts_in(supervision.decide(failed_gang, SETTINGS, NOW)) == 2  # in place, then the gang
    assert supervision.restarts_in(supervision.decide(placed(), SETTINGS, NOW)) == 0


# -- k8s.apply, on a recording writer -----------------------------------------------------------------------


NO_SESSION: Any = None  # the recording writer never uses one


def recording_writer(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Replace the writes `k8s.apply` makes with a log of them, in order."""
    calls: list[str] = []
    fake = types.SimpleNamespace(
        create=lambda session, child: calls.append(f"create {child['metadata']['name']}"),
        create_all=lambda session, pods: calls.extend(f"create {pod['metadata']['name']}" for pod in pods),
        patch_job_status=lambda session, namespace, name, patch: calls.append(f"status {patch.get('phase')}"),
        label_node=lambda session, node, key, value: calls.append(f"label {node} {key}={value}"),
        delete_pod=lambda session, namespace, name, force=False: calls.append(
            f"{'force-delete' if force else 'delete'} {name}"
        ),
    )
    monkeypatch.setattr(apply, "writes", fake)
    monkeypatch.setattr(
        apply.events, "post", lambda session, job, kind, reason, message: calls.append(f"event {reason}")
    )
    monkeypatch.setattr(apply, "write_record", lambda session, namespace, name, record: calls.append("record"))
    return calls


def test_a_gang_restart_is_written_record_first_and_a_jobs_end_status_first(monkeypatch):
    calls = recording_writer(monkeypatch)
    restart = supervision.decide(placed(LIVE, rank_pod(0, "n0"), failed(1, "n1")), SETTINGS, NOW)
    apply.apply(NO_SESSION, job(**QUIET), restart)
    assert calls == ["record", "status Restarting", "event Restarting", "delete gpt-0", "delete gpt-1"]
    calls.clear()
    done = supervision.decide(placed(LIVE, finished_rank_0(40), rank_pod(1, "n1")), SETTINGS, NOW)
    apply.apply(NO_SESSION, job(**QUIET), done)
    assert calls == ["status Succeeded", "event Completed", "record", "delete gpt-1"]


def test_a_slow_nodes_label_is_written_after_its_event(monkeypatch):
    calls = recording_writer(monkeypatch)
    told = Settings(**{**SETTINGS.__dict__, "slow_node_label": "example.com/slow"})
    watched = {"n1": {"metadata": {"labels": {}}}}
    apply.apply(
        NO_SESSION, job(**QUIET), supervision.decide(placed(LIVE, status=SLOW_STATUS, watched_nodes=watched), told, NOW)
    )
    assert calls == ["status Running", "event SlowNode", "label n1 example.com/slow=true"]


def test_a_later_decisions_record_keeps_its_place_when_two_are_written_as_one():
    label = NodeLabel("n1", "example.com/slow", "true")
    running = Decision("running", record=LIVE, node_labels=(label,))
    end = Decision("failed", record=LIVE.with_outcome("Failed"), record_last=True)
    assert running.then(end) == Decision(
        "failed", record=LIVE.with_outcome("Failed"), record_last=True, node_labels=(label,)
    )
    assert end.then(Decision("after")).record_last
    assert not Decision("labels", node_labels=(label,)).writes_nothing


def test_an_in_place_restart_counted_is_written_whole_before_the_gang_restart_that_follows(monkeypatch):
    """A reader who sees the gang Restarting has the RestartedInPlace Event already (test_in_place_counting.py),
    and a pass killed after the count's record leaves its status and Event written, as two writes did."""
    calls = recording_writer(monkeypatch)
    broken = placed(LIVE, rank_pod(0, "n0"), failed(1, "n1"), spec=IN_PLACE, progress=REPORTED)
    apply.apply(NO_SESSION, job(**QUIET), supervision.decide(broken, SETTINGS, NOW))
    assert calls == [
        "record",
        "status None",
        "event RestartedInPlace",
        "record",
        "status Restarting",
        "event Restarting",
        "delete gpt-0",
        "delete gpt-1",
    ]


def test_a_decision_before_another_keeps_each_part_whole_in_order_and_drops_empty_ones():
    counted, restart = Decision("a", events=(Event("Warning", "A", "x"),)), Decision("b", deletes=("p0",))
    ending = Decision("c", record=LIVE, record_last=True, requeue_after=1.0)
    assert Decision("quiet").before(counted).before(restart) == Decision("b", deletes=("p0",), first=(counted,))
    assert counted.before(restart.before(ending)) == Decision(
        "c", record=LIVE, record_last=True, requeue_after=1.0, first=(counted, restart)
    )
    assert not Decision("quiet", first=(counted,)).writes_nothing
