"""The test cluster as its administrator sees it through the kubernetes client (`Cluster`): namespaces, GPU Nodes
registered as their kubelets would, ParallelJobs applied and read, pods bound and started as the scheduler and
kubelet would; the job the operator's scenarios and benchmarks run (`job_doc`), and waiting on the API
(`wait_for`). The operator's tests (tests/operator) and the cluster benchmarks (bench/) use it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import kubernetes
import yaml

from testcluster import polling

# A ParallelJob a user could write: the manifests tests resolve it, the operator's scenarios run it at 16 nodes.
JOB_YAML = """
apiVersion: paralleljob.io/v1alpha1
kind: ParallelJob
metadata: {name: gpt, namespace: research}
spec:
  parallelism: {pipeline: 2, tensor: 4, data: 2}
  gpusPerNode: 4
  model: {layers: 8, hiddenSize: 256, attentionHeads: 8, sequenceLength: 128, vocabSize: 512}
  deepspeed: {train_micro_batch_size_per_gpu: 2, gradient_accumulation_steps: 8}
  training: {steps: 100}
  checkpoint:
    volume: {persistentVolumeClaim: {claimName: ckpt}}
    intervalSteps: 10
"""

# The operator's scenarios run the manifests tests' job (JOB_YAML) at 16 nodes: 4x4x4 on
# 4-GPU nodes, with two restarts allowed.
SIXTEEN_NODES = {"parallelism": {"pipeline": 4, "tensor": 4, "data": 4}, "failurePolicy": {"backoffLimit": 2}}


def job_doc(name: str = "gpt", namespace: str = "research", **spec: Any) -> dict[str, Any]:
    doc = yaml.safe_load(JOB_YAML)
    doc["metadata"] = {"name": name, "namespace": namespace}
    doc["spec"].update(SIXTEEN_NODES, **spec)
    return doc


def node_doc(
    name: str,
    gpus: int = 4,
    *,
    ready: bool = True,
    allocatable: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A GPU Node as GPU Feature Discovery labels it."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                "nvidia.com/gpu.memory": "81920",
                **(labels or {}),
            },
        },
        "status": {
            "allocatable": {
                "nvidia.com/gpu": str(gpus),
                "cpu": "96",
                "memory": "1Ti",
                "pods": "110",
                **(allocatable or {}),
            },
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def node_ready(doc: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in doc["status"]["conditions"])


# Two nodes of four GPUs.
TWO_NODES = {"pipeline": 2, "tensor": 4, "data": 1}


def wait_for(predicate: Callable[[], Any], timeout: float = 60, what: str = "condition") -> Any:
    """`testcluster.polling.wait_for`, an API error counting as not yet (the object may not exist yet)."""
    return polling.wait_for(predicate, timeout, what, tolerate=(kubernetes.client.ApiException,))


class Cluster:
    """The test's view of the cluster, through the kubernetes client as the admin (as kubectl would)."""

    def __init__(self, server: Any, namespaces: Sequence[str] = ("research",)) -> None:
        self.server = server
        self.client = kubernetes.config.new_client_from_config(str(server.kubeconfig))
        self.core = kubernetes.client.CoreV1Api(self.client)
        self.custom = kubernetes.client.CustomObjectsApi(self.client)
        for namespace in namespaces:
            self.create_namespace(namespace)

    def create_namespace(self, name: str) -> None:
        """A namespace, once the controller-manager gave it its `default` ServiceAccount: pods are refused
        before that."""
        self.core.create_namespace({"metadata": {"name": name}})
        wait_for(lambda: self.core.read_namespaced_service_account("default", name), what=f"{name}'s ServiceAccount")

    def add_nodes(self, count: int, prefix: str = "gpu-", start: int = 0, **kwargs: Any) -> None:
        """Register Nodes as their kubelets would (the object, then its status). The API server taints every new
        Node not-ready (TaintNodesByCondition); the node-lifecycle controller lifts that from a Ready one, and the
        test plays it."""
        for index in range(start, start + count):
            doc = node_doc(f"{prefix}{index:03d}", **kwargs)
            name = doc["metadata"]["name"]
            self.core.create_node({"metadata": doc["metadata"]})
            self.core.patch_node_status(name, {"status": doc["status"]})
            if node_ready(doc):
                self.core.patch_node(name, {"spec": {"taints": None}})

    def apply(self, doc: dict[str, Any]) -> dict[str, Any]:
        ns = doc["metadata"]["namespace"]
        return self.custom.create_namespaced_custom_object("paralleljob.io", "v1alpha1", ns, "paralleljobs", doc)

    def job(self, name: str = "gpt", namespace: str = "research") -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object("paralleljob.io", "v1alpha1", namespace, "paralleljobs", name)

    def status(self, name: str = "gpt", namespace: str = "research") -> dict[str, Any]:
        return self.job(name, namespace).get("status") or {}

    def pods(self, job: str = "gpt", namespace: str = "research") -> list[dict[str, Any]]:
        client = self.core.api_client
        pods = self.core.list_namespaced_pod(namespace, label_selector=f"paralleljob.io/job={job}").items
        return sorted((client.sanitize_for_serialization(p) for p in pods), key=lambda p: p["metadata"]["name"])

    def set_pod_phase(self, name: str, phase: str, namespace: str = "research", **extra: Any) -> None:
        self.core.patch_namespaced_pod_status(name, namespace, {"status": {"phase": phase, **extra}})

    def bind(self, pod: str, node: str, namespace: str = "research") -> None:
        """What the scheduler does: POST pods/<pod>/binding (spec.nodeName cannot be patched)."""
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod},
            "target": {"kind": "Node", "name": node},
        }
        self.core.create_namespaced_pod_binding(pod, namespace, body, _preload_content=False)

    def bind_all(self, job: str = "gpt", namespace: str = "research", phase: str = "Running") -> None:
        """What the scheduler and kubelet would do: bind each pod to its pinned node and start it."""
        for pod in self.pods(job, namespace):
            if not pod["spec"].get("nodeName"):
                self.bind(pod["metadata"]["name"], pod["metadata"]["labels"]["paralleljob.io/node"], namespace)
            self.set_pod_phase(pod["metadata"]["name"], phase, namespace)

    def start_running(self, pods: int = 16, job: str = "gpt", namespace: str = "research") -> dict[str, Any]:
        """Wait for the job's pods, bind and start them as the scheduler and kubelet would, and wait until the
        job is Running; returns its status."""
        wait_for(lambda: len(self.pods(job, namespace)) == pods, what=f"{pods} pods of {job}")
        self.bind_all(job, namespace)
        return wait_for(
            lambda: self.status(job, namespace).get("phase") == "Running" and self.status(job, namespace),
            what="Running",
        )

    def set_node_ready(self, name: str, ready: bool) -> None:
        status = "True" if ready else "False"
        self.core.patch_node_status(name, {"status": {"conditions": [{"type": "Ready", "status": status}]}})

    def events(self, namespace: str = "research") -> list[dict[str, Any]]:
        client = self.core.api_client
        return [client.sanitize_for_serialization(e) for e in self.core.list_namespaced_event(namespace).items]
