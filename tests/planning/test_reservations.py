"""`planning.job_reservations`: GPUs other ParallelJobs' placements hold before their pods are bound, and
the old nodes a restarting gang holds for its grace period.

A table of ParallelJob and Pod dicts as the API returns them, and the reservations they make; then the live
path of `paralleljob plan`, which reads ParallelJobs as well as Nodes and Pods.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
import yaml

from paralleljob import cli, planning
from paralleljob.api import types as api_types
from paralleljob.planning import Reservation
from tests.cluster.apiserver import ClusterThread
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
            "placement": [
                {"nodeRank": i, "node": node, "pod": pod, "ranks": f"{8 * i}-{8 * i + 7}"}
                for i, (node, pod) in enumerate(placed)
            ],
        },
    }


def restarting_job(name: str, *held: str, until: str) -> dict[str, Any]:
    status = {"phase": "Restarting", "gpusPerNode": 8, "restarts": 1, "heldNodes": list(held), "heldUntil": until}
    return {"kind": "ParallelJob", "metadata": {"name": name, "namespace": "research"}, "status": status}


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
    "a restarting gang holds its old nodes until heldUntil": (
        [restarting_job("gpt", "n0", "n1", until="2999-01-01T00:00:00Z")],
        [],
        [Reservation("n0", 8, "research/gpt"), Reservation("n1", 8, "research/gpt")],
    ),
    "a restarting gang's hold that ran out holds nothing": (
        [restarting_job("gpt", "n0", "n1", until="2020-01-01T00:00:00Z")],
        [],
        [],
    ),
    "a restarting gang does not hold against itself": (
        [restarting_job("self", "n0", until="2999-01-01T00:00:00Z")],
        [],
        [],
    ),
}


@pytest.mark.parametrize(("jobs", "pods", "expected"), CASES.values(), ids=CASES.keys())
def test_job_reservations(jobs: list[dict[str, Any]], pods: list[dict[str, Any]], expected: list[Reservation]) -> None:
    assert planning.job_reservations(jobs, pods, exclude=("research", "self")) == expected


@contextlib.contextmanager
def live_cluster(tmp_path: Any, with_crd: bool = True) -> Iterator[dict[str, Any]]:
    """The strict cluster's API server (with or without the ParallelJob CRD installed); the test fills it through
    the kubernetes client, as kubectl would."""
    server = ClusterThread(tmp_path) if with_crd else ClusterThread(tmp_path, crds=())
    server.start()
    client = kubernetes.config.new_client_from_config(str(server.kubeconfig))
    kubernetes.client.CoreV1Api(client).create_namespace({"metadata": {"name": "research"}})
    try:
        yield {
            "kubeconfig": str(server.kubeconfig),
            "core": kubernetes.client.CoreV1Api(client),
            "custom": kubernetes.client.CustomObjectsApi(client),
        }
    finally:
        server.stop()


def add_job_with_placement(live: dict[str, Any], job: dict[str, Any]) -> None:
    """Create a ParallelJob, then write its status through the status subresource, as the operator does."""
    args = (api_types.GROUP, api_types.VERSION, job["metadata"]["namespace"], api_types.PLURAL)
    spec = yaml.safe_load(JOB)["spec"]
    live["custom"].create_namespaced_custom_object(
        *args, {**job, "apiVersion": api_types.API_VERSION, "status": {}, "spec": spec}
    )
    live["custom"].patch_namespaced_custom_object_status(*args, job["metadata"]["name"], {"status": job["status"]})


JOB = """apiVersion: paralleljob.io/v1alpha1
kind: ParallelJob
metadata: {name: small, namespace: research}
spec:
  parallelism: {pipeline: 1, tensor: 8, data: 1}
  model: {layers: 8, hiddenSize: 512, attentionHeads: 8, sequenceLength: 512, vocabSize: 1024}
  deepspeed: {train_micro_batch_size_per_gpu: 1, gradient_accumulation_steps: 16}
  training: {steps: 10}
  checkpoint: {intervalSteps: 5, volume: {persistentVolumeClaim: {claimName: checkpoints}}}
"""


def test_the_live_path_subtracts_other_jobs_placements_not_yet_bound(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "job.yaml").write_text(JOB)
    with live_cluster(tmp_path) as live:
        live["core"].create_node(clusters.node("n0"))
        add_job_with_placement(live, parallel_job("gpt", ("n0", "gpt-0")))
        code = cli.main(["plan", str(tmp_path / "job.yaml"), "--kubeconfig", live["kubeconfig"]])
    assert code == 1
    assert "0 qualify: 1 has GPUs in use by ParallelJob research/gpt" in capsys.readouterr().out


def test_the_live_path_plans_when_the_crd_is_not_installed(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "job.yaml").write_text(JOB)
    with live_cluster(tmp_path, with_crd=False) as live:
        live["core"].create_node(clusters.node("n0"))
        code = cli.main(["plan", str(tmp_path / "job.yaml"), "--kubeconfig", live["kubeconfig"], "-o", "json"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["nodes"][0]["node"] == "n0"
