"""A lost node with a hot spare against a full gang restart, on the upstream control plane (tests/upstream).

    .venv/bin/python bench/spare_replacement.py [--repeat 3]

A 4-node job (2x4x2 on 4-GPU nodes) runs on a cluster of 6 nodes, once with spec.failurePolicy.spareNodes 1 and
once without. Each round deletes the Node of node rank 2 and measures the wall time from that DELETE until the
gang's pods are all bound again (the real kube-scheduler binds them) and until the job reports Running with
every pod running, listing the gang every 10 ms. There is no kubelet: the bench writes the pods' status as one
would (Running), confirms graceful deletions on healthy nodes at once, and force-deletes the deleted node's pod
as the pod garbage collector would (it waits a 40 s quarantine first, which both paths would pay alike). With a
spare only rank 2's pod is made again, on the spare; without one the whole gang is deleted, re-planned on the
remaining nodes and made again. No trainer runs: the time to the next training step adds the pods' start and
the gang's re-formation (the in-pod restart of issue 26, item 1) to these figures. The operator runs as
`paralleljob operator` in a subprocess; figures are recorded in docs/operator.md.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.upstream_restart_latency import report  # noqa: E402
from bench.upstream_scale import node  # noqa: E402
from tests.operator.conftest import Operator, job_doc  # noqa: E402
from tests.upstream import controlplane  # noqa: E402
from tests.upstream.cluster import wait_for  # noqa: E402
from tests.upstream.conftest import Api  # noqa: E402

NAMESPACE = "research"
JOBS = f"/apis/paralleljob.io/v1alpha1/namespaces/{NAMESPACE}/paralleljobs"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
LAYOUT = {"pipeline": 2, "tensor": 4, "data": 2}


def pods_of(api: Api, job: str) -> list[dict]:  # type: ignore[type-arg]
    return list(api.ok(api.send("GET", PODS, labelSelector=f"paralleljob.io/job={job}"))["items"])


def add_nodes(api: Api, first: int, count: int) -> None:
    for i in range(first, first + count):
        body = node(i, 4)
        api.ok(api.send("POST", "/api/v1/nodes", {"metadata": body["metadata"]}))
        api.ok(api.send("PATCH", f"/api/v1/nodes/{body['metadata']['name']}/status", {"status": body["status"]}))
        api.ok(api.send("PATCH", f"/api/v1/nodes/{body['metadata']['name']}", {"spec": {"taints": None}}))


def confirm_deletions(api: Api, job: str) -> None:
    """What the kubelets (and, for the deleted node, the pod garbage collector) do: remove deleted pods."""
    for pod in pods_of(api, job):
        if pod["metadata"].get("deletionTimestamp"):
            api.send("DELETE", f"{PODS}/{pod['metadata']['name']}", {"gracePeriodSeconds": 0})


def run_gang(api: Api, job: str) -> list[dict]:  # type: ignore[type-arg]
    """Wait for 4 bound pods of the job, report them Running, and wait until the job is Running."""

    def bound() -> list | None:  # type: ignore[type-arg]
        pods = [p for p in pods_of(api, job) if not p["metadata"].get("deletionTimestamp")]
        return pods if len(pods) == 4 and all(p["spec"].get("nodeName") for p in pods) else None

    pods = wait_for(bound, 120, f"{job}'s pods bound")
    for pod in pods:
        if (pod.get("status") or {}).get("phase") != "Running":
            report(api, pod, "Running")
    wait_for(lambda: _running(api, job), 120, f"{job} Running")
    return pods


def _running(api: Api, job: str) -> bool:
    status = api.ok(api.send("GET", f"{JOBS}/{job}")).get("status") or {}
    return status.get("phase") == "Running" and status.get("podsReady") == 4


def one_round(api: Api, job: str, spares: int, first_node: int) -> tuple[float, float]:
    """Seconds from the node's deletion to the gang bound again, and to the job Running again."""
    add_nodes(api, first_node, 6)
    policy = {"backoffLimit": 3, "spareNodes": spares}
    api.ok(api.send("POST", JOBS, job_doc(job, parallelism=LAYOUT, failurePolicy=policy)))
    pods = run_gang(api, job)
    lost = next(p["spec"]["nodeName"] for p in pods if p["metadata"]["name"] == f"{job}-2")
    before = {p["metadata"]["uid"] for p in pods}
    started = time.perf_counter()
    api.ok(api.send("DELETE", f"/api/v1/nodes/{lost}"))
    bound_at = None
    while True:
        confirm_deletions(api, job)
        current = [p for p in pods_of(api, job) if not p["metadata"].get("deletionTimestamp")]
        fresh = [p for p in current if p["metadata"]["uid"] not in before]
        if len(current) == 4 and fresh and all(p["spec"].get("nodeName") for p in current):
            bound_at = time.perf_counter() - started
            break
        time.sleep(0.01)
    for pod in fresh:
        report(api, pod, "Running")
    while not _running(api, job):
        time.sleep(0.01)
    running_at = time.perf_counter() - started
    print(f"{job}: {len(fresh)} pods made again, bound {bound_at:.2f} s, Running {running_at:.2f} s", flush=True)
    api.ok(api.send("DELETE", f"{JOBS}/{job}"))
    for pod in pods_of(api, job):
        api.send("DELETE", f"{PODS}/{pod['metadata']['name']}", {"gracePeriodSeconds": 0})
    return bound_at, running_at


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="spare-replacement-"))
    state = controlplane.up(workdir / "cluster", controllers="*,-node-lifecycle-controller")
    api = Api(state, state.tokens["admin"])
    operator = None
    results: dict[str, list[tuple[float, float]]] = {"spare": [], "gang restart": []}
    try:
        kubectl = [str(controlplane.binary("kubectl")), "--kubeconfig", str(state.kubeconfig)]
        subprocess.run([*kubectl, "apply", "--server-side", "-f", str(REPO / "crds")], check=True, capture_output=True)
        api.ok(api.send("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}}))
        volume = {
            "metadata": {"name": "ckpt"},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                     "hostPath": {"path": "/tmp/ckpt"}},
        }  # fmt: skip
        api.ok(api.send("POST", "/api/v1/persistentvolumes", volume))
        claim = {
            "metadata": {"name": "ckpt"},
            "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": "ckpt",
                     "resources": {"requests": {"storage": "1Gi"}}},
        }  # fmt: skip
        api.ok(api.send("POST", f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims", claim))
        args_ = ("--force-delete-after", "1", "--not-ready-grace", "0")
        operator = Operator(None, workdir / "operator.log", state.kubeconfig, args_).start()  # type: ignore[arg-type]
        first = 0
        for round_ in range(args.repeat):
            for kind, spares in (("spare", 1), ("gang restart", 0)):
                job = f"{'spare' if spares else 'gang'}-{round_}"
                results[kind].append(one_round(api, job, spares, first))
                first += 6
    finally:
        if operator is not None:
            operator.stop()
        controlplane.down(workdir / "cluster")
    for kind, samples in results.items():
        bound, running = [s[0] for s in samples], [s[1] for s in samples]
        print(
            f"lost node -> {kind}: bound median {statistics.median(bound):.2f} s (best {min(bound):.2f}), "
            f"Running median {statistics.median(running):.2f} s (best {min(running):.2f}), {len(samples)} rounds"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
