"""The admission queue: waiting jobs are admitted one round at a time in a defined order (restarting jobs
first, then higher PriorityClass value, then earlier creation), admission plans from the watches' caches
without listing every pod, and a gang restart never waits behind admissions and holds its old nodes."""

from __future__ import annotations

import threading
import time
from typing import Any

import kubernetes
import pytest

from paralleljob.handlers.admission_queue import AdmissionQueue, Order
from tests.operator.conftest import Cluster, Operator, job_doc, operator_calls, wait_for

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

    queue: AdmissionQueue[int] = AdmissionQueue(admit, snapshot=lambda: len(admitted))
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
    queue: AdmissionQueue[None] = AdmissionQueue(lambda key, _: None, snapshot=lambda: None)
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

    def admit(key: Any, _: None) -> bool:
        passes.append(key[1])
        if len(passes) == 6:
            six_passes.set()
        if free.is_set() and not admitted:
            admitted.append(key[1])
            return False
        return True  # did not fit: it keeps its place

    queue: AdmissionQueue[None] = AdmissionQueue(admit, snapshot=lambda: None)
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
    queue: AdmissionQueue[None] = AdmissionQueue(lambda key, _: True, snapshot=lambda: None)
    low = Order.of("ns", "low", restarting=False, priority=0, created="2026-01-01T00:00:00Z")
    high = Order.of("ns", "high", restarting=False, priority=10, created="2026-01-01T00:00:00Z")
    queue.offer_all([(("ns", "low"), low), (("ns", "high"), high)])
    assert queue.take_round() == [("ns", "high"), ("ns", "low")]
    queue.settle(("ns", "high"), high, waiting=True)
    queue.settle(("ns", "low"), low, waiting=True)
    queue.offer(("ns", "high"), high)
    assert queue.take_round() == [("ns", "high")]
    queue.offer(("ns", "low"), low)
    assert queue.take_round() == [("ns", "high"), ("ns", "low")]
    queue.settle(("ns", "high"), high, waiting=False)  # admitted, or gone: it leaves the queue
    queue.offer(("ns", "low"), low)
    assert queue.take_round() == [("ns", "low")]
    assert queue.waiting() == [("ns", "low")]
    queue.forget(("ns", "low"))  # deleted while it kept its place
    assert queue.waiting() == []


def cluster_wide_pod_lists(emulator: Any) -> int:
    return sum(1 for call in operator_calls(emulator) if call == ("list", "", "pods", ""))


def cluster_wide_job_lists(emulator: Any) -> int:
    return sum(1 for call in operator_calls(emulator) if call == ("list", "paralleljob.io", "paralleljobs", ""))


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


def test_freed_gpus_go_to_the_first_job_in_order_and_no_admission_lists_every_pod(cluster, operator, emulator):
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

    pod_lists, job_lists = cluster_wide_pod_lists(emulator), cluster_wide_job_lists(emulator)
    # A label change wakes every waiting job: a recheck lists the jobs once, then each waiting job's admission
    # pass lists them (reservations), and none lists the pods of the cluster.
    cluster.core.patch_node("gpu-000", {"metadata": {"labels": {"example.com/relabelled": "true"}}})
    wait_for(lambda: cluster_wide_job_lists(emulator) >= job_lists + 1 + len(waiting), what="admission passes")
    assert cluster_wide_pod_lists(emulator) == pod_lists

    # From here every list of the jobs takes 3 s, so that the recheck that the holder's end requests offers
    # the waiting jobs late; meanwhile the last job in order is offered alone (any change of it brings a pass)
    # and its admission pass sees the freed GPUs. They must still go to the first job in order.
    emulator.emulator.latency[("list", "paralleljobs")] = 3.0
    cluster.set_pod_phase("holder-0", "Succeeded")
    wait_for(lambda: cluster.status("holder").get("phase") == "Succeeded", what="the holder's end")
    finished = lambda: all(pod["status"].get("phase") == "Succeeded" for pod in cluster.pods("holder"))  # noqa: E731
    wait_for(finished, what="the holder's last running pod gone")
    touch = {"metadata": {"annotations": {"example.com/touched": "true"}}}
    cluster.custom.patch_namespaced_custom_object(
        "paralleljob.io", "v1alpha1", "research", "paralleljobs", "a-default-oldest", touch
    )
    started = lambda: [name for name in waiting if len(cluster.pods(name)) == 2]  # noqa: E731
    assert wait_for(started, timeout=30, what="a waiting job started") == ["c-high-older"]
    for name in ("a-default-oldest", "b-high-newer"):
        assert cluster.pods(name) == []
        assert scheduled(cluster, name).get("reason") == "Unschedulable"


def test_a_gang_restart_does_not_wait_behind_admissions(cluster, operator, emulator):
    cluster.add_nodes(2)
    run_holder(cluster)
    # From here every admission pass hangs for half a minute on its read of the other jobs' reservations;
    # a restart reads none, so it must go through while the admissions queue up.
    emulator.emulator.latency[("list", "paralleljobs")] = 30.0
    job_lists = cluster_wide_job_lists(emulator)
    waiting = [f"waiting-{i}" for i in range(8)]  # more than asyncio's default thread pool has threads
    for name in waiting:
        cluster.apply(job_doc(name, parallelism=TWO_NODES))
    wait_for(lambda: cluster_wide_job_lists(emulator) > job_lists, what="an admission under way")
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
