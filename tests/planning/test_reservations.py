"""`planning.job_reservations`: GPUs other ParallelJobs' placements hold before their pods are bound, and
the old nodes a restarting gang holds for its grace period.

A table of ParallelJob and Pod dicts as the API returns them, and the reservations they make; then the live
path of `paralleljob plan`, which reads ParallelJobs as well as Nodes and Pods, from an API server's canned
answers (kmock): what is read, not how a server stores it, is under test here.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import kmock
import pytest

from paralleljob import cli, planning
from paralleljob.api import types as api_types
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


def live_cluster(server: kmock.RawHandler, folder: Path, jobs: list[dict[str, Any]] | None) -> str:
    """An API server's canned answers to what `paralleljob plan` reads, and a kubeconfig for it: one 8-GPU Node,
    no bound pod, and these ParallelJobs (None: the CRD is not installed, so their list is a 404)."""
    server["get /api/v1/nodes"] << {"kind": "NodeList", "metadata": {}, "items": [clusters.node("n0")]}
    server["get /api/v1/pods"] << {"kind": "PodList", "metadata": {}, "items": []}
    everywhere = f"get /apis/{api_types.GROUP}/{api_types.VERSION}/{api_types.PLURAL}"
    if jobs is None:
        server[everywhere] << 404 << {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404}
    else:
        server[everywhere] << {"kind": "ParallelJobList", "metadata": {}, "items": jobs}
    kubeconfig = folder / "kubeconfig"
    cluster = {"name": "canned", "cluster": {"server": str(server.url)}}
    context = {"name": "canned", "context": {"cluster": "canned", "user": "admin"}}
    users = [{"name": "admin", "user": {"token": "canned"}}]
    config = {"apiVersion": "v1", "kind": "Config", "clusters": [cluster], "contexts": [context], "users": users}
    kubeconfig.write_text(json.dumps({**config, "current-context": "canned"}))
    return str(kubeconfig)


async def plan_live(job: Path, kubeconfig: str, *args: str) -> int:
    """`paralleljob plan` against the live cluster, in a thread: kmock answers on this test's event loop."""
    return await asyncio.to_thread(cli.main, ["plan", str(job), "--kubeconfig", kubeconfig, *args])


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


@pytest.mark.asyncio
@pytest.mark.kmock(cls=kmock.RawHandler)
async def test_the_live_path_subtracts_other_jobs_placements_not_yet_bound(
    kmock: kmock.RawHandler, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "job.yaml").write_text(JOB)
    kubeconfig = live_cluster(kmock, tmp_path, [parallel_job("gpt", ("n0", "gpt-0"))])
    assert await plan_live(tmp_path / "job.yaml", kubeconfig) == 1
    assert "0 qualify: 1 has GPUs in use by ParallelJob research/gpt" in capsys.readouterr().out


@pytest.mark.asyncio
@pytest.mark.kmock(cls=kmock.RawHandler)
async def test_the_live_path_plans_when_the_crd_is_not_installed(
    kmock: kmock.RawHandler, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "job.yaml").write_text(JOB)
    kubeconfig = live_cluster(kmock, tmp_path, jobs=None)
    assert await plan_live(tmp_path / "job.yaml", kubeconfig, "-o", "json") == 0
    assert json.loads(capsys.readouterr().out)["nodes"][0]["node"] == "n0"
