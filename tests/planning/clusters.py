"""Builders for the planning tests: jobs and clusters as YAML a user could write."""

from __future__ import annotations

from typing import Any

import yaml

from paralleljob import planning
from paralleljob.api import ResolvedJob, validate_document

A100 = "NVIDIA-A100-SXM4-80GB"
LEAF = "network.topology.nvidia.com/leaf"
SPINE = "network.topology.nvidia.com/spine"


def job(yaml_text: str) -> ResolvedJob:
    result = validate_document(yaml.safe_load(yaml_text))
    assert result.resolved is not None, [p.render() for p in result.problems]
    return result.resolved


def small_job(pipeline: int, tensor: int, data: int, gpus_per_node: int | None = None, extra: str = "") -> ResolvedJob:
    gpn = f"\n  gpusPerNode: {gpus_per_node}" if gpus_per_node else ""
    return job(
        f"""
apiVersion: paralleljob.io/v1alpha1
kind: ParallelJob
metadata: {{name: small}}
spec:
  parallelism: {{pipeline: {pipeline}, tensor: {tensor}, data: {data}}}{gpn}
  model: {{layers: 8, hiddenSize: 512, attentionHeads: 8, sequenceLength: 512, vocabSize: 1024}}
  deepspeed: {{train_micro_batch_size_per_gpu: 1, gradient_accumulation_steps: 16, zero_optimization: {{stage: 1}}}}
  training: {{steps: 10}}
  checkpoint: {{intervalSteps: 5, volume: {{persistentVolumeClaim: {{claimName: checkpoints}}}}}}
{extra}"""
    )


def node(name: str, gpus: int = 8, leaf: str | None = None, spine: str | None = None, **extra: Any) -> dict[str, Any]:
    """A Node as `kubectl get nodes -o yaml` prints it; extra: labels, taints, unschedulable, ready, and
    allocatable (resources besides the GPUs)."""
    labels = {"nvidia.com/gpu.product": A100, "nvidia.com/gpu.memory": "81920", **extra.get("labels", {})}
    if leaf:
        labels[LEAF] = leaf
    if spine:
        labels[SPINE] = spine
    return yaml.safe_load(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": labels},
                "spec": {"unschedulable": extra.get("unschedulable", False), "taints": extra.get("taints", [])},
                "status": {
                    "allocatable": {"nvidia.com/gpu": str(gpus), **extra.get("allocatable", {})},
                    "conditions": [{"type": "Ready", "status": "True" if extra.get("ready", True) else "False"}],
                },
            }
        )
    )


def pod(
    name: str, node_name: str, gpus: int, phase: str = "Running", requests: dict[str, str] | None = None
) -> dict[str, Any]:
    resources: dict[str, Any] = {"limits": {"nvidia.com/gpu": gpus}, **({"requests": requests} if requests else {})}
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "research"},
        "spec": {"nodeName": node_name, "containers": [{"name": "c", "resources": resources}]},
        "status": {"phase": phase},
    }


def plan(resolved: ResolvedJob, nodes: list[dict[str, Any]], pods: list[dict[str, Any]] = ()) -> planning.Plan:  # type: ignore[assignment]
    outcome = planning.plan_job(resolved, planning.build_cluster(nodes, pods))
    assert isinstance(outcome, planning.Plan), outcome
    return outcome


def unschedulable(resolved: ResolvedJob, nodes: list[dict[str, Any]], pods: list[dict[str, Any]] = ()) -> str:  # type: ignore[assignment]
    outcome = planning.plan_job(resolved, planning.build_cluster(nodes, pods))
    assert isinstance(outcome, planning.Unschedulable), outcome
    return outcome.message
