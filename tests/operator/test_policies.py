"""The pure policies behind the reconciler, as tables: the gang verdict, GPU reservations, conditions."""

from __future__ import annotations

import datetime

import pytest

from paralleljob import planning
from paralleljob.handlers import conditions, gang, start_failures
from paralleljob.manifests import timestamps


def pod(rank, phase="Running", node=None, **extra):
    meta = {
        "name": f"gpt-{rank}",
        "namespace": "ns",
        "labels": {"paralleljob.io/node-rank": str(rank), "paralleljob.io/node": f"n{rank}"},
    }
    meta.update(extra.pop("metadata", {}))
    return {"metadata": meta, "spec": {"nodeName": node} if node else {}, "status": {"phase": phase, **extra}}


@pytest.mark.parametrize(
    ("pods", "not_ready", "verdict", "blamed"),
    [
        ([pod(0), pod(1)], (), "running", None),
        ([pod(0, "Pending"), pod(1)], (), "starting", None),
        ([pod(0, "Succeeded"), pod(1)], (), "succeeded", None),
        ([pod(0, "Succeeded"), pod(1, "Failed")], (), "succeeded", None),
        ([pod(0), pod(1, "Failed", reason="Error")], (), "broken", "gpt-1"),
        ([pod(0), pod(1, "Failed", reason="Evicted")], (), "broken", "gpt-1"),
        ([pod(0), pod(1, metadata={"deletionTimestamp": "now"})], (), "broken", "gpt-1"),
        ([pod(0)], (), "broken", None),
        ([pod(0), pod(1, node="bad")], {"bad": "is NotReady"}, "broken", "gpt-1"),
        ([pod(0), pod(1)], {"n1": "is NotReady"}, "broken", "gpt-1"),
        ([pod(0), pod(1, "Pending")], {"n1": "no longer exists"}, "broken", "gpt-1"),
    ],
    ids=[
        "all-running",
        "one-pending",
        "rank0-done",
        "rank0-done-other-failed",
        "failed",
        "evicted",
        "being-deleted",
        "deleted",
        "node-not-ready",
        "planned-node-not-ready",
        "planned-node-deleted",
    ],
)
def test_gang_verdict(pods, not_ready, verdict, blamed):
    state = gang.judge(pods, 2, not_ready)
    assert (state.verdict, state.pod) == (verdict, blamed)


def test_evicted_pods_are_named_as_such():
    assert "evicted" in gang.judge([pod(0), pod(1, "Failed", reason="Evicted")], 2).reason


def terminated(message):
    return {"containerStatuses": [{"name": "trainer", "state": {"terminated": {"exitCode": 1, "message": message}}}]}


NO_DEVICE = "NetworkReady NoRdmaDevice: fabric infiniband but the pod sees no RDMA device\n"
FALLBACK = "NetworkVerified SocketFallback: NCCL uses Socket on fabric infiniband\n"


@pytest.mark.parametrize(
    ("pods", "cause", "condition", "reason"),
    [
        ([pod(0, "Failed", **terminated(NO_DEVICE)), pod(1)], gang.NETWORK, "NetworkReady", "NoRdmaDevice"),
        ([pod(0, "Failed"), pod(1, "Failed", **terminated(NO_DEVICE))], gang.NETWORK, "NetworkReady", "NoRdmaDevice"),
        ([pod(0), pod(1, "Failed", **terminated(FALLBACK))], gang.NETWORK, "NetworkVerified", "SocketFallback"),
        ([pod(0), pod(1, "Failed", **terminated("Traceback (most recent call last):"))], gang.BROKEN, None, None),
        ([pod(0), pod(1, "Running", **terminated(NO_DEVICE))], None, None, None),
    ],
    ids=[
        "preflight-failed",
        # The pod that says why wins over one that only died with it.
        "named-over-unnamed",
        "nccl-fell-back",
        "log-tail-is-a-plain-failure",
        "not-failed-yet",
    ],
)
def test_a_network_failure_in_a_termination_message_names_its_condition_and_reason(pods, cause, condition, reason):
    state = gang.judge(pods, 2)
    assert (state.cause if state.verdict == "broken" else None) == cause
    assert (state.network.condition if state.network else None) == condition
    assert (state.network.reason if state.network else None) == reason


NOW = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)
UNSCHEDULABLE = {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "x"}]}
PULL_FAILED = {"containerStatuses": [{"state": {"waiting": {"reason": "ErrImagePull", "message": "i/o timeout"}}}]}
PULL_BACKOFF = {"containerStatuses": [{"state": {"waiting": {"reason": "ImagePullBackOff", "message": "no such"}}}]}
CONFIG_ERROR = {"containerStatuses": [{"state": {"waiting": {"reason": "CreateContainerConfigError"}}}]}
CREATING = {"containerStatuses": [{"state": {"waiting": {"reason": "ContainerCreating"}}}]}
LIMITS = start_failures.Limits(start_timeout=600, creating_timeout=1800, pull_retries=3)


def ago(seconds):
    return timestamps.format_time(NOW - datetime.timedelta(seconds=seconds))


def aged(rank, seconds, scheduled=None, **status):
    """A Pending pod created `seconds` ago; `scheduled`: bound to its node that many seconds ago."""
    if scheduled is not None:
        status["conditions"] = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": ago(scheduled)}]
    stalled = pod(rank, "Pending", node=f"n{rank}" if scheduled is not None else None, **status)
    stalled["metadata"].update(creationTimestamp=ago(seconds), uid=f"uid-{rank}")
    return stalled


def done(rank, seconds_ago):
    """A Succeeded pod whose container finished `seconds_ago`."""
    finished = {"state": {"terminated": {"exitCode": 0, "finishedAt": ago(seconds_ago)}}}
    return pod(rank, "Succeeded", containerStatuses=[{"name": "trainer", **finished}])


@pytest.mark.parametrize(
    ("pods", "verdict", "recheck_in"),
    [
        ([done(0, 5), pod(1), pod(2)], "finishing", gang.FINISH_GRACE_SECONDS - 5),
        ([done(0, 5), done(1, 1), pod(2, "Failed")], "succeeded", None),
        ([done(0, 5), pod(1, metadata={"deletionTimestamp": "now"})], "finishing", gang.FINISH_GRACE_SECONDS - 5),
        ([done(0, gang.FINISH_GRACE_SECONDS + 1), pod(1)], "succeeded", None),
        ([done(0, 5)], "succeeded", None),
    ],
    ids=["others-still-exiting", "all-ended", "other-being-deleted", "grace-ran-out", "others-gone"],
)
def test_a_finished_rank_0_gives_the_others_a_grace_to_exit_before_the_job_ends(pods, verdict, recheck_in):
    state = gang.judge(pods, 3, at=NOW)
    assert (state.verdict, state.recheck_in) == (verdict, pytest.approx(recheck_in) if recheck_in else None)
    if verdict == "finishing":
        assert "gpt-1" in state.reason and "gpt-0" not in state.reason


@pytest.mark.parametrize(
    ("stuck", "pulls", "verdict", "cause", "recheck_in"),
    [
        (aged(1, 700, **UNSCHEDULABLE), 0, "broken", gang.START_TIMEOUT, None),
        (aged(1, 100, **UNSCHEDULABLE), 0, "starting", gang.BROKEN, 500),
        (aged(1, 700, scheduled=100, **CONFIG_ERROR), 0, "starting", gang.BROKEN, 500),
        (aged(1, 700, scheduled=650, **CONFIG_ERROR), 0, "broken", gang.START_TIMEOUT, None),
        (aged(1, 700, scheduled=700, **PULL_FAILED), 1, "starting", gang.BROKEN, None),
        (aged(1, 700, scheduled=700, **PULL_BACKOFF), 2, "starting", gang.BROKEN, None),
        (aged(1, 60, scheduled=60, **PULL_FAILED), 3, "broken", gang.START_TIMEOUT, None),
        (aged(1, 700, scheduled=700, **CREATING), 0, "starting", gang.BROKEN, 1100),
        (aged(1, 1900, scheduled=1850, **CREATING), 0, "broken", gang.START_TIMEOUT, None),
        (aged(1, 700), 0, "starting", gang.BROKEN, None),
    ],
    ids=[
        "unschedulable-too-long",
        "unschedulable-not-yet",
        "config-error-timed-from-scheduling",
        "config-error-too-long",
        "one-transient-pull-failure-after-a-long-pull",
        "backing-off-after-two-failures",
        "third-failed-pull-blames-the-node",
        "container-creating-not-yet",
        "container-creating-too-long",
        "no-signal",
    ],
)
def test_a_gang_that_cannot_start_fails_when_its_own_clock_runs_out(stuck, pulls, verdict, cause, recheck_in):
    state = gang.judge([pod(0), stuck], 2, limits=LIMITS, at=NOW, pull_failures={"uid-1": pulls})
    assert (state.verdict, state.cause, state.recheck_in) == (verdict, cause, recheck_in)
    if verdict == "broken":
        assert state.pod == "gpt-1" and state.blamed == ("n1",)


@pytest.mark.parametrize(
    ("stuck", "said"),
    [
        (aged(1, 10, **UNSCHEDULABLE), "pod gpt-1: Unschedulable: x"),
        (aged(1, 10, scheduled=5, **PULL_FAILED), "failed pull 2 of 3 before the node is blamed"),
        (aged(1, 10, scheduled=5, **CREATING), ""),
    ],
    ids=["unschedulable", "failed-pull", "container-creating-as-every-pod-does"],
)
def test_a_starting_gang_says_what_its_stalled_pod_waits_on(stuck, said):
    state = gang.judge([pod(0), stuck], 2, limits=LIMITS, at=NOW, pull_failures={"uid-1": 2})
    assert state.verdict == "starting" and said in state.reason and (state.reason == "") == (said == "")


def test_every_stalled_pods_planned_node_is_blamed_when_one_times_out():
    pods = [pod(0), aged(1, 700, **UNSCHEDULABLE), aged(2, 10, **UNSCHEDULABLE), pod(3, "Pending")]
    state = gang.judge(pods, 4, limits=LIMITS, at=NOW)
    assert state.reason.startswith("pod gpt-1 did not start within 600s (Unschedulable: x)")
    assert state.blamed == ("n1", "n2")


@pytest.mark.parametrize(
    ("events", "counted"),
    [
        (["ContainerCreating", "ErrImagePull", "ImagePullBackOff", "ImagePullBackOff", "ErrImagePull"], 2),
        (["ImagePullBackOff"], 1),
        (["ErrImagePull", "ErrImagePull"], 1),
        (["ErrImagePull", "ImagePullBackOff", "ErrImagePull", "ImagePullBackOff", "ErrImagePull"], 3),
    ],
    ids=["two-pulls-failed", "backing-off-when-first-seen", "one-failure-reported-twice", "three-pulls-failed"],
)
def test_failed_image_pulls_are_counted_from_the_waiting_reasons_the_watch_sees(events, counted):
    pulls = start_failures.PullFailures()
    for reason in events:
        pulls.observe(
            "MODIFIED", aged(1, 0, scheduled=0, containerStatuses=[{"state": {"waiting": {"reason": reason}}}])
        )
    assert pulls.snapshot() == {"uid-1": counted}
    pulls.observe("MODIFIED", aged(1, 0, scheduled=0) | {"status": {"phase": "Running"}})
    assert pulls.snapshot() == {}


def job(name, phase, placement, gpus=4):
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "status": {"phase": phase, "gpusPerNode": gpus, "placement": placement},
    }


PLACED = [{"node": "n0", "pod": "a-0"}, {"node": "n1", "pod": "a-1"}]


@pytest.mark.parametrize(
    ("jobs", "pods", "reserved"),
    [
        ([job("a", "Pending", PLACED)], [], [("n0", 4), ("n1", 4)]),
        ([job("a", "Running", PLACED)], [pod(0, node="n0", metadata={"name": "a-0"})], [("n0", 4), ("n1", 4)]),
        ([job("a", "Succeeded", PLACED)], [], []),
        ([job("a", "Pending", None)], [], []),
        ([job("me", "Pending", PLACED)], [], []),
    ],
    ids=["unbound", "pod-without-gpus-still-reserved", "finished", "not-placed", "self-excluded"],
)
def test_reservations_cover_placed_ranks_not_yet_bound(jobs, pods, reserved):
    found = planning.job_reservations(jobs, pods, exclude=("ns", "me"))
    assert [(r.node, r.gpus) for r in found] == reserved


def test_bound_pods_with_gpus_are_not_reserved_twice():
    bound = {
        "metadata": {"name": "a-0", "namespace": "ns"},
        "spec": {"nodeName": "n0", "containers": [{"resources": {"requests": {"nvidia.com/gpu": "4"}}}]},
        "status": {"phase": "Running"},
    }
    found = planning.job_reservations([job("a", "Running", PLACED)], [bound])
    assert [r.node for r in found] == ["n1"]


def test_condition_transition_time_moves_only_with_status():
    first = conditions.set_condition(None, "Ready", "False", "A", "x", 1, at="t1")
    same_status = conditions.set_condition(first, "Ready", "False", "B", "y", 2, at="t2")
    flipped = conditions.set_condition(same_status, "Ready", "True", "C", "z", 2, at="t3")
    assert [c["lastTransitionTime"] for c in (first[0], same_status[0], flipped[0])] == ["t1", "t1", "t3"]
    assert same_status[0]["reason"] == "B" and same_status[0]["observedGeneration"] == 2


def test_conditions_keep_api_order_and_compare_without_times():
    conds = conditions.set_condition(None, "Scheduled", "True", "Placed", "", 1, at="t1")
    conds = conditions.set_condition(conds, "Valid", "True", "Validated", "", 1, at="t1")
    assert [c["type"] for c in conds] == ["Valid", "Scheduled"]
    retimed = [{**c, "lastTransitionTime": "t9"} for c in conds]
    assert conditions.same(conds, retimed)


def test_a_pod_gone_before_it_was_seen_terminating_is_blamed_on_its_planned_node():
    state = gang.judge([pod(0)], 2, planned_nodes={0: "n0", 1: "n1"})
    assert (state.verdict, state.node) == ("broken", "n1")
