"""Gang admission: a job that does not fit waits with the planner's reason; jobs never share a GPU."""

from __future__ import annotations

import collections

from tests.operator.helpers import gpus_oversubscribed, job_doc, wait_for


def test_job_that_does_not_fit_waits_with_the_reason_and_starts_when_nodes_arrive(cluster, operator):
    cluster.add_nodes(10)
    cluster.apply(job_doc())
    status = wait_for(lambda: cluster.status().get("phase") == "Pending" and cluster.status(), what="Pending")
    scheduled = {c["type"]: c for c in status["conditions"]}["Scheduled"]
    assert scheduled["status"] == "False"
    assert scheduled["reason"] == "Unschedulable"
    assert "16" in scheduled["message"]
    assert cluster.pods() == []
    cluster.add_nodes(6, start=10)
    wait_for(lambda: len(cluster.pods()) == 16, what="pods after nodes were added")


def test_two_jobs_competing_never_oversubscribe_and_the_second_waits(cluster, operator, apiserver):
    cluster.add_nodes(20)
    cluster.apply(job_doc("first"))
    cluster.apply(job_doc("second"))

    def settled():
        phases = {n: (cluster.status(n).get("conditions") or []) for n in ("first", "second")}
        scheduled = {n: {c["type"]: c for c in conds}.get("Scheduled", {}) for n, conds in phases.items()}
        return sorted(str(s.get("status")) for s in scheduled.values()) == ["False", "True"] and scheduled

    scheduled = wait_for(settled, what="one admitted, one waiting")
    waiting = next(n for n, c in scheduled.items() if c["status"] == "False")
    running = "first" if waiting == "second" else "second"
    wait_for(lambda: len(cluster.pods(running)) == 16, what="the admitted job's pods")
    assert cluster.pods(waiting) == []
    per_node = collections.Counter()
    for pod in cluster.pods(running) + cluster.pods(waiting):
        per_node[pod["metadata"]["labels"]["paralleljob.io/node"]] += 4
    assert max(per_node.values()) <= 4
    assert gpus_oversubscribed(apiserver) == []


def test_a_waiting_job_starts_when_the_job_holding_the_gpus_finishes(cluster, operator, apiserver):
    cluster.add_nodes(16)
    cluster.apply(job_doc("first"))
    wait_for(lambda: len(cluster.pods("first")) == 16, what="the first job's pods")
    cluster.bind_all("first")
    wait_for(lambda: cluster.status("first").get("phase") == "Running", what="the first job running")
    cluster.apply(job_doc("second"))
    status = wait_for(lambda: cluster.status("second").get("phase") == "Pending" and cluster.status("second"))
    assert {c["type"]: c["reason"] for c in status["conditions"]}["Scheduled"] == "Unschedulable"
    # No Node changes from here on: only the first job's pods going away can wake the second.
    cluster.set_pod_phase("first-0", "Succeeded")
    wait_for(lambda: cluster.status("first").get("phase") == "Succeeded", what="the first job done")
    wait_for(lambda: len(cluster.pods("second")) == 16, timeout=20, what="the second job's pods")
    assert gpus_oversubscribed(apiserver) == []
