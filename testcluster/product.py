"""The product installed on the upstream test cluster as a user installs it: a cluster of its own
(`testcluster.cluster`) with the chart installed by `helm install`, whose operator Deployment the real
controller-manager and scheduler turn into a pod that the process kubelet runs.

Used by the whole-product test (tests/upstream/test_whole_product.py), the DP shrink test (test_data_shrink.py)
and `make cluster-demo`.
"""

from __future__ import annotations

import contextlib
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

from testcluster import cluster as upstream_cluster
from testcluster import controlplane
from testcluster.api import CHART, RELEASE, RELEASE_NAMESPACE, REPO, Api, Tool
from testcluster.quickstart import CLAIM, JOB

CORPUS_CLAIM = "quickstart-corpus"


class Product:
    """A cluster of its own (two 4-GPU nodes unless told) with the chart installed by helm, in `folder`."""

    def __init__(self, folder: Path, nodes: int = 2, gpus_per_node: int = 4, network_namespaces: bool = False) -> None:
        self.cluster = upstream_cluster.up(
            folder / "cluster", nodes=nodes, gpus_per_node=gpus_per_node, network_namespaces=network_namespaces
        )
        self.kubectl = Tool("kubectl", self.cluster.kubeconfig)
        self.helm = Tool("helm", self.cluster.kubeconfig)
        self.admin = Api(self.cluster.state, self.cluster.state.tokens["admin"])

    @classmethod
    @contextlib.contextmanager
    def running(
        cls, folder: Path, nodes: int = 2, gpus_per_node: int = 4, network_namespaces: bool = False
    ) -> Iterator[Product]:
        """A product for one test, stopped afterwards whatever the test did; `network_namespaces`: each pod in a
        network namespace of its own (testcluster/podnet.py)."""
        made = cls(folder, nodes, gpus_per_node, network_namespaces)
        try:
            yield made
        finally:
            made.stop()

    def install(self, *values: str) -> None:
        """`helm install` of the chart with free ports and `values` (NAME=VALUE, as --set takes them)."""
        # Pods of the process kubelet share the machine's network, where another test's operator may hold the
        # chart's default ports: this one gets free ports (on a cluster each pod has its own network).
        ports = [f"operator.healthPort={controlplane.free_port()}", f"metrics.port={controlplane.free_port()}"]
        self.helm(
            "install", RELEASE, str(CHART), "-n", RELEASE_NAMESPACE, "--create-namespace",
            "--set", ",".join([*ports, *values]),
        )  # fmt: skip
        self.kubectl(
            "rollout", "status", "-n", RELEASE_NAMESPACE, f"deployment/{RELEASE}-paralleljob-operator", "--timeout=120s"
        )

    def job_row(self) -> dict[str, str]:
        """`kubectl get pj` as a user reads it: header -> cell, cut at the header's columns."""
        header, row = self.kubectl("get", "pj", JOB).splitlines()
        starts = [i for i, c in enumerate(header) if c != " " and (i == 0 or header[i - 1] == " ")]
        return {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)}

    def pod_folder(self, namespace: str, prefix: str) -> Path:
        found = [f for f in self.cluster.container_folders() if f.name.startswith(f"{namespace}_{prefix}")]
        assert found, f"no pod folder {namespace}_{prefix}*"
        return found[-1]

    def rank_pid(self, pod: str, rank: int, namespace: str = "default") -> int | None:
        """A rank's pid in the pod's first generation (the process kubelet runs pods as processes of this machine),
        from the line its node supervisor prints; None until it has printed it."""
        log = (self.pod_folder(namespace, pod) / "container.log").read_text(errors="replace")
        for match in re.finditer(r"generation 0 ranks started \(rank=pid\): (.*)", log):
            pids = dict(pair.split("=") for pair in match[1].split())
            if str(rank) in pids:
                return int(pids[str(rank)])
        return None

    def corpus_folder(self, namespace: str = "default") -> Path:
        """The corpus claim's folder (the kubelet's folder for the claim), where a user's data set goes."""
        return self.cluster.folder / "kubelet" / "pvc" / namespace / CORPUS_CLAIM

    def fill_corpus(self, namespace: str = "default", text: Path | None = None) -> Path:
        """Put this repository's Python sources (the corpus `paralleljob run` reads for the quickstart), or the
        one file `text`, in the corpus claim's folder, as a user copies a data set onto a shared volume."""
        folder = self.corpus_folder(namespace)
        shutil.rmtree(folder, ignore_errors=True)
        if text is None:
            shutil.copytree(REPO / "operator" / "paralleljob", folder, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            folder.mkdir(parents=True)
            shutil.copy(text, folder / text.name)
        return folder

    def checkpoints(self) -> Path:
        """The job's own folder inside the claim's folder (the kubelet's folder for the claim)."""
        return self.cluster.folder / "kubelet" / "pvc" / "default" / CLAIM / "default" / JOB

    def operator_log(self) -> str:
        return (self.pod_folder(RELEASE_NAMESPACE, f"{RELEASE}-paralleljob-operator") / "container.log").read_text()

    def what_was_seen(self) -> str:
        tails = [
            f"--- {f.name}:\n{(f / 'container.log').read_text(errors='replace')[-1500:]}"
            for f in self.cluster.container_folders()
            if (f / "container.log").exists()
        ]
        return "\n".join([self.kubectl("get", "pj,pods", "-A", "-o", "wide"), *tails])

    def stop(self) -> None:
        upstream_cluster.down(self.cluster.folder)
