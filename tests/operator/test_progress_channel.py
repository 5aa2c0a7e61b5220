"""Rank 0's progress channel cannot steer the operator: what it writes to its progress ConfigMap reaches
status.progress only as validated numbers, and nothing it writes changes the phase, the placement or the
restarts. (Which calls rank 0's token may make at all is the API server's RBAC, see test_progress_hook.py.)"""

from __future__ import annotations

from paralleljob.handlers import progress
from paralleljob.k8s import session as k8s_session
from tests.operator.helpers import job_doc, wait_for

TWO_NODES = {"parallelism": {"pipeline": 2, "tensor": 4, "data": 1}}


def report(cluster, **data: str) -> None:
    """What rank 0's hook does: merge-patch the data of the job's progress ConfigMap."""
    cluster.core.patch_namespaced_config_map("gpt-progress", "research", {"data": data})


def running_job(cluster):
    cluster.add_nodes(2)
    cluster.apply(job_doc(**TWO_NODES))
    wait_for(lambda: len(cluster.pods()) == 2, what="2 pods")
    cluster.bind_all()
    return wait_for(lambda: cluster.status().get("phase") == "Running" and cluster.status(), what="Running")


def test_valid_progress_is_copied_and_bogus_reports_are_dropped_without_reaching_a_decision(cluster, operator):
    before = running_job(cluster)
    pods = [pod["metadata"]["uid"] for pod in cluster.pods()]
    report(cluster, step="10", loss="3.25", tokensPerSecond="12345.6", updated="2026-12-01T08:00:00Z")
    report(cluster, lastCheckpointStep="10")
    status = wait_for(lambda: cluster.status().get("lastCheckpointStep") == 10 and cluster.status(), what="copied")
    # totalSteps is the spec's, not rank 0's.
    assert status["progress"] == {
        "step": 10,
        "totalSteps": 100,
        "loss": 3.25,
        "tokensPerSecond": 12345.6,
        "updated": "2026-12-01T08:00:00Z",
    }
    # Each value wrong in a different way, and keys that look like status fields.
    report(
        cluster,
        step="20",
        loss="NaN",
        tokensPerSecond="-1",
        updated="yesterday",
        lastCheckpointStep="-3",
        phase="Succeeded",
        restarts="0",
        placement="[]",
    )
    status = wait_for(lambda: cluster.status()["progress"]["step"] == 20 and cluster.status(), what="step 20")
    assert status["progress"] == {"step": 20, "totalSteps": 100}  # no stale loss beside the new step
    assert status["lastCheckpointStep"] == 10
    report(cluster, step="x" * 30000, lastCheckpointStep="15")
    status = wait_for(lambda: cluster.status().get("lastCheckpointStep") == 15 and cluster.status(), what="15")
    assert status["progress"]["step"] == 20
    report(cluster, step="1000000", lastCheckpointStep="16")  # past spec.training.steps
    status = wait_for(lambda: cluster.status().get("lastCheckpointStep") == 16 and cluster.status(), what="16")
    assert status["progress"]["step"] == 20
    for field in ("phase", "placement", "restarts", "nodes", "startTime"):
        assert status.get(field) == before.get(field), field
    assert [pod["metadata"]["uid"] for pod in cluster.pods()] == pods
    assert all(pod["status"]["phase"] == "Running" for pod in cluster.pods())


def test_a_report_for_a_job_being_deleted_is_not_copied(cluster, operator):
    """A job another controller holds in deletion (a finalizer of its own) while rank 0 still reports: the copy
    leaves the dying job alone and says so, and the pass that called it goes on (it read `in_place_reported`)."""
    running_job(cluster)
    hold = {"metadata": {"finalizers": ["example.com/hold"]}}
    cluster.custom.patch_namespaced_custom_object("paralleljob.io", "v1alpha1", "research", "paralleljobs", "gpt", hold)
    cluster.custom.delete_namespaced_custom_object("paralleljob.io", "v1alpha1", "research", "paralleljobs", "gpt")
    try:
        report(cluster, step="10", inPlaceRestarts="1")
        session = k8s_session.from_configuration(cluster.core.api_client.configuration)
        copied = progress.copy_progress(session, progress.ProgressKey("research", "gpt"))
        assert (copied.written, copied.in_place_reported) == (False, False)
        assert "progress" not in cluster.status()
    finally:
        release = {"metadata": {"finalizers": None}}
        cluster.custom.patch_namespaced_custom_object(
            "paralleljob.io", "v1alpha1", "research", "paralleljobs", "gpt", release
        )
