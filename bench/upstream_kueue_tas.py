"""Kueue's Topology-Aware Scheduling against quota alone: admit-and-release cycles of a job that does not fit,
and the admission latency of one that does, on the upstream control plane with the real Kueue.

    flock /tmp/pj-heavy.lock .venv/bin/python -m bench.upstream_kueue_tas [--window 200] [--repeats 5]

The cluster of tests/upstream/test_kueue.py: two 4-GPU nodes, gpu-0 labelled pool=a and gpu-1 pool=b, Kueue
v0.17.0 (testcluster/kueue.py) and the chart with kueue.enabled (the operator from the repository, as the
Kueue tests run it). Each figure is taken twice, with the queue's ResourceFlavor as quota only (nodeLabels; the
operator's path is then the one it had before TAS: no topology request, plan inside the flavour's nodes, give
the quota back when they cannot hold the gang) and with the same flavour naming a Kueue Topology of the hostname
level (TAS):

- cycles: a job of two 4-GPU nodes queued where the flavour's nodes (pool=b) are one 4-GPU node, under a quota
  of 8 GPUs. For --window seconds, the Workload's admissions (Kueue's QuotaReserved Events) and the operator's
  QuotaReleased Events are counted. Quota alone admits it, the planner gives the quota back, Kueue admits it
  again after the 60 s backoff: a cycle a minute. Under TAS Kueue sees that no node set holds the pods, says
  so, and never admits it (goal: 0).
- latency: a one-GPU job in pool a, created --repeats times one after the other: the job's creation to the
  Workload Admitted (as the client polling every 50 ms sees it) and to status.placement written. Median and
  worst of each.

Printed, and recorded in docs/operator.md.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from testcluster import controlplane, kueue
from testcluster.api import CHART, RELEASE, RELEASE_NAMESPACE
from testcluster.product import Product
from testcluster.quickstart import cluster_quickstart

KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"
HOST = "kubernetes.io/hostname"


def apply(product: Product, *objects: dict[str, Any]) -> None:
    product.kubectl("apply", "-f", "-", stdin="\n---\n".join(yaml.safe_dump(obj) for obj in objects))


def kueue_object(kind: str, name: str, spec: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
    metadata = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": kind, "metadata": metadata, "spec": spec}


def queue(product: Product, namespace: str, pool: str, gpus: int, tas: bool) -> None:
    """A namespace with LocalQueue `team` on its own ClusterQueue of `gpus` GPUs in a flavour of `pool`'s nodes."""
    product.kubectl("create", "namespace", namespace)
    flavour: dict[str, Any] = {"nodeLabels": {"pool": pool}}
    if tas:
        apply(product, kueue_object("Topology", "hosts", {"levels": [{"nodeLabel": HOST}]}))
        flavour["topologyName"] = "hosts"
    name = f"{namespace}-{pool}"
    quotas = [{"name": "nvidia.com/gpu", "nominalQuota": gpus}, {"name": "cpu", "nominalQuota": 64}]
    groups = [{"coveredResources": ["nvidia.com/gpu", "cpu"], "flavors": [{"name": name, "resources": quotas}]}]
    apply(product, kueue_object("ResourceFlavor", name, flavour))
    apply(product, kueue_object("ClusterQueue", name, {"namespaceSelector": {}, "resourceGroups": groups}))
    apply(product, kueue_object("LocalQueue", "team", {"clusterQueue": name}, namespace))


def job(name: str, namespace: str, data: int, gpus_per_node: int) -> dict[str, Any]:
    made = cluster_quickstart(2, 2)
    made["metadata"] = {"name": name, "namespace": namespace, "labels": {"kueue.x-k8s.io/queue-name": "team"}}
    made["spec"]["parallelism"] = {"pipeline": 1, "tensor": 1, "data": data}
    made["spec"]["gpusPerNode"] = gpus_per_node
    made["spec"]["checkpoint"]["volume"] = {"emptyDir": {}}
    return made


def get(product: Product, path: str) -> dict[str, Any]:
    response = product.admin.send("GET", path)
    return dict(response.json()) if response.ok else {}


def events(product: Product, namespace: str, name: str, reason: str) -> int:
    found = get(product, f"/api/v1/namespaces/{namespace}/events?fieldSelector=involvedObject.name%3D{name}")
    return sum(int(e.get("count") or 1) for e in found.get("items") or [] if e.get("reason") == reason)


def cycles(product: Product, tas: bool, window: float) -> dict[str, Any]:
    namespace = f"cycles-{'tas' if tas else 'quota'}"
    queue(product, namespace, "b", 8, tas)
    apply(product, job("wide", namespace, 8, 4))
    time.sleep(window)
    workload = get(product, f"{KUEUE_API}/namespaces/{namespace}/workloads/paralleljob-wide")
    reserved = [c for c in (workload.get("status") or {}).get("conditions") or [] if c["type"] == "QuotaReserved"]
    result = {
        "admissions": events(product, namespace, "paralleljob-wide", "QuotaReserved"),
        "released": events(product, namespace, "wide", "QuotaReleased"),
        "kueue_says": reserved[0].get("message") if reserved else "",
    }
    product.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=120s")
    return result


def latency(product: Product, tas: bool, repeats: int) -> dict[str, Any]:
    namespace = f"latency-{'tas' if tas else 'quota'}"
    queue(product, namespace, "a", 4, tas)
    admitted, placed = [], []
    for n in range(repeats):
        name = f"small-{n}"
        started = time.perf_counter()
        apply(product, job(name, namespace, 1, 1))
        seen_admitted = None
        while True:
            now = time.perf_counter() - started
            workload = get(product, f"{KUEUE_API}/namespaces/{namespace}/workloads/paralleljob-{name}")
            conditions = {c["type"]: c["status"] for c in (workload.get("status") or {}).get("conditions") or []}
            if seen_admitted is None and conditions.get("Admitted") == "True":
                seen_admitted = now
            status = get(product, f"/apis/paralleljob.io/v1alpha1/namespaces/{namespace}/paralleljobs/{name}")
            if (status.get("status") or {}).get("placement"):
                placed.append(now)
                admitted.append(seen_admitted if seen_admitted is not None else now)
                break
            if now > 300:
                raise TimeoutError(f"{name} was not placed in 300 s")
            time.sleep(0.05)
        product.kubectl("delete", "pj", name, "-n", namespace, "--wait=true", "--timeout=120s")
    product.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=120s")
    return {
        "admitted_median_s": statistics.median(admitted),
        "admitted_max_s": max(admitted),
        "placed_median_s": statistics.median(placed),
        "placed_max_s": max(placed),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=float, default=200.0, help="seconds to count a non-fitting job's cycles")
    parser.add_argument("--repeats", type=int, default=5, help="small jobs per latency figure")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kueue-tas-") as folder:
        product = Product(Path(folder), nodes=2, gpus_per_node=4)
        try:
            for node, pool in (("gpu-0", "a"), ("gpu-1", "b")):
                product.admin.ok(
                    product.admin.send("PATCH", f"/api/v1/nodes/{node}", {"metadata": {"labels": {"pool": pool}}})
                )
            kueue.up(product.cluster.state)
            ports = [f"operator.healthPort={controlplane.free_port()}", f"metrics.port={controlplane.free_port()}"]
            product.helm(
                "install", RELEASE, str(CHART), "-n", RELEASE_NAMESPACE, "--create-namespace",
                "--set", ",".join([*ports, "kueue.enabled=true"]),
            )  # fmt: skip
            deployment = f"deployment/{RELEASE}-paralleljob-operator"
            product.kubectl("rollout", "status", "-n", RELEASE_NAMESPACE, deployment, "--timeout=180s")
            for tas in (False, True):
                label = "TAS" if tas else "quota only"
                print(f"{label}: latency {latency(product, tas, args.repeats)}", flush=True)
                print(f"{label}: cycles in {args.window:.0f} s {cycles(product, tas, args.window)}", flush=True)
        finally:
            product.stop()


if __name__ == "__main__":
    main()
