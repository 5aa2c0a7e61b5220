"""Status is the operator's output, never its input: whoever may patch `paralleljobs/status` (an administrator, a
mis-granted tool) changes what people read, never what the operator decides. Reservations, holds, restarts,
start and completion come from the attempt records in the jobs' `<job>-config` ConfigMaps, which only the
operator writes; a status someone else changed is written over by the next pass."""

from __future__ import annotations

import datetime

import pytest

from tests.operator.helpers import Operator, finish_operator_passes, install_operator_rbac, job_doc, wait_for

TWO_NODES = {"pipeline": 2, "tensor": 4, "data": 1}
VERDICTS = ("Admitted", "Placed", "Unschedulable")


@pytest.fixture
def operator(apiserver, cluster, tmp_path):
    """The operator of a team's release: it manages `research` only (the chart's RBAC for that namespace), so
    the squatting job below is another team's."""
    kubeconfig = install_operator_rbac(apiserver, cluster.client, ("research",))
    process = Operator(apiserver, tmp_path / "operator.log", kubeconfig, [*Operator.ARGS, "--namespace", "research"])
    yield process.start()
    process.stop()


def patch_status(cluster, name: str, namespace: str, status: dict) -> None:
    cluster.custom.patch_namespaced_custom_object_status(
        "paralleljob.io", "v1alpha1", namespace, "paralleljobs", name, {"status": status}
    )


def scheduled(cluster, name: str = "gpt", namespace: str = "research") -> str | None:
    found = {c["type"]: c for c in cluster.status(name, namespace).get("conditions") or []}.get("Scheduled") or {}
    return found.get("reason") if found.get("reason") in VERDICTS else None


IN_AN_HOUR = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
PLACEMENT = [
    {
        "nodeRank": rank,
        "node": f"gpu-00{rank}",
        "ranks": f"{4 * rank}-{4 * rank + 3}",
        "stages": [rank],
        "pod": f"x-{rank}",
    }
    for rank in range(2)
]
SQUATS = {
    "placement": {"phase": "Pending", "gpusPerNode": 4, "placement": PLACEMENT},
    "held-nodes": {
        "phase": "Restarting",
        "gpusPerNode": 4,
        "heldNodes": ["gpu-000", "gpu-001"],
        "heldUntil": IN_AN_HOUR,
    },
}


@pytest.mark.parametrize("squat", SQUATS.values(), ids=SQUATS.keys())
def test_a_status_patched_to_hold_nodes_reserves_nothing(cluster, operator, squat):
    cluster.add_nodes(2)
    cluster.create_namespace("other-team")
    cluster.apply(job_doc("squatter", "other-team", parallelism=TWO_NODES))
    patch_status(cluster, "squatter", "other-team", squat)
    cluster.apply(job_doc(parallelism=TWO_NODES))
    assert wait_for(lambda: scheduled(cluster), what="the job's verdict") != "Unschedulable", cluster.status()
    wait_for(lambda: len(cluster.pods()) == 2, what="the job's pods on the nodes the status named")


def test_a_status_patched_back_to_pending_neither_restarts_the_clock_nor_repeats_started(cluster, operator):
    cluster.add_nodes(16)
    cluster.apply(job_doc())
    started = cluster.start_running()["startTime"]
    patch_status(cluster, "gpt", "research", {"phase": "Pending", "startTime": None})
    finish_operator_passes(cluster)
    status = cluster.status()
    assert (status["phase"], status.get("startTime")) == ("Running", started)
    assert len([e for e in cluster.events() if e["reason"] == "Started"]) == 1


def test_a_waiting_job_whose_status_says_failed_is_still_admitted(cluster, operator):
    cluster.apply(job_doc())
    wait_for(lambda: scheduled(cluster) == "Unschedulable", what="the job waiting for nodes")
    patch_status(cluster, "gpt", "research", {"phase": "Failed"})
    cluster.add_nodes(16)
    wait_for(lambda: len(cluster.pods()) == 16, what="the job's pods once the nodes came")
