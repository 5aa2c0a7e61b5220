"""Synthetic GPU clusters for examples, tests and benchmarks: Node dicts as `kubectl get nodes -o yaml`
prints them, and optionally bound Pods that hold some GPUs (a fragmented cluster).

Nodes are spread evenly over leaves and leaves over blocks; names are random (seeded) so that name order,
which a topology-oblivious scheduler follows, says nothing about the fabric, as in real clouds.
`paralleljob cluster synth` prints these; the tests and `bench/planner_*.py` call `synth_cluster()`.
"""

from __future__ import annotations

import dataclasses
import random
import re
from typing import Any

from paralleljob.planning.inventory import GPU_RESOURCE, MEMORY_LABEL, PRODUCT_LABEL

DEFAULT_PRODUCT = "NVIDIA-A100-SXM4-80GB"
# (block level, leaf level) label keys per family; see docs/planning.md "Network levels".
LABEL_FAMILIES = {
    "nvidia": ("network.topology.nvidia.com/spine", "network.topology.nvidia.com/leaf"),
    "gke": ("cloud.google.com/gce-topology-block", "cloud.google.com/gce-topology-subblock"),
    "eks": ("topology.k8s.aws/network-node-layer-2", "topology.k8s.aws/network-node-layer-3"),
}


@dataclasses.dataclass(frozen=True)
class SynthSpec:
    """What `paralleljob cluster synth` was asked for."""

    nodes: int
    gpus_per_node: int
    leaves: int = 1
    blocks: int = 1
    gpu_product: str = DEFAULT_PRODUCT
    busy: float = 0.0  # probability that a node runs a pod holding half or all of its GPUs
    seed: int = 0
    family: str = "nvidia"
    namespace: str = "research"


def synth_cluster(spec: SynthSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(Node dicts, bound Pod dicts) of a cluster as `spec` describes it."""
    rng = random.Random(spec.seed)
    names = _node_names(rng, spec.nodes)
    nodes = [_node(spec, name, i) for i, name in enumerate(names)]
    pods = [_pod(spec, rng, name) for name in names if spec.busy and rng.random() < spec.busy]
    return nodes, pods


def gpu_memory_mib(product: str) -> int:
    """MiB per GPU read from a product name such as NVIDIA-A100-SXM4-40GB (80 GiB when it says nothing)."""
    found = re.search(r"(\d+)GB", product.upper())
    return int(found.group(1)) * 1024 if found else 80 * 1024


def node_list(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "NodeList", "items": items}


def pod_list(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": items}


def _node_names(rng: random.Random, count: int) -> list[str]:
    # Random names: their order says nothing about the leaf a node sits under.
    names: list[str] = []
    seen: set[str] = set()
    while len(names) < count:
        name = f"gpu-{rng.getrandbits(32):08x}"
        if name not in seen:
            seen.add(name)
            names.append(name)
    return names


def _node(spec: SynthSpec, name: str, index: int) -> dict[str, Any]:
    leaf = index * spec.leaves // spec.nodes
    block = leaf * spec.blocks // spec.leaves
    block_key, leaf_key = LABEL_FAMILIES[spec.family]
    labels = {
        "kubernetes.io/hostname": name,
        PRODUCT_LABEL: spec.gpu_product,
        MEMORY_LABEL: str(gpu_memory_mib(spec.gpu_product)),
        "nvidia.com/gpu.count": str(spec.gpus_per_node),
        block_key: f"block-{block:02d}",
        leaf_key: f"leaf-{leaf:03d}",
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {},
        "status": {
            "allocatable": {GPU_RESOURCE: str(spec.gpus_per_node), "cpu": "96", "memory": "1056Gi"},
            "capacity": {GPU_RESOURCE: str(spec.gpus_per_node), "cpu": "96", "memory": "1056Gi"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


def _pod(spec: SynthSpec, rng: random.Random, node: str) -> dict[str, Any]:
    gpus = rng.choice((max(1, spec.gpus_per_node // 2), spec.gpus_per_node))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"train-{rng.getrandbits(24):06x}-0", "namespace": spec.namespace},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "trainer", "resources": {"limits": {GPU_RESOURCE: str(gpus)}}}],
        },
        "status": {"phase": "Running"},
    }
