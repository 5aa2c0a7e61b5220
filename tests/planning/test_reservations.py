"""`planning.job_reservations`: GPUs other ParallelJobs' placements hold before their pods are bound.

A table of ParallelJob and Pod dicts as the API returns them, and the reservations they make; then the live
path of `paralleljob plan`, which reads ParallelJobs as well as Nodes and Pods.
"""

from __future__ import annotations

from typing import Any

import pytest

from paralleljob import cli, planning
from paralleljob.planning import Reservation
from tests.planning import clusters


def parallel_job(
    name: str, *placed: tuple[str, str], phase: str = "Pending", namespace: str = "research"
) -> dict[str, Any]:
    return {
        "kind": "ParallelJob",
        "metadata": {"name": name, "namespace": namespace},
        "status": {
            "phase": phase,
            "gpusPerNode": 8,
            "placement": [{"nodeRank": i, "node": node, "pod": pod} for i, (node, pod) in enumerate(placed)],
        },
    }


CASES = {
    "unbound pods reserve their nodes": (
        [parallel_job("gpt", ("n0", "gpt-0"), ("n1", "gpt-1"))],
        [],
        [Reservation("n0", 8, "research/gpt"), Reservation("n1", 8, "research/gpt")],
    ),
    "a bound pod counts through itself": (
        [parallel_job("gpt", ("n0", "gpt-0"), ("n1", "gpt-1"))],
        [clusters.pod("gpt-0", "n0", 8)],
        [Reservation("n1", 8, "research/gpt")],
    ),
    "a pod of the same name in another namespace is not this job's": (
        [parallel_job("gpt", ("n0", "gpt-0"), namespace="team-b")],
        [clusters.pod("gpt-0", "n0", 8)],
        [Reservation("n0", 8, "team-b/gpt")],
    ),
    "finished jobs hold nothing": ([parallel_job("gpt", ("n0", "gpt-0"), phase="Succeeded")], [], []),
    "jobs without a placement hold nothing": ([{"kind": "ParallelJob", "metadata": {"name": "new"}}], [], []),
    "the job being planned is excluded": ([parallel_job("self", ("n0", "self-0"))], [], []),
    "a job listed twice counts once": (
        [parallel_job("gpt", ("n0", "gpt-0")), parallel_job("gpt", ("n0", "gpt-0"))],
        [],
        [Reservation("n0", 8, "research/gpt")],
    ),
}


@pytest.mark.parametrize(("jobs", "pods", "expected"), CASES.values(), ids=CASES.keys())
def test_job_reservations(jobs: list[dict[str, Any]], pods: list[dict[str, Any]], expected: list[Reservation]) -> None:
    assert planning.job_reservations(jobs, pods, exclude=("research", "self")) == expected


class FakeApiException(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"({status})")
        self.status = status


class FakeList:
    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items


@pytest.fixture
def live_cluster(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The kubernetes client's calls the live path makes, answered from a dict the test fills in."""
    kubernetes = pytest.importorskip("kubernetes")
    world: dict[str, Any] = {"nodes": [], "pods": [], "jobs": []}
    core = type(
        "Core",
        (),
        {
            "list_node": lambda self: FakeList(world["nodes"]),
            "list_pod_for_all_namespaces": lambda self, field_selector: FakeList(world["pods"]),
        },
    )

    def list_jobs(self: object, group: str, version: str, plural: str) -> dict[str, Any]:
        assert (group, version, plural) == ("paralleljob.io", "v1alpha1", "paralleljobs")
        if world["jobs"] is None:
            raise FakeApiException(404)
        return {"items": world["jobs"]}

    monkeypatch.setattr(kubernetes.config, "load_kube_config", lambda: None)
    monkeypatch.setattr(kubernetes.client, "CoreV1Api", core)
    monkeypatch.setattr(
        kubernetes.client, "CustomObjectsApi", type("Custom", (), {"list_cluster_custom_object": list_jobs})
    )
    monkeypatch.setattr(kubernetes.client.ApiClient, "sanitize_for_serialization", lambda self, obj: obj)
    monkeypatch.setattr(kubernetes.client.exceptions, "ApiException", FakeApiException)
    return world


JOB = """apiVersion: paralleljob.io/v1alpha1
kind: ParallelJob
metadata: {name: small, namespace: research}
spec:
  parallelism: {pipeline: 1, tensor: 8, data: 1}
  model: {layers: 8, hiddenSize: 512, attentionHeads: 8, sequenceLength: 512, vocabSize: 1024}
  deepspeed: {train_micro_batch_size_per_gpu: 1, gradient_accumulation_steps: 16}
  training: {steps: 10}
  checkpoint: {intervalSteps: 5}
"""


def test_the_live_path_subtracts_other_jobs_placements_not_yet_bound(
    live_cluster: dict[str, Any], tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "job.yaml").write_text(JOB)
    live_cluster["nodes"] = [clusters.node("n0")]
    live_cluster["jobs"] = [parallel_job("gpt", ("n0", "gpt-0"))]
    assert cli.main(["plan", str(tmp_path / "job.yaml")]) == 1
    assert "0 qualify: 1 has GPUs in use by ParallelJob research/gpt" in capsys.readouterr().out


def test_the_live_path_plans_when_the_crd_is_not_installed(
    live_cluster: dict[str, Any], tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "job.yaml").write_text(JOB)
    live_cluster["nodes"] = [clusters.node("n0")]
    live_cluster["jobs"] = None
    assert cli.main(["plan", str(tmp_path / "job.yaml"), "-o", "json"]) == 0
