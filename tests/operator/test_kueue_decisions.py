"""Whole decisions of the Kueue step (`steps.kueue`), on plain data: a queued job's gate before admission, the quota
given back after an admission that could not place it, a placed gang evicted by Kueue, and the Workload finished
at the job's end. No API server and no Kueue: `handlers.queueing` reads what these decide from and `k8s.apply`
writes them, which the real Kueue's tests show (`tests/upstream/test_kueue.py`, `test_kueue_tas.py`,
`test_multikueue.py`).
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from paralleljob.api import ResolvedJob, validate_document
from paralleljob.handlers.observed import Observed, QueueSeen
from paralleljob.handlers.settings import Settings
from paralleljob.handlers.steps import kueue
from paralleljob.manifests import kueue_topology, records
from paralleljob.manifests import workload as wl
from paralleljob.manifests.decisions import Decision, Event, WorkloadWrite
from paralleljob_contract import environment
from paralleljob_contract import progress as channel
from tests.operator.decision_data import EARLIER, NOW, STAMP, UID, condition, job, pod, seconds_before_now

SETTINGS = Settings(image="trainer:test", kueue=True, kueue_checkpoint_grace_seconds=60.0)
DOC = yaml.safe_load((Path(__file__).parents[2] / "examples" / "gpt-small-8gpu.yaml").read_text())
QUEUE = "team"
VALID_NOW = condition("Valid", "True", "Validated", "the spec is valid", at=STAMP)


def resolved(**changes: Any) -> tuple[dict[str, Any], ResolvedJob]:
    """The gpt-small example (PP2 x TP2 x DP2 on 2 nodes of 4 GPUs) as the job `gpt` queued in LocalQueue `team`;
    a change to None removes the field."""
    doc = copy.deepcopy(DOC)
    doc["metadata"] = {"name": "gpt", "namespace": "research", "labels": {wl.QUEUE_LABEL: QUEUE}}
    doc["spec"].update({"gpusPerNode": 4, **changes})
    doc["spec"] = {key: value for key, value in doc["spec"].items() if value is not None}
    found = validate_document(doc).resolved
    assert found is not None
    return doc, found


DOC_QUEUED, CURRENT = resolved()


def observed(
    queue: QueueSeen | None = None,
    *,
    status: dict[str, Any] | None = None,
    record: records.AttemptRecord | None = None,
    pods: tuple[dict[str, Any], ...] = (),
    progress: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> Observed:
    owner = job(**(status or {}))
    owner["metadata"]["labels"] = {wl.QUEUE_LABEL: QUEUE, **(labels or {})}
    owner["spec"] = DOC_QUEUED["spec"]
    return Observed(
        job=owner,
        record=record,
        pods=pods,
        queue=queue if queue is not None else QueueSeen(QUEUE),
        progress={"data": progress} if progress is not None else None,
    )


def workload(*conditions: tuple[str, str], owner: str = UID, **status: Any) -> dict[str, Any]:
    """The job's Workload as Kueue keeps it: its conditions (type, status) and other status fields."""
    return {
        "metadata": {
            "name": "paralleljob-gpt",
            "namespace": "research",
            "resourceVersion": "7",
            "ownerReferences": [{"kind": "ParallelJob", "name": "gpt", "uid": owner, "controller": True}],
        },
        "spec": {"podSets": [{"name": "main", "count": 2}]},
        "status": {
            "conditions": [
                {"type": kind, "status": state, "reason": "Because", "message": f"{kind} is {state}"}
                for kind, state in conditions
            ],
            **status,
        },
    }


ADMISSION = {"clusterQueue": "gpus", "podSetAssignments": [{"name": "main", "flavors": {"nvidia.com/gpu": "a100"}}]}
ADMITTED = workload((wl.QUOTA_RESERVED, "True"), (wl.ADMITTED, "True"), admission=ADMISSION)
FLAVOR = {
    "metadata": {"name": "a100"},
    "spec": {
        "nodeLabels": {"pool": "a100"},
        "nodeTaints": [{"key": "gpu", "value": "a100", "effect": "NoSchedule"}],
    },
}
PREEMPTED = workload((wl.QUOTA_RESERVED, "True"), (wl.ADMITTED, "True"), (wl.EVICTED, "True"), admission=ADMISSION)
PREEMPTED["status"]["conditions"][-1].update(reason=wl.PREEMPTED, message="preempted by high")


def queued(reason: str, said: str, *, recheck: float | None = 30.0, step: str = "queued", event: bool = True):
    message = f"queued in LocalQueue {QUEUE}: {said}"
    status = {
        "phase": "Queued",
        "message": message,
        "conditions": [VALID_NOW, condition("Queued", "True", reason, message, at=STAMP)],
        "placement": None,
        "podsReady": 0,
        "observedGeneration": 2,
    }
    events = (Event("Normal", "Queued", message),) if event else ()
    return Decision(step, status=status, events=events, requeue_after=recheck)


def gate(seen: Observed, current: ResolvedJob = CURRENT) -> kueue.Gate:
    return kueue.gate(seen, current, NOW)


# -- the gate ------------------------------------------------------------------------------------------------


def test_without_kueue_a_queued_job_waits_queued_and_is_not_looked_at_again() -> None:
    said = "this operator runs without Kueue (the chart's kueue.enabled, --kueue): the job waits until it does"
    assert gate(observed(QueueSeen(QUEUE, enabled=False))) == kueue.Gate(queued("KueueNotEnabled", said, recheck=None))


def test_a_job_without_a_workload_creates_it_with_its_priority_and_topology_request_and_waits_queued() -> None:
    priority = wl.Priority("kueue.x-k8s.io", "WorkloadPriorityClass", "high", 1000)
    request = {"podSetGroupName": "pp", "required": "rack"}
    decided = gate(observed(QueueSeen(QUEUE, priority=priority, topology_request=request))).decision
    body = wl.build_workload(observed().job, CURRENT, QUEUE, 2, priority, request)
    said = "Workload paralleljob-gpt created for 2 pods with topology request podSetGroupName=pp, required=rack"
    assert decided == dataclasses.replace(queued("Pending", said), workloads=(WorkloadWrite("create", body),))


def test_a_job_kueue_cannot_count_in_pods_is_told_to_set_gpus_per_node_and_creates_nothing() -> None:
    deepspeed = {k: v for k, v in DOC["spec"]["deepspeed"].items() if "batch" not in k and "accumulation" not in k}
    _, budget = resolved(gpusPerNode=None, parallelism={"gpus": 8}, deepspeed={**deepspeed, "train_batch_size": 64})
    said = "a job queued through Kueue needs spec.gpusPerNode: Kueue admits a number of pods; set it"
    assert gate(observed(), budget) == kueue.Gate(queued("NeedsGpusPerNode", said, recheck=None))


def test_a_quiet_pass_over_a_job_already_queued_so_writes_nothing() -> None:
    first = gate(observed(QueueSeen(QUEUE, workload=workload((wl.QUOTA_RESERVED, "False"))))).decision
    assert first.status is not None
    again = observed(QueueSeen(QUEUE, workload=workload((wl.QUOTA_RESERVED, "False"))), status=dict(first.status))
    assert gate(again) == kueue.Gate(Decision("queued", requeue_after=30.0))


@pytest.mark.parametrize(
    ("seen", "decision"),
    [
        pytest.param(
            observed(QueueSeen(QUEUE, workload=workload((wl.QUOTA_RESERVED, "False")))),
            queued("Pending", "QuotaReserved is False"),
            id="kueue-has-not-admitted-it-its-message-said",
        ),
        pytest.param(
            observed(QueueSeen(QUEUE, workload=workload(owner="someone-else"))),
            queued("WorkloadNameTaken", "Workload paralleljob-gpt belongs to another object; waiting until it is gone"),
            id="a-workload-of-its-name-is-someone-elses",
        ),
        pytest.param(
            observed(labels={"kueue.x-k8s.io/prebuilt-workload-name": "made-by-multikueue"}),
            queued(
                "Pending",
                "waiting for Workload made-by-multikueue, which MultiKueue creates (this operator names it "
                "paralleljob-gpt)",
            ),
            id="a-worker-job-waits-for-the-workload-multikueue-makes",
        ),
        pytest.param(
            observed(QueueSeen(QUEUE, workload=workload((wl.QUOTA_RESERVED, "True"), (wl.ADMITTED, "False")))),
            queued("Pending", "Admitted is False"),
            id="quota-reserved-admission-checks-pending",
        ),
        pytest.param(
            observed(QueueSeen(QUEUE, workload=workload((wl.ADMITTED, "True")))),
            queued("Pending", "Kueue has not considered the Workload yet"),
            id="admitted-not-reset-yet-after-a-release-is-not-admitted",
        ),
    ],
)
def test_a_job_kueue_has_not_admitted_waits_queued_saying_why(seen: Observed, decision: Decision) -> None:
    assert gate(seen) == kueue.Gate(decision)


def test_a_worker_job_adopts_the_workload_multikueue_made_for_it_and_reads_it_again_at_once() -> None:
    prebuilt = workload()
    prebuilt["metadata"]["ownerReferences"] = [{"kind": "MultiKueueCluster", "name": "w", "uid": "x"}]
    prebuilt["metadata"]["name"] = "made-by-multikueue"
    seen = observed(
        QueueSeen(QUEUE, workload=prebuilt), labels={"kueue.x-k8s.io/prebuilt-workload-name": "made-by-multikueue"}
    )
    owners = [*prebuilt["metadata"]["ownerReferences"], wl.owner_reference(seen.job)]
    adopt = WorkloadWrite("adopt", {"ownerReferences": owners}, prebuilt)
    assert gate(seen) == kueue.Gate(Decision("adopting-workload", workloads=(adopt,), requeue_after=0.0))


def test_a_manager_job_dispatched_to_a_worker_goes_no_further() -> None:
    _, managed = resolved(managedBy="kueue.x-k8s.io/multikueue")
    seen = observed(QueueSeen(QUEUE, workload=workload((wl.QUOTA_RESERVED, "True"), clusterName="worker")))
    assert gate(seen, managed) == kueue.Gate(Decision("dispatched"))


@pytest.mark.parametrize(
    ("found", "requeued"),
    [
        pytest.param(PREEMPTED, "True", id="preempted-holding-quota-gives-it-back-requeued"),
        pytest.param(
            workload((wl.EVICTED, "True"), (wl.QUOTA_RESERVED, "False")), None, id="evicted-without-quota-waits"
        ),
    ],
)
def test_an_evicted_workload_gives_its_quota_back_once_and_the_job_waits_queued(
    found: dict[str, Any], requeued: str | None
) -> None:
    decided = gate(observed(QueueSeen(QUEUE, workload=found))).decision
    reason = found["status"]["conditions"][-1]["reason"] if requeued else "Because"
    message = found["status"]["conditions"][-1]["message"] if requeued else "Evicted is True"
    assert (decided.step, decided.status and decided.status["message"]) == (
        "queued",
        f"queued in LocalQueue {QUEUE}: evicted by Kueue: {message}",
    )
    assert decided.status["conditions"][1]["reason"] == reason
    if requeued is None:
        assert decided.workloads == ()
        return
    (release,) = decided.workloads
    assert (release.verb, release.found) == ("release", found)
    by_type = {c["type"]: c for c in release.body["conditions"]}
    assert release.body["admission"] is None
    assert (by_type[wl.QUOTA_RESERVED]["status"], by_type[wl.ADMITTED]["status"]) == ("False", "False")
    assert (by_type[wl.REQUEUED]["status"], by_type[wl.REQUEUED]["lastTransitionTime"]) == (requeued, STAMP)


def test_once_admitted_the_job_goes_on_narrowed_to_its_flavours_taking_checkpoint_requests() -> None:
    gated = gate(observed(QueueSeen(QUEUE, workload=ADMITTED, flavors=(FLAVOR,))))
    message = "admitted by ClusterQueue gpus (flavours a100)"
    assert gated.decision == Decision(
        "admitted-by-kueue",
        status={"conditions": [condition("Queued", "False", "Admitted", message, at=STAMP)], "observedGeneration": 2},
    )
    assert gated.job is not None
    template = gated.job.spec.template
    assert template.node_selector == {"pool": "a100"}
    assert template.tolerations == [{"key": "gpu", "operator": "Equal", "value": "a100", "effect": "NoSchedule"}]
    assert {"name": environment.CHECKPOINT_REQUESTS, "value": "1"} in (template.env or [])
    assert gated.job.layout == CURRENT.layout  # only where the pods may go changed


def test_under_tas_the_job_goes_on_as_kueues_tas_pods() -> None:
    found = copy.deepcopy(ADMITTED)
    found["spec"]["podSets"][0]["topologyRequest"] = {"required": "rack"}
    assigned = kueue_topology.AssignedNodes(("n0", "n1"))
    gated = gate(observed(QueueSeen(QUEUE, workload=found, assigned=assigned)))
    assert gated.job is not None
    annotations = gated.job.spec.template.annotations or {}
    assert annotations[kueue_topology.WORKLOAD_ANNOTATION] == "paralleljob-gpt"
    key, level = kueue_topology.pod_annotation({"required": "rack"})
    assert annotations[key] == level


def test_an_assignment_that_breaks_a_rule_of_the_layout_gives_the_quota_back_unrequeued() -> None:
    broken = kueue_topology.AssignedNodes(("n0", "n1"), broken="tensor parallelism inside one NVLink domain")
    decided = gate(observed(QueueSeen(QUEUE, workload=ADMITTED, assigned=broken))).decision
    said = "Kueue's topology assignment breaks the rule 'tensor parallelism inside one NVLink domain'; quota "
    said += "given back, not requeued"
    (release,) = decided.workloads
    assert {c["type"]: c["status"] for c in release.body["conditions"]}[wl.REQUEUED] == "False"
    expected = queued(kueue.RULE_BROKEN, said, recheck=None)
    assert dataclasses.replace(decided, workloads=()) == dataclasses.replace(
        expected, events=(Event("Warning", "QuotaReleased", said), *expected.events)
    )


def test_an_assigned_node_kueue_is_to_replace_is_waited_for_pending() -> None:
    assigned = kueue_topology.AssignedNodes(("n0", "n1"))
    decided = gate(observed(QueueSeen(QUEUE, workload=ADMITTED, assigned=assigned, awaiting=("n1",)))).decision
    message = "admitted; waiting for Kueue to replace assigned node(s) n1 (TAS node replacement)"
    assert decided == Decision(
        "awaiting-node-replacement",
        status={"phase": "Pending", "message": message, "placement": None, "observedGeneration": 2},
        requeue_after=30.0,
    )


def test_an_evicted_gangs_pods_still_going_are_deleted_before_anything_else() -> None:
    record = records.AttemptRecord(attempt=0, spec={}, image="trainer:test", nodes=("n0", "n1"), evicted=True)
    pods = (pod("gpt-0"), pod("gpt-1", deleting_since=EARLIER))
    assert gate(observed(record=record, pods=pods)) == kueue.Gate(
        Decision("stopping-evicted-gang", deletes=("gpt-0",), requeue_after=2.0)
    )
    assert kueue.stage(observed(record=record, pods=pods), CURRENT) == "stopping"  # the Workload is not even read


# -- after an admission that could not place the gang --------------------------------------------------------


def test_a_gang_the_admitted_flavours_cannot_hold_gives_the_quota_back_to_be_tried_again_in_a_minute() -> None:
    seen = observed(QueueSeen(QUEUE, workload=ADMITTED), status={"message": "0/2 nodes have 4 free GPUs"})
    decided = kueue.released(seen, NOW)
    assert decided is not None
    said = "the admitted flavours cannot hold the gang (0/2 nodes have 4 free GPUs); quota given back, tried "
    said += "again in 60s"
    (release,) = decided.workloads
    assert release.body["requeueState"] == {"requeueAt": "2026-01-01T12:01:00Z"}
    assert decided.events[0] == Event("Warning", "QuotaReleased", said)
    assert (decided.step, decided.status and decided.status["phase"]) == ("queued", "Queued")
    assert kueue.released(observed(QueueSeen(QUEUE, workload=workload((wl.QUOTA_RESERVED, "False")))), NOW) is None


# -- a placed gang Kueue evicts ------------------------------------------------------------------------------

LIVE = records.AttemptRecord(attempt=1, spec={}, image="trainer:test", nodes=("n0", "n1"))
RUNNING = (pod("gpt-0", attempt=1, rank=0), pod("gpt-1", attempt=1, rank=1))


def evicting(
    record: records.AttemptRecord = LIVE,
    found: dict[str, Any] = PREEMPTED,
    progress: dict[str, str] | None = None,
    current: ResolvedJob = CURRENT,
) -> Decision | None:
    seen = observed(QueueSeen(QUEUE, workload=found), record=record, pods=RUNNING, progress=progress)
    return kueue.evicting(seen, current, RUNNING, SETTINGS, NOW)


def stopped(eviction: dict[str, str], saved: str, cleared: str | None) -> Decision:
    message = f"evicted by Kueue (Preempted: preempted by high){saved}; the gang stops and resumes from its newest "
    message += "checkpoint when admitted again"
    conditions = [  # in the API's order of types
        condition("Scheduled", "False", "Evicted", message, at=STAMP),
        condition("Ready", "False", "Evicted", message, at=STAMP),
        condition("Queued", "True", "Preempted", message, at=STAMP),
    ]
    status = {"phase": "Queued", "message": message, "conditions": conditions, "placement": None, "podsReady": 0}
    return Decision(
        "evicted",
        record=LIVE.with_eviction(eviction).with_evicted(),
        status={**status, "network": None, "observedGeneration": 2},
        events=(Event("Warning", "Evicted", f"{message} (LocalQueue {QUEUE})"),),
        deletes=("gpt-0", "gpt-1"),
        checkpoint_request=cleared,
        wake_others=True,
        requeue_after=2.0,
    )


EVICTION = {"reason": "Preempted", "message": "preempted by high", "since": STAMP}


def test_an_admitted_gang_runs_on() -> None:
    assert evicting(found=ADMITTED) is None


def test_a_gang_that_keeps_no_checkpoints_stops_at_once_and_its_record_says_why() -> None:
    _, bare = resolved(checkpoint=None)
    assert evicting(current=bare) == stopped(EVICTION, "", None)
    assert not kueue.reads_progress(observed(QueueSeen(QUEUE, workload=PREEMPTED), record=LIVE), bare, RUNNING)


def test_a_fresh_checkpoint_is_not_asked_for_again() -> None:
    fresh = {channel.LAST_CHECKPOINT_TIME: seconds_before_now(10), channel.LAST_CHECKPOINT_STEP: "40"}
    assert evicting(progress=fresh) == stopped(EVICTION, "", None)


def test_an_old_checkpoint_asks_rank_0_for_one_before_the_record_says_so() -> None:
    old = {channel.LAST_CHECKPOINT_TIME: seconds_before_now(600), channel.LAST_CHECKPOINT_STEP: "40"}
    decided = evicting(progress=old)
    request = f"1-{int(NOW.timestamp())}"
    said = "evicted by Kueue (Preempted: preempted by high); asked rank 0 for a checkpoint before the gang stops"
    asked = {**EVICTION, "checkpointRequest": request, "checkpointStep": "40"}
    assert decided == Decision(
        "evicting",
        record=LIVE.with_eviction(asked),
        status={"message": said, "observedGeneration": 2},
        events=(Event("Normal", "CheckpointRequested", said),),
        requeue_after=2.0,
        first=(Decision("asking-for-checkpoint", checkpoint_request=request),),
    )


ASKED = {**EVICTION, "checkpointRequest": "1-99", "checkpointStep": "40"}


@pytest.mark.parametrize(
    ("since", "served", "decision"),
    [
        pytest.param(STAMP, "", Decision("evicting", requeue_after=2.0), id="not-answered-yet-waits"),
        pytest.param(
            STAMP, "1-99", stopped(ASKED, "; the checkpoint asked for is saved", ""), id="answered-stops-and-clears"
        ),
        pytest.param(
            seconds_before_now(120),
            "",
            stopped({**ASKED, "since": seconds_before_now(120)}, "; no checkpoint came in time", ""),
            id="overdue-stops-anyway",
        ),
    ],
)
def test_an_asked_checkpoint_is_waited_for_at_most_two_minutes(since: str, served: str, decision: Decision) -> None:
    record = LIVE.with_eviction({**ASKED, "since": since})
    assert evicting(record, progress={channel.CHECKPOINT_SERVED: served}) == decision


def test_a_deleted_workload_stops_the_gang_too() -> None:
    seen = observed(QueueSeen(QUEUE, workload=None), record=LIVE, pods=RUNNING)
    assert kueue.evicted(seen) == ("WorkloadDeleted", "the job's Workload was deleted")


# -- the end -------------------------------------------------------------------------------------------------


def test_the_end_marks_the_workload_finished_once() -> None:
    seen = observed(QueueSeen(QUEUE, workload=ADMITTED), status={"message": "training finished"})
    decided = kueue.finished(seen, "Succeeded", "", NOW)
    assert decided is not None
    (finish,) = decided.workloads
    assert (finish.verb, finish.found) == ("finish", ADMITTED)
    (done,) = [c for c in finish.body["conditions"] if c["type"] == wl.FINISHED]
    assert (done["status"], done["reason"], done["message"], done["lastTransitionTime"]) == (
        "True",
        "Succeeded",
        "training finished",
        STAMP,
    )
    over = workload((wl.FINISHED, "True"))
    assert kueue.finished(observed(QueueSeen(QUEUE, workload=over)), "Succeeded", "", NOW) is None
    assert kueue.finished(observed(QueueSeen(QUEUE, workload=None)), "Failed", "", NOW) is None
