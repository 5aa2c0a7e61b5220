"""Admission at 10,000 nodes and 50,000 pods: the cost of one admission pass with a warm usage index, and the
operator's memory once its watches hold that cluster.

    .venv/bin/python bench/admission_scale.py [--nodes 10000] [--pods-per-node 5] [--pending 100] [--rss]

The cluster: 8-GPU nodes under 32-node leaves and 512-node blocks (`paralleljob cluster synth`); on every node
four DaemonSet-like pods (CPU and memory only), on half of the nodes a GPU pod holding all 8 GPUs; plus
`--pending` ParallelJobs waiting unplaced and 20 placed ones whose pods are not bound yet (reservations, in
their attempt records).
The job admitted: 8x8x16 (PP x TP x DP), 1,024 GPUs on 128 nodes.

Prints:
1. planning inside one admission pass, in this process, from warm caches (`NodeWatch`, `UsageIndex`): the
   round's snapshot, the reservations of the other jobs, the cluster assembled by the `ClusterBuilder` and the
   plan (best and median of --repeat, CPU time);
2. one whole admission pass (`reconcile(..., admit=True)`) over HTTP against the emulator holding the jobs:
   reading the job, its pods and every record that reserves nodes, planning, writing the ConfigMap and the
   status: wall time, and CPU time of the thread running the pass (the emulator serves from another thread of
   this process, so the wall time includes the API server's own work under the same GIL); and the read of
   every job's reservations that each admission round makes once as it begins (wall time);
3. with --rss: `paralleljob operator` started against the emulator, its resident memory once both informers
   have listed the cluster and watch it (VmRSS) and its peak (VmHWM), from /proc. kmock's store cannot serve
   a listing of 60,000 objects in pages within a request timeout, so in this run the emulator serves the Nodes
   and Pods from a static store (`StaticEmulator`: sorted, paged with limit/continue, label- and
   field-selected as the API server does, watches from "now" with no replay); everything else (discovery,
   ParallelJobs, kopf's watches) is the emulator's own.
Figures are recorded in docs/operator.md.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from paralleljob.handlers import reconcile
from paralleljob.handlers.nodes import NodeWatch
from paralleljob.k8s import reads
from paralleljob.k8s import session as k8s_session
from paralleljob.manifests import labels, records
from paralleljob.planning import synth
from paralleljob.planning.inventory import ClusterBuilder
from paralleljob.planning.usage import UsageIndex
from tests.cluster.apiserver import APIServer, ClusterThread, matches_fields, matches_selector
from tests.operator.conftest import Cluster, Operator, install_operator_rbac, job_doc, wait_for

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


class StaticEmulator(APIServer):
    """The emulator, serving cluster-wide lists and watches of `static` kinds from a fixed, sorted store."""

    static: ClassVar[dict[str, list[tuple[str, dict[str, Any]]]]] = {}

    async def _serve_list(self, request: Any) -> Any:
        plural = request.resource.plural if request.resource is not None else None
        if plural not in self.static or request.namespace:
            return await super()._serve_list(request)
        labels, fields = request.params.get("labelSelector"), request.params.get("fieldSelector")
        rows = self.static[plural]
        token = request.params.get("continue")
        position = bisect.bisect_right([key for key, _ in rows], token) if token else 0
        limit = int(request.params.get("limit") or 0) or len(rows)
        page = []
        while position < len(rows) and len(page) < limit:
            obj = rows[position][1]
            position += 1
            if labels and not matches_selector(obj["metadata"].get("labels") or {}, labels):
                continue
            if fields and not matches_fields(obj, fields):
                continue
            page.append(obj)
        metadata: dict[str, Any] = {"resourceVersion": "1"}
        if position < len(rows):
            metadata["continue"] = rows[position - 1][0]
        return {"apiVersion": "v1", "kind": "List", "metadata": metadata, "items": page}

    async def _serve_watch(self, request: Any) -> Any:
        plural = request.resource.plural if request.resource is not None else None
        if plural not in self.static:
            async for event in super()._serve_watch(request):
                yield event
            return
        yield b""
        await asyncio.Event().wait()  # nothing changes in this run: hold the watch open


def static_emulator(objects: dict[str, list[dict[str, Any]]]) -> type[StaticEmulator]:
    """An emulator class whose Nodes and Pods are these objects."""

    def key(obj: dict[str, Any]) -> str:
        return f"{obj['metadata'].get('namespace') or ''}/{obj['metadata']['name']}"

    rows = {plural: sorted(((key(o), o) for o in items), key=lambda row: row[0]) for plural, items in objects.items()}
    return type("SeededEmulator", (StaticEmulator,), {"static": rows})


def admission_over_http(
    jobs: list[dict[str, Any]], node_dicts: list[dict[str, Any]], view: reconcile.NodeView, repeat: int
) -> tuple[list[float], list[float], list[float]]:
    workdir = Path(tempfile.mkdtemp())
    emulator = ClusterThread(workdir).start()
    cluster = Cluster(emulator, namespaces=("research", "queue"))
    try:
        placed = 0
        for job in jobs:
            created = cluster.apply(job)
            if created["metadata"]["name"].startswith("placed-"):
                cluster.core.create_namespaced_config_map("queue", placed_record(node_dicts, created, placed))
                placed += 1
        api = k8s_session.connect(str(emulator.kubeconfig))
        wall, cpu, round_wall = [], [], []
        for attempt in range(repeat):
            name = f"gpt-{attempt}"
            cluster.apply(job_doc(name, **JOB, deepspeed=JOB_DEEPSPEED))
            started = time.perf_counter()
            # What each admission round reads once as it begins (registry._admission_view).
            held = frozenset(records.reservations_of(reads.list_reserving_config_maps(api), bound=view.usage.bound))
            round_wall.append(time.perf_counter() - started)
            in_round = dataclasses.replace(view, round_held=held)
            started, started_cpu = time.perf_counter(), time.thread_time()
            outcome = reconcile.reconcile(api, reconcile.Settings(), "research", name, in_round, admit=True)
            wall.append(time.perf_counter() - started)
            cpu.append(time.thread_time() - started_cpu)
            assert outcome.step == "admitted", outcome
        return wall, cpu, round_wall
    finally:
        emulator.stop()


def operator_memory(node_dicts: list[dict[str, Any]], pods: list[dict[str, Any]]) -> dict[str, float]:
    workdir = Path(tempfile.mkdtemp())
    emulator = ClusterThread(workdir, static_emulator({"nodes": node_dicts, "pods": pods})).start()
    try:
        kubeconfig = install_operator_rbac(emulator, Cluster(emulator).client)
        operator = Operator(emulator, workdir / "operator.log", kubeconfig, ["--log-level", "info"]).start()
        assert operator.process is not None
        try:
            started = time.perf_counter()
            # Synced: every page of the usage informer's listing was asked for, and then both pod informers
            # (the usage index's and the job pods') watch.
            assert emulator.emulator is not None
            calls = emulator.emulator.calls
            pages = -(-len(pods) // 500)

            def ours(verb: str, plural: str) -> int:
                return sum(1 for c in calls if c[0] == verb and c[2] == plural and c[4].startswith("paralleljob"))

            def watching_pods() -> bool:
                return ours("list", "pods") >= pages and ours("watch", "pods") >= 2

            wait_for(watching_pods, timeout=1800, what="the usage informer watching")
            listed = time.perf_counter() - started
            time.sleep(10)  # whatever the listings left behind is collected
            status = Path(f"/proc/{operator.process.pid}/status").read_text()
            fields = {line.split(":")[0]: line.split(":")[1].strip() for line in status.splitlines()}
            return {
                "listed_s": listed,
                "rss_mib": int(fields["VmRSS"].split()[0]) / 1024,
                "peak_mib": int(fields["VmHWM"].split()[0]) / 1024,
            }
        finally:
            operator.stop()
    finally:
        emulator.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--pods-per-node", type=int, default=5)
    parser.add_argument("--pending", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--rss", action="store_true", help="also measure the operator process's memory")
    parser.add_argument("--rss-only", action="store_true", help="measure only the operator process's memory")
    args = parser.parse_args()
    node_dicts, pods = synth_objects(args.nodes, args.pods_per_node)
    pod_bytes = statistics.mean(len(json.dumps(p)) for p in pods[:1000])
    print(f"cluster: {len(node_dicts)} nodes, {len(pods)} pods ({pod_bytes:.0f} bytes of JSON each)", flush=True)

    if args.rss_only:
        print_memory(node_dicts, pods)
        return 0
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
    print(f"1. planning in an admission pass (warm): {best_and_median(planning_in_process(view, held, args.repeat))}")
    wall, cpu, round_wall = admission_over_http(jobs, node_dicts, view, min(args.repeat, 5))
    print(
        f"2. whole admission pass over HTTP, {args.pending} jobs pending: wall {best_and_median(wall)}; "
        f"CPU of the pass's thread {best_and_median(cpu)}; the round's own read of every job's reservations "
        f"(once per round): wall {best_and_median(round_wall)}",
        flush=True,
    )
    if args.rss:
        print_memory(node_dicts, pods)
    return 0


def print_memory(node_dicts: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
    memory = operator_memory(node_dicts, pods)
    print(
        f"3. operator memory with {len(node_dicts)} nodes and {len(pods)} pods watched: RSS "
        f"{memory['rss_mib']:.0f} MiB, peak {memory['peak_mib']:.0f} MiB (listed and watching after "
        f"{memory['listed_s']:.0f} s)"
    )


if __name__ == "__main__":
    sys.exit(main())
