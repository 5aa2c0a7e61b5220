"""Admission at 10,000 nodes and 50,000 pods, in process: the cost of planning inside one admission pass with a
warm usage index, and of warming that index. No API server: the caches are filled from the synthesized cluster
as a listing would fill them. The same cluster and jobs serve bench/upstream_admission_scale.py, which measures
the whole pass over HTTPS and the operator's memory on the upstream control plane.

    .venv/bin/python bench/admission_scale.py [--nodes 10000] [--pods-per-node 5] [--pending 100] [--repeat 10]

The cluster: 8-GPU nodes under 32-node leaves and 512-node blocks (`paralleljob cluster synth`); on every node
four DaemonSet-like pods (CPU and memory only), on half of the nodes a GPU pod holding all 8 GPUs; plus
`--pending` ParallelJobs waiting unplaced and 20 placed ones whose pods are not bound yet (reservations, in
their attempt records).
The job admitted: 8x8x16 (PP x TP x DP), 1,024 GPUs on 128 nodes.

Prints the CPU time of filling the caches (`NodeWatch`, `UsageIndex`) from the cluster, then of planning inside
one admission pass from them: the round's snapshot, the reservations of the other jobs, the cluster assembled by
the `ClusterBuilder` and the plan (best and median of --repeat). Figures are recorded in docs/operator.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from paralleljob.handlers import reconcile
from paralleljob.handlers.nodes import NodeWatch
from paralleljob.manifests import labels, records
from paralleljob.planning import synth
from paralleljob.planning.inventory import ClusterBuilder
from paralleljob.planning.usage import UsageIndex
from tests.operator.conftest import job_doc

JOB = {"parallelism": {"pipeline": 8, "tensor": 8, "data": 16}, "gpusPerNode": 8}
JOB_DEEPSPEED = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 16}


def daemon_pod(node: str, index: int) -> dict[str, Any]:
    """A DaemonSet-like pod as the API returns it (labels, owner, probes, env, status), CPU and memory only."""
    name = f"ds{index}-{node}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "kube-system",
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "labels": {"app.kubernetes.io/name": f"agent-{index}", "controller-revision-hash": "5d9f7c8b6"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": f"agent-{index}", "uid": "ds"}],
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "agent",
                    "image": f"registry.example.com/agent-{index}:1.2.3",
                    "env": [{"name": f"VAR_{k}", "value": "x" * 24} for k in range(8)],
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
                    "volumeMounts": [{"name": "host", "mountPath": "/host", "readOnly": True}],
                }
            ],
            "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
            "tolerations": [{"operator": "Exists"}],
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": t, "status": "True"} for t in ("Initialized", "Ready", "ContainersReady")],
            "containerStatuses": [
                {
                    "name": "agent",
                    "image": f"registry.example.com/agent-{index}:1.2.3",
                    "imageID": f"registry.example.com/agent-{index}@sha256:{'0' * 64}",
                    "ready": True,
                    "restartCount": 0,
                    "state": {"running": {}},
                }
            ],
        },
    }


def gpu_pod(node: str) -> dict[str, Any]:
    pod = daemon_pod(node, 0)
    pod["metadata"].update(name=f"train-{node}", namespace="other-team", labels={"app": "train"})
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "8"}, "requests": {"cpu": "90"}}
    return pod


def synth_objects(nodes: int, pods_per_node: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    spec = synth.SynthSpec(nodes=nodes, gpus_per_node=8, leaves=max(1, nodes // 32), blocks=max(1, nodes // 512))
    node_dicts, _ = synth.synth_cluster(spec)
    pods = []
    for i, node in enumerate(node_dicts):
        name = node["metadata"]["name"]
        pods += [daemon_pod(name, k) for k in range(pods_per_node - 1)]
        pods.append(gpu_pod(name) if i % 2 else daemon_pod(name, pods_per_node - 1))
    return node_dicts, pods


PLACED = 20


def other_jobs(pending: int) -> list[dict[str, Any]]:
    """`pending` waiting ParallelJobs and PLACED placed ones (their records: `placed_record`)."""
    names = [f"waiting-{i}" for i in range(pending)] + [f"placed-{j}" for j in range(PLACED)]
    return [job_doc(name, namespace="queue", **JOB, deepspeed=JOB_DEEPSPEED) for name in names]


def placed_record(node_dicts: list[dict[str, Any]], job: dict[str, Any], index: int) -> dict[str, Any]:
    """The `-config` ConfigMap of placed job `index` (4 nodes, pods not bound yet): its attempt record, which
    reserves the nodes, owned by `job` (as created, with its uid)."""
    free = [n["metadata"]["name"] for i, n in enumerate(node_dicts) if not i % 2]
    nodes = tuple(free[-(4 * index + r + 1)] for r in range(4))
    record = records.AttemptRecord(0, job["spec"], "trainer:bench", nodes, gpus_per_node=8)
    name = job["metadata"]["name"]
    metadata = labels.child_metadata(job, labels.config_map_name(name))
    return records.stamp({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {}}, record)


def best_and_median(samples: list[float]) -> str:
    return f"best {min(samples) * 1e3:.1f} ms, median {statistics.median(samples) * 1e3:.1f} ms"


def planning_in_process(view: reconcile.NodeView, config_maps: list[dict[str, Any]], repeat: int) -> list[float]:
    from paralleljob.api import validate_document
    from paralleljob.handlers import placement

    resolved = validate_document(job_doc("gpt", **JOB, deepspeed=JOB_DEEPSPEED)).resolved
    assert resolved is not None
    samples = []
    for _ in range(repeat):
        started = time.process_time()
        usage = view.usage.without([])
        held = records.reservations_of(config_maps, exclude=("research", "gpt"), bound=usage.bound)
        outcome = placement.plan(resolved, view.snapshot, usage.usage, held, (), view.builder)
        samples.append(time.process_time() - started)
        assert outcome.plan is not None, outcome.reason
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--pods-per-node", type=int, default=5)
    parser.add_argument("--pending", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    node_dicts, pods = synth_objects(args.nodes, args.pods_per_node)
    pod_bytes = statistics.mean(len(json.dumps(p)) for p in pods[:1000])
    print(f"cluster: {len(node_dicts)} nodes, {len(pods)} pods ({pod_bytes:.0f} bytes of JSON each)", flush=True)
    nodes, usage = NodeWatch(), UsageIndex()
    started = time.process_time()
    nodes.replace(iter(node_dicts))
    usage.replace(iter(pods))
    print(f"warming the caches from a listing: {time.process_time() - started:.2f} s CPU", flush=True)
    snapshot = nodes.snapshot()
    view = reconcile.NodeView(snapshot.known, snapshot.not_ready, snapshot, usage.snapshot(), ClusterBuilder())
    jobs = other_jobs(args.pending)
    held = [
        placed_record(node_dicts, {**job, "metadata": {**job["metadata"], "uid": f"uid-{i}"}}, i)
        for i, job in enumerate(jobs[-PLACED:])
    ]
    planning_in_process(view, held, 1)  # the first pass fills the builder's records; passes after it are warm
    print(f"planning in an admission pass (warm), CPU: {best_and_median(planning_in_process(view, held, args.repeat))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
