"""A lost node with a hot spare against a full gang restart, on the upstream control plane (tests/upstream).

    .venv/bin/python -m bench.spare_replacement [--repeat 3]

A 4-node job (2x4x2 on 4-GPU nodes) runs on a cluster of 6 nodes, once with spec.failurePolicy.spareNodes 1 and
once without. Each round deletes the Node of node rank 2 and measures the wall time from that DELETE until the
gang's pods are all bound again (the real kube-scheduler binds them) and until the job reports Running with
every pod running, listing the gang every 10 ms. kwok (`make kwok`, bench/kwok.py) plays the nodes' kubelets: it
marks bound pods Running and confirms graceful deletions on the nodes that remain; the bench force-deletes the
deleted node's pod as the pod garbage collector would (it waits a 40 s quarantine first, which both paths would
pay alike). With a
spare only rank 2's pod is made again, on the spare; without one the whole gang is deleted, re-planned on the
remaining nodes and made again. No trainer runs: the time to the next training step adds the pods' start and
the gang's re-formation (the in-pod restart of issue 26, item 1) to these figures. The operator runs as
`paralleljob operator` in a subprocess; figures are recorded in docs/operator.md.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import common, kwok
from testcluster import controlplane
from testcluster.admin import job_doc
from testcluster.api import Api
from testcluster.operators import Operator
from testcluster.polling import wait_for

REPO = Path(__file__).resolve().parents[1]

NAMESPACE = "research"
JOBS = f"/apis/paralleljob.io/v1alpha1/namespaces/{NAMESPACE}/paralleljobs"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
LAYOUT = {"pipeline": 2, "tensor": 4, "data": 2}


def pods_of(api: Api, job: str) -> list[dict]:  # type: ignore[type-arg]
    return list(api.ok(api.send("GET", PODS, labelSelector=f"paralleljob.io/job={job}"))["items"])


def collect_orphan(api: Api, job: str, lost: str) -> None:
    """What the pod garbage collector does to the deleted node's pod (kwok no longer keeps that node): remove it."""
    for pod in pods_of(api, job):
        if pod["spec"].get("nodeName") == lost and pod["metadata"].get("deletionTimestamp"):
            api.send("DELETE", f"{PODS}/{pod['metadata']['name']}", {"gracePeriodSeconds": 0})


def run_gang(api: Api, job: str) -> list[dict]:  # type: ignore[type-arg]
    """Wait for 4 bound pods of the job and until the job is Running (kwok marks them Running)."""

    def bound() -> list | None:  # type: ignore[type-arg]
        pods = [p for p in pods_of(api, job) if not p["metadata"].get("deletionTimestamp")]
        return pods if len(pods) == 4 and all(p["spec"].get("nodeName") for p in pods) else None

    pods = wait_for(bound, 120, f"{job}'s pods bound")
    wait_for(lambda: _running(api, job), 120, f"{job} Running")
    return pods


def _running(api: Api, job: str) -> bool:
    status = api.ok(api.send("GET", f"{JOBS}/{job}")).get("status") or {}
    return status.get("phase") == "Running" and status.get("podsReady") == 4


def one_round(api: Api, fakes: kwok.Kwok, job: str, spares: int, first_node: int) -> tuple[float, float]:
    """Seconds from the node's deletion to the gang bound again, and to the job Running again."""
    kwok.write_nodes(api, [common.node(i, 4) for i in range(first_node, first_node + 6)], fakes)
    policy = {"backoffLimit": 3, "spareNodes": spares}
    api.ok(api.send("POST", JOBS, job_doc(job, parallelism=LAYOUT, failurePolicy=policy)))
    pods = run_gang(api, job)
    lost = next(p["spec"]["nodeName"] for p in pods if p["metadata"]["name"] == f"{job}-2")
    before = {p["metadata"]["uid"] for p in pods}
    started = time.perf_counter()
    api.ok(api.send("DELETE", f"/api/v1/nodes/{lost}"))
    bound_at = None
    while True:
        collect_orphan(api, job, lost)
        current = [p for p in pods_of(api, job) if not p["metadata"].get("deletionTimestamp")]
        fresh = [p for p in current if p["metadata"]["uid"] not in before]
        if len(current) == 4 and fresh and all(p["spec"].get("nodeName") for p in current):
            bound_at = time.perf_counter() - started
            break
        time.sleep(0.01)
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
    state = controlplane.up(workdir / "cluster", node_grace=kwok.node_grace())
    api = Api(state, state.tokens["admin"])
    operator, kubelets = None, contextlib.ExitStack()
    results: dict[str, list[tuple[float, float]]] = {"spare": [], "gang restart": []}
    try:
        kubectl = [str(controlplane.binary("kubectl")), "--kubeconfig", str(state.kubeconfig)]
        subprocess.run([*kubectl, "apply", "--server-side", "-f", str(REPO / "crds")], check=True, capture_output=True)
        api.ok(api.send("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}}))
        common.write_checkpoint_claim(api, NAMESPACE)
        fakes = kubelets.enter_context(kwok.Kwok(state, workdir / "kwok.log"))
        args_ = ("--force-delete-after", "1", "--not-ready-grace", "0")
        operator = Operator(None, workdir / "operator.log", state.kubeconfig, args_).start()  # type: ignore[arg-type]
        first = 0
        for round_ in range(args.repeat):
            for kind, spares in (("spare", 1), ("gang restart", 0)):
                job = f"{'spare' if spares else 'gang'}-{round_}"
                results[kind].append(one_round(api, fakes, job, spares, first))
                first += 6
    finally:
        if operator is not None:
            operator.stop()
        kubelets.close()
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
