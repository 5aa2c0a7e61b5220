"""The admission queue: waiting jobs are admitted one round at a time in a defined order (restarting jobs
first, then higher PriorityClass value, then earlier creation), admission plans from the watches' caches
without listing every pod, and a gang restart never waits behind admissions and holds its old nodes."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import kubernetes
import pytest

from paralleljob.handlers import reconcile
from paralleljob.handlers.admission_queue import AdmissionQueue, Order
from paralleljob.k8s import session as k8s_session
from paralleljob.planning.inventory import Reservation
from testcluster import polling
from tests.operator.helpers import (
    Cluster,
    Operator,
    fresh_view,
    install_operator_rbac,
    job_doc,
    operator_calls,
    operator_requests,
    wait_for,
)

SETTINGS = reconcile.Settings(image="trainer:test")

# Two 4-GPU nodes per job: quick to create, bind and judge.
TWO_NODES = {"pipeline": 2, "tensor": 4, "data": 1}

ORDERS = {
    "a restarting job goes before a new one of higher priority": (
        [("new-high", False, 1000, "2026-01-01T00:00:00Z"), ("restarting-low", True, 0, "2026-01-02T00:00:00Z")],
        ["restarting-low", "new-high"],
    ),
    "higher priority goes first": (
        [("low", False, 10, "2026-01-01T00:00:00Z"), ("high", False, 1000, "2026-01-02T00:00:00Z")],
        ["high", "low"],
    ),
    "at equal priority the earlier job goes first": (
        [("b-newer", False, 0, "2026-01-02T00:00:00Z"), ("a-older", False, 0, "2026-01-01T00:00:00Z")],
        ["a-older", "b-newer"],
    ),
    "at equal priority and time the name decides": (
        [("b", False, 0, "2026-01-01T00:00:00Z"), ("a", False, 0, "2026-01-01T00:00:00Z")],
        ["a", "b"],
    ),
    "a negative priority goes after none": (
        [("background", False, -5, "2026-01-01T00:00:00Z"), ("default", False, 0, "2026-01-03T00:00:00Z")],
        ["default", "background"],
    ),
}


@pytest.mark.parametrize(("jobs", "expected"), ORDERS.values(), ids=ORDERS.keys())
def test_a_round_admits_in_the_defined_order(jobs: list[tuple[str, bool, int, str]], expected: list[str]) -> None:
    admitted: list[Any] = []
    done = threading.Event()

    def admit(key: Any, snapshot: int) -> None:
        admitted.append((key[1], snapshot))
        if len(admitted) == len(jobs):
            done.set()

    queue: AdmissionQueue[int, None] = AdmissionQueue(admit, snapshot=lambda: len(admitted))
    queue.offer_all(
        (("ns", name), Order.of("ns", name, restarting=restarting, priority=priority, created=created))
        for name, restarting, priority, created in jobs
    )
    queue.start()
    try:
        assert done.wait(10)
    finally:
        queue.stop()
    assert [name for name, _ in admitted] == expected
    assert {snapshot for _, snapshot in admitted} == {0}  # one snapshot for the whole round


def test_a_job_offered_again_while_waiting_keeps_one_place_with_its_newer_order() -> None:
    queue: AdmissionQueue[None, None] = AdmissionQueue(lambda key, _: None, snapshot=lambda: None)
    queue.offer(("ns", "a"), Order.of("ns", "a", restarting=False, priority=0, created="2026-01-01T00:00:00Z"))
    queue.offer(("ns", "b"), Order.of("ns", "b", restarting=False, priority=0, created="2026-01-02T00:00:00Z"))
    queue.offer(("ns", "b"), Order.of("ns", "b", restarting=True, priority=0, created="2026-01-02T00:00:00Z"))
    assert queue.waiting() == [("ns", "b"), ("ns", "a")]


def test_a_job_offered_alone_is_tried_after_the_waiting_jobs_ahead_of_it() -> None:
    # A waiting job's own pass (its status changed, its timer fell due) offers it alone. When GPUs had been
    # freed just before, a round of that one job used to admit it ahead of the jobs that had been found not to
    # fit before it (the CI failure that test_freed_gpus_go_to_the_first_job_in_order... reproduces).
    free = threading.Event()
    passes: list[str] = []
    admitted: list[str] = []
    six_passes = threading.Event()

    def admit(key: Any, _: None) -> str | None:
        passes.append(key[1])
        if len(passes) == 6:
            six_passes.set()
        if free.is_set() and not admitted:
            admitted.append(key[1])
            return None
        return "judged against a full cluster"  # did not fit: it keeps its place

    queue: AdmissionQueue[None, str] = AdmissionQueue(admit, snapshot=lambda: None)
    jobs = {"a-default-oldest": (0, "01"), "c-high-older": (1000, "02"), "b-high-newer": (1000, "03")}
    orders = {
        name: Order.of("ns", name, restarting=False, priority=priority, created=f"2026-01-{day}T00:00:00Z")
        for name, (priority, day) in jobs.items()
    }
    queue.offer_all((("ns", name), order) for name, order in orders.items())
    queue.start()
    try:
        wait_for(lambda: len(passes) == 3, timeout=10, what="the first round")
        assert queue.waiting() == [("ns", "c-high-older"), ("ns", "b-high-newer"), ("ns", "a-default-oldest")]
        free.set()
        queue.offer(("ns", "a-default-oldest"), orders["a-default-oldest"])
        assert six_passes.wait(10), f"passes: {passes}"
    finally:
        queue.stop()
    assert passes == ["c-high-older", "b-high-newer", "a-default-oldest"] * 2
    assert admitted == ["c-high-older"]
    assert queue.waiting() == [("ns", "b-high-newer"), ("ns", "a-default-oldest")]


def test_a_job_offered_alone_does_not_bring_in_the_jobs_behind_it() -> None:
    queue: AdmissionQueue[None, str] = AdmissionQueue(lambda key, _: "full", snapshot=lambda: None)
    low = Order.of("ns", "low", restarting=False, priority=0, created="2026-01-01T00:00:00Z")
    high = Order.of("ns", "high", restarting=False, priority=10, created="2026-01-01T00:00:00Z")
    queue.offer_all([(("ns", "low"), low), (("ns", "high"), high)])
    assert queue.take_round() == [("ns", "high"), ("ns", "low")]
    queue.settle(("ns", "high"), high, "full")
    queue.settle(("ns", "low"), low, "full")
    queue.offer(("ns", "high"), high)
    assert queue.take_round() == [("ns", "high")]
    queue.offer(("ns", "low"), low)
    assert queue.take_round() == [("ns", "high"), ("ns", "low")]
    queue.settle(("ns", "high"), high, None)  # admitted, or gone: it leaves the queue
    queue.offer(("ns", "low"), low)
    assert queue.take_round() == [("ns", "low")]
    assert queue.waiting() == [("ns", "low")]
    queue.forget(("ns", "low"))  # deleted while it kept its place
    assert queue.waiting() == []


def test_a_waiting_job_ahead_is_not_tried_again_while_the_cluster_has_no_more_room() -> None:
    # Each waiting job's timer offers it alone once a minute: trying every job ahead of it each time would
    # cost a pass per job ahead, N^2/2 passes a minute for N waiting jobs.
    rooms = iter([1, 1, 2])  # the free GPUs of each round's snapshot
    passes: list[tuple[str, int]] = []
    four_passes = threading.Event()

    def admit(key: Any, room: int) -> int:
        passes.append((key[1], room))
        if len(passes) == 4:
            four_passes.set()
        return room  # judged against this room: does not fit

    queue: AdmissionQueue[int, int] = AdmissionQueue(
        admit, lambda: next(rooms), improved=lambda judged, room: room > judged
    )
    first = Order.of("ns", "first", restarting=False, priority=0, created="2026-01-01T00:00:00Z")
    last = Order.of("ns", "last", restarting=False, priority=0, created="2026-01-02T00:00:00Z")
    queue.offer(("ns", "first"), first)
    queue.start()
    try:
        wait_for(lambda: len(passes) == 1, timeout=10, what="the first round")
        queue.offer(("ns", "last"), last)  # the room is the same: "first" is not tried again
        wait_for(lambda: len(passes) == 2, timeout=10, what="the second round")
        queue.offer(("ns", "last"), last)  # a GPU more: "first" goes first
        assert four_passes.wait(10), f"passes: {passes}"
    finally:
        queue.stop()
    assert passes == [("first", 1), ("last", 1), ("first", 2), ("last", 2)]


def cluster_wide_pod_lists(apiserver: Any) -> int:
    return sum(1 for call in operator_calls(apiserver) if call == ("list", "", "pods", ""))


def cluster_wide_record_lists(apiserver: Any) -> int:
    """The operator's cluster-wide reads of the attempt records that reserve nodes (label-selected ConfigMaps)."""
    return sum(1 for call in operator_requests(apiserver) if call == ("list", "", "configmaps", ""))


def quiet(count: Callable[[], int], seconds: float = 1.5) -> int:
    """The count once it has not changed for `seconds`."""
    return int(polling.wait_until_steady(count, seconds, what="the count"))


def touch_job(cluster: Cluster, name: str, value: str) -> None:
    """Change the job's metadata: its watch event brings a pass, which offers a waiting job alone."""
    touch = {"metadata": {"annotations": {"example.com/touched": value}}}
    cluster.custom.patch_namespaced_custom_object("paralleljob.io", "v1alpha1", "research", "paralleljobs", name, touch)


def job_gone(cluster: Cluster, name: str) -> bool:
    try:
        cluster.custom.get_namespaced_custom_object("paralleljob.io", "v1alpha1", "research", "paralleljobs", name)
    except kubernetes.client.ApiException as error:
        return error.status == 404
    return False


def scheduled(cluster: Cluster, name: str) -> dict[str, Any]:
    conditions = cluster.status(name).get("conditions") or []
    return {c["type"]: c for c in conditions}.get("Scheduled") or {}


def run_holder(cluster: Cluster, name: str = "holder") -> None:
    cluster.apply(job_doc(name, parallelism=TWO_NODES))
    wait_for(lambda: len(cluster.pods(name)) == 2, what=f"the pods of {name}")
    cluster.bind_all(name)
    wait_for(lambda: cluster.status(name).get("phase") == "Running", what=f"{name} running")


@pytest.fixture
def operator_args() -> tuple[str, ...]:
    # The administrator lets jobs name the PriorityClass this module's jobs use (none is allowed by default).
    return (*Operator.ARGS, "--allowed-priority-classes=high")


def test_freed_gpus_go_to_the_first_job_in_order_and_no_admission_lists_every_pod(cluster, operator, apiserver):
    scheduling = kubernetes.client.SchedulingV1Api(cluster.core.api_client)
    scheduling.create_priority_class({"metadata": {"name": "high"}, "value": 1000})
    cluster.add_nodes(2)
    run_holder(cluster)
    waiting = {
        "a-default-oldest": None,
        "c-high-older": "high",
        "b-high-newer": "high",  # created a second later: the name would put it first, its creation time does not
    }
    for name, priority_class in waiting.items():
        doc = job_doc(name, parallelism=TWO_NODES)
        if priority_class:
            doc["spec"]["template"] = {"priorityClassName": priority_class}
        cluster.apply(doc)
        if name == "c-high-older":
            time.sleep(1.05)  # creation times have whole seconds
    for name in waiting:
        wait_for(lambda n=name: scheduled(cluster, n).get("reason") == "Unschedulable", what=f"{name} waiting")

    pod_lists, record_lists = cluster_wide_pod_lists(apiserver), cluster_wide_record_lists(apiserver)
    # A label change wakes every waiting job: a recheck lists the reserving records once, then each waiting
    # job's admission pass lists them (reservations), and none lists the pods of the cluster.
    cluster.core.patch_node("gpu-000", {"metadata": {"labels": {"example.com/relabelled": "true"}}})
    wait_for(lambda: cluster_wide_record_lists(apiserver) >= record_lists + 1 + len(waiting), what="admission passes")
    assert cluster_wide_pod_lists(apiserver) == pod_lists

    # With no more room than the waiting jobs were judged against, a job offered alone costs one round: the
    # round's read of the reservations and its own pass's; the jobs ahead of it are not tried again.
    record_lists = quiet(lambda: cluster_wide_record_lists(apiserver))
    touch_job(cluster, "a-default-oldest", "1")
    assert quiet(lambda: cluster_wide_record_lists(apiserver)) == record_lists + 2

    # From here every list of the records takes 3 s, so that the recheck that the holder's end requests offers
    # the waiting jobs late; meanwhile the last job in order is offered alone (any change of it brings a pass)
    # and its admission pass sees the freed GPUs. They must still go to the first job in order.
    apiserver.latency[("list", "configmaps")] = 3.0
    cluster.set_pod_phase("holder-0", "Succeeded")
    wait_for(lambda: cluster.status("holder").get("phase") == "Succeeded", what="the holder's end")
    finished = lambda: all(pod["status"].get("phase") == "Succeeded" for pod in cluster.pods("holder"))  # noqa: E731
    wait_for(finished, what="the holder's last running pod gone")
    touch_job(cluster, "a-default-oldest", "2")
    started = lambda: [name for name in waiting if len(cluster.pods(name)) == 2]  # noqa: E731
    assert wait_for(started, timeout=30, what="a waiting job started") == ["c-high-older"]
    for name in ("a-default-oldest", "b-high-newer"):
        assert cluster.pods(name) == []
        assert scheduled(cluster, name).get("reason") == "Unschedulable"


def test_a_released_reservation_goes_to_the_first_job_in_order(cluster, operator, apiserver):
    # The holder is placed but its pods are not bound: it holds its nodes by its reservation alone, which
    # goes when it is deleted, with no change the watches see. The jobs waiting ahead of a job offered alone
    # must be tried again all the same.
    cluster.add_nodes(2)
    cluster.apply(job_doc("holder", parallelism=TWO_NODES))
    wait_for(lambda: len(cluster.pods("holder")) == 2, what="the pods of the holder")
    waiting = ["first", "second"]
    for name in waiting:
        cluster.apply(job_doc(name, parallelism=TWO_NODES))
        time.sleep(1.05)  # creation times have whole seconds
    for name in waiting:
        wait_for(lambda n=name: scheduled(cluster, n).get("reason") == "Unschedulable", what=f"{name} waiting")
    quiet(lambda: cluster_wide_record_lists(apiserver))

    apiserver.latency[("list", "configmaps")] = 3.0  # the recheck the deletion requests comes late
    cluster.custom.delete_namespaced_custom_object("paralleljob.io", "v1alpha1", "research", "paralleljobs", "holder")
    wait_for(lambda: job_gone(cluster, "holder"), what="the holder gone")
    touch_job(cluster, "second", "1")
    started = lambda: [name for name in waiting if len(cluster.pods(name)) == 2]  # noqa: E731
    assert wait_for(started, timeout=30, what="a waiting job started") == ["first"]


def test_an_admission_pass_still_counts_the_reservations_its_round_began_with(cluster, apiserver):
    # GPUs released during a round go to the next round, in order: a pass late in the round still counts what
    # the round began with, though the job that held it is gone when the pass reads the jobs.
    cluster.add_nodes(2)
    cluster.apply(job_doc("late", parallelism=TWO_NODES))
    session = k8s_session.connect(str(install_operator_rbac(apiserver, cluster.client)))
    view = fresh_view(cluster)
    began_with = frozenset(Reservation(node, 4, "research/released-meanwhile") for node in view.known)
    assert reconcile.reconcile(session, SETTINGS, "research", "late", view).step == "awaiting-admission"
    in_round = dataclasses.replace(view, round_held=began_with)
    outcome = reconcile.reconcile(session, SETTINGS, "research", "late", in_round, admit=True)
    assert outcome.step == "unschedulable"
    assert outcome.held is not None and set(outcome.held) == began_with  # what it was judged against
    assert reconcile.reconcile(session, SETTINGS, "research", "late", view, admit=True).step == "admitted"


def test_a_gang_restart_does_not_wait_behind_admissions(cluster, operator, apiserver):
    cluster.add_nodes(2)
    run_holder(cluster)
    # From here every admission pass hangs on its read of the other jobs' reservations; a restart reads none,
    # so it must go through while the admissions queue up. (Held, not slowed: the proxy records a request once
    # it is answered, and shows a held one in `holding` while it waits.)
    apiserver.held.add(("list", "configmaps"))
    waiting = [f"waiting-{i}" for i in range(8)]  # more than asyncio's default thread pool has threads
    for name in waiting:
        cluster.apply(job_doc(name, parallelism=TWO_NODES))
    wait_for(lambda: ("list", "configmaps", "") in apiserver.holding, what="an admission under way")
    nodes = {pod["metadata"]["name"]: pod["spec"]["nodeName"] for pod in cluster.pods("holder")}
    cluster.set_pod_phase("holder-1", "Failed", reason="Error")

    def gang_deleted() -> bool:
        pods = cluster.pods("holder")
        return all(
            pod["metadata"].get("deletionTimestamp") or pod["metadata"]["labels"]["paralleljob.io/attempt"] != "0"
            for pod in pods
        )

    wait_for(gang_deleted, timeout=20, what="every pod of the failed gang deleted")
    status = cluster.status("holder")
    assert status.get("phase") == "Restarting"
    # Its old nodes, less the failed pod's, are held for it while its pods go.
    assert status["heldNodes"] == [nodes["holder-0"]] and status["heldUntil"]
    assert all(not scheduled(cluster, name) for name in waiting), "the admissions were not still queued"
