"""`manifests.workload`: the Workload a queued job asks Kueue for, and what the operator reads back from Kueue."""

from __future__ import annotations

from typing import Any

from paralleljob.manifests import workload as wl
from tests.manifests.helpers import resolve

JOB = {"metadata": {"name": "gpt", "namespace": "research", "uid": "u1", "labels": {wl.QUEUE_LABEL: "team-a"}}}


def test_one_pod_set_of_the_jobs_nodes_with_each_pods_requests_its_queue_and_owner() -> None:
    resolved = resolve(
        template={"resources": {"requests": {"cpu": "8", "memory": "64Gi"}}, "nodeSelector": {"pool": "a"}},
        network={"rdmaResource": {"name": "rdma/ib", "count": 2}},
    )
    pods = wl.pod_count(resolved)
    body = wl.build_workload(JOB, resolved, "team-a", pods or 0, None)
    assert pods == 4  # 2x4x2 = 16 ranks on 4-GPU nodes
    (pod_set,) = body["spec"]["podSets"]
    assert (pod_set["name"], pod_set["count"]) == ("main", 4)
    requests = pod_set["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert requests == {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "4", "rdma/ib": "2"}
    assert pod_set["template"]["spec"]["nodeSelector"] == {"pool": "a"}
    assert body["spec"]["queueName"] == "team-a" and "priorityClassRef" not in body["spec"]
    assert (
        body["metadata"]["ownerReferences"][0] | {"uid": "u1", "controller": True}
        == body["metadata"]["ownerReferences"][0]
    )
    assert body["metadata"]["name"] == "paralleljob-gpt"


def test_a_budget_job_asks_for_its_budgets_nodes_and_a_job_without_gpus_per_node_for_nothing() -> None:
    budget = resolve(parallelism={"gpus": 32}, deepspeed={"train_batch_size": 64})
    assert wl.pod_count(budget) == 8
    budget_without_nodes = resolve(parallelism={"gpus": 32}, deepspeed={"train_batch_size": 64}, gpusPerNode=None)
    assert wl.pod_count(budget_without_nodes) is None


def test_the_priority_is_the_kueue_label_first_then_the_pods_priority_class() -> None:
    resolved = resolve(template={"priorityClassName": "batch-high"})
    labelled = {"metadata": {**JOB["metadata"], "labels": {wl.PRIORITY_LABEL: "training"}}}
    assert wl.priority_source(labelled, resolved) == ("kueue.x-k8s.io", "WorkloadPriorityClass", "training")
    assert wl.priority_source(JOB, resolved) == ("scheduling.k8s.io", "PriorityClass", "batch-high")
    assert wl.priority_source(JOB, resolve()) is None
    body = wl.build_workload(JOB, resolved, "q", 4, wl.Priority("scheduling.k8s.io", "PriorityClass", "batch-high", 7))
    assert body["spec"]["priority"] == 7
    assert body["spec"]["priorityClassRef"] == {
        "group": "scheduling.k8s.io",
        "kind": "PriorityClass",
        "name": "batch-high",
    }


def admitted(**conditions: str) -> dict[str, Any]:
    found = [
        {"type": kind, "status": status, "reason": "R", "message": f"{kind} says"}
        for kind, status in conditions.items()
    ]
    admission = {
        "clusterQueue": "cq",
        "podSetAssignments": [{"name": "main", "flavors": {"nvidia.com/gpu": "h100", "cpu": "h100"}}],
    }
    return {"metadata": {"ownerReferences": [{"uid": "u1"}]}, "status": {"conditions": found, "admission": admission}}


def test_admitted_evicted_and_finished_are_read_from_kueues_conditions() -> None:
    assert wl.admitted(admitted(QuotaReserved="True", Admitted="True"))
    assert not wl.admitted(admitted(QuotaReserved="True", Admitted="False"))
    evicted = admitted(QuotaReserved="True", Admitted="True", Evicted="True")
    assert not wl.admitted(evicted) and wl.eviction(evicted) == ("R", "Evicted says")
    assert wl.flavors(evicted) == ["h100"] and wl.cluster_queue(evicted) == "cq"
    assert wl.waiting_message(admitted(QuotaReserved="False")) == "QuotaReserved says"


def test_giving_the_quota_back_clears_the_admission_and_keeps_kueues_other_conditions() -> None:
    found = admitted(QuotaReserved="True", Admitted="True", Evicted="True", PodsReady="True")
    patch = wl.released_status(found, "Preempted", "preempted by x", requeued=True)
    kinds = {c["type"]: c["status"] for c in patch["conditions"]}
    assert patch["admission"] is None
    assert kinds == {
        "QuotaReserved": "False",
        "Admitted": "False",
        "Evicted": "True",
        "PodsReady": "True",
        "Requeued": "True",
    }
    backoff = wl.released_status(found, "PlacementFailed", "m", requeued=True, requeue_at="2026-12-01T12:01:00Z")
    assert backoff["requeueState"] == {"requeueAt": "2026-12-01T12:01:00Z"}
    finished = wl.finished_status(found, False, "backoffLimit reached")
    assert next(c for c in finished["conditions"] if c["type"] == "Finished")["reason"] == "Failed"


def test_the_admitted_flavours_give_node_labels_and_tolerate_their_taints() -> None:
    taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    flavor = {
        "spec": {
            "nodeLabels": {"pool": "a"},
            "nodeTaints": [taint],
            "tolerations": [{"key": "x", "operator": "Exists"}],
        }
    }
    allowed = wl.placement_of([flavor, {"spec": {}}])
    assert allowed.node_labels == {"pool": "a"}
    assert list(allowed.tolerations) == [{**taint, "operator": "Equal"}, {"key": "x", "operator": "Exists"}]
