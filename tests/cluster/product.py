"""The product installed on the strict cluster as a user installs it: the chart's CRD and RBAC from `helm template`
applied with the real kubectl, fake GPU nodes, a checkpoint PVC, and the real operator process running as the
chart's ServiceAccount; pods are scheduled and run as processes (Scheduler, ProcessKubelet).

Used by the end-to-end test (tests/cluster/test_whole_product.py) and by `make cluster-demo`.
"""

from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.chart.conftest import RELEASE_NAMESPACE, REPO, only, render, render_text, tool
from tests.cluster.apiserver import ClusterThread
from tests.cluster.kubelet import ProcessKubelet
from tests.cluster.scheduler import Scheduler
from tests.operator.conftest import Operator

JOB = "quickstart"
TOTAL_STEPS, CHECKPOINT_EVERY = 24, 8
CLAIM = "quickstart-checkpoints"


def gpu_nodes(count: int = 2) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": f"gpu-{i}",
                "labels": {"kubernetes.io/hostname": f"gpu-{i}", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            },
            "status": {
                "allocatable": {"nvidia.com/gpu": "4", "cpu": "64", "memory": "512Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
        for i in range(count)
    ]


PVC = {
    "apiVersion": "v1",
    "kind": "PersistentVolumeClaim",
    "metadata": {"name": CLAIM, "namespace": "default"},
    "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
}


def cluster_quickstart(steps: int = TOTAL_STEPS, checkpoint_every: int = CHECKPOINT_EVERY) -> dict[str, Any]:
    job = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    job["spec"]["training"]["data"] = {"source": "synthetic"}
    job["spec"]["checkpoint"]["volume"] = {"persistentVolumeClaim": {"claimName": CLAIM}}
    # Shorter than the example's 60 steps, to keep CI's time: a checkpoint every 8 steps, 24 steps in all.
    job["spec"]["training"]["steps"] = steps
    job["spec"]["checkpoint"]["intervalSteps"] = checkpoint_every
    return job


class Kubectl:
    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig

    def __call__(self, *args: str, stdin: str | None = None) -> str:
        completed = subprocess.run(
            [tool("kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert completed.returncode == 0, f"kubectl {' '.join(args)}: {completed.stderr}"
        return completed.stdout

    def apply(self, *docs: dict[str, Any]) -> None:
        # --validate=false: the test server serves no OpenAPI documents; it validates every object itself.
        self("apply", "--validate=false", "-f", "-", stdin="\n---\n".join(json.dumps(d) for d in docs))

    def job_row(self) -> dict[str, str]:
        """`kubectl get pj` as a user reads it: header -> cell (cells are cut at the header's columns, since
        an empty cell prints as blanks)."""
        header, row = self("get", "pj", JOB).splitlines()
        starts = [i for i, c in enumerate(header) if c != " " and (i == 0 or header[i - 1] == " ")]
        ends = [*starts[1:], None]
        return {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, ends, strict=True)}


class Product:
    """The strict cluster with the chart installed and the operator running, in `workdir`."""

    def __init__(self, workdir: Path, nodes: int = 2) -> None:
        self.workdir, self.nodes = workdir, nodes
        kubelet = functools.partial(ProcessKubelet, root=workdir / "kubelet")
        self.cluster = ClusterThread(workdir, crds=(), components=[Scheduler, kubelet])
        self.operator: Operator | None = None
        self.log = workdir / "operator.log"

    def start(self) -> Product:
        self.cluster.start()
        self.kubectl = Kubectl(self.cluster.kubeconfig)
        self.kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": RELEASE_NAMESPACE}})
        self.kubectl("apply", "--validate=false", "-f", "-", stdin=render_text())
        self.kubectl.apply(*gpu_nodes(self.nodes), PVC)
        account = only(render(), "ServiceAccount")["metadata"]
        as_operator = self.cluster.kubeconfig_for(account["namespace"], account["name"])
        self.operator = Operator(self.cluster, self.log, as_operator).start()
        return self

    def stop(self) -> None:
        if self.operator is not None:
            self.operator.stop()
        self.cluster.stop()

    def checkpoints(self) -> Path:
        """The job's own checkpoint folder: `<namespace>/<name>` inside the claim's folder (the process kubelet's
        folder for the claim), as the operator gives every job a folder of its own on a shared volume."""
        return self.workdir / "kubelet" / "pvc" / "default" / CLAIM / "default" / JOB
