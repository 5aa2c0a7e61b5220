"""A reconcile pass that keeps failing says so on the job: condition Reconciled=False with the error, one
Warning Event, exponential backoff; and Reconciled=True once a pass succeeds again."""

from __future__ import annotations

import time

from tests.operator.helpers import job_doc, wait_for


def reconciled(cluster):
    return {c["type"]: c for c in cluster.status().get("conditions", [])}.get("Reconciled")


def test_a_pass_that_keeps_failing_becomes_a_condition_and_one_event(cluster, operator, apiserver):
    cluster.add_nodes(16)
    apiserver.rejects["configmaps"] = (500, "InternalError", "etcdserver: request timed out")
    cluster.apply(job_doc())
    condition = wait_for(lambda: reconciled(cluster), timeout=30, what="Reconciled condition")
    assert (condition["status"], condition["reason"]) == ("False", "ReconcileError")
    assert "500" in condition["message"]
    time.sleep(4)  # more failed passes (1 s, 2 s, 4 s apart): still one Event
    assert len([e for e in cluster.events() if e["reason"] == "ReconcileError"]) == 1
    apiserver.rejects.clear()
    wait_for(lambda: len(cluster.pods()) == 16, timeout=30, what="pods once the API recovers")
    condition = wait_for(lambda: reconciled(cluster)["status"] == "True" and reconciled(cluster), what="recovered")
    assert condition["reason"] == "Reconciled"
