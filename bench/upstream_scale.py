"""Operator scale on the upstream control plane (tests/upstream): the time from creating a ParallelJob to all of
its pods written, for jobs of N 8-GPU node ranks (PP 4 x TP 8 x DP N/4) on a cluster of exactly N nodes, and
the operator's CPU time and peak RSS over it.

    .venv/bin/python -m bench.upstream_scale [--sizes 16 128 1024 4096]

The bench writes the Nodes (8 GPUs each) and kwok (`make kwok`, bench/kwok.py) keeps them as their kubelets
would: Ready, 40 s Leases renewed every 10 s, the pods bound to them Running. The controller-manager runs whole,
at a real cluster's 50 s node grace, and the scheduler binds the pods. The operator runs as `paralleljob operator`
in a subprocess with the admin's kubeconfig. Besides the time to all pods written, the bench prints the time to
all of them Running (scheduled, then marked Running by kwok: what the operator's own work is followed by on a
cluster). Figures are recorded in docs/operator.md.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import requests

from bench import common, kwok
from testcluster import controlplane
from testcluster.admin import job_doc
from testcluster.api import Api
from testcluster.operators import Operator

REPO = Path(__file__).resolve().parents[1]


def pod_count(api: Api, namespace: str) -> int:
    listed = api.ok(api.send("GET", f"/api/v1/namespaces/{namespace}/pods", limit="1"))
    return len(listed["items"]) + int(listed["metadata"].get("remainingItemCount") or 0)


def measure(nodes: int, workdir: Path, lease_seconds: int = kwok.LEASE_SECONDS) -> dict[str, float]:
    state = controlplane.up(workdir / "cluster", node_grace=kwok.node_grace(lease_seconds))
    operator = None
    try:
        api = Api(state, state.tokens["admin"])
        api.session.mount("https://", requests.adapters.HTTPAdapter(pool_maxsize=32))
        subprocess.run(
            [str(controlplane.binary("kubectl")), "--kubeconfig", str(state.kubeconfig), "apply", "--server-side",
             "-f", str(REPO / "crds")],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        with kwok.Kwok(state, workdir / "kwok.log", lease_seconds) as fakes:
            common.write_nodes(api, nodes, fakes)
            operator = Operator(None, workdir / "operator.log", state.kubeconfig).start()  # type: ignore[arg-type]
            process = psutil.Process(operator.process.pid)  # type: ignore[union-attr]
            time.sleep(5)  # let kopf list the nodes before the clock starts
            cpu_before = sum(process.cpu_times()[:2])
            doc = job_doc(
                parallelism={"pipeline": 4, "tensor": common.GPUS, "data": nodes // 4},
                deepspeed={"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 16},
                gpusPerNode=common.GPUS,
            )
            namespace = doc["metadata"]["namespace"]
            api.ok(api.send("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}}))
            common.write_checkpoint_claim(api, namespace)
            started = time.perf_counter()
            api.ok(api.send("POST", f"/apis/paralleljob.io/v1alpha1/namespaces/{namespace}/paralleljobs", doc))
            peak = 0
            while (count := pod_count(api, namespace)) < nodes:
                peak = max(peak, process.memory_info().rss)
                if time.perf_counter() - started > 900:
                    raise TimeoutError(f"{count} of {nodes} pods after 900 s; see {workdir / 'operator.log'}")
                time.sleep(0.2)
            elapsed = time.perf_counter() - started
            peak = max(peak, process.memory_info().rss)
            cpu = sum(process.cpu_times()[:2]) - cpu_before
            while (count := kwok.running_pods(api, f"/api/v1/namespaces/{namespace}/pods")) < nodes:
                fakes.alive()
                if time.perf_counter() - started > 1800:
                    raise TimeoutError(f"{count} of {nodes} pods Running after 1800 s")
                time.sleep(0.5)
            running = time.perf_counter() - started
        return {"nodes": nodes, "seconds": elapsed, "running": running, "cpu": cpu, "rss_mib": peak / 2**20}
    finally:
        if operator is not None:
            operator.stop()
        controlplane.down(workdir / "cluster")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 128, 1024, 4096])
    parser.add_argument(
        "--lease-seconds",
        type=int,
        default=kwok.LEASE_SECONDS,
        help="kwok's node Leases, renewed every quarter of it (a kubelet's: 40); the node grace is 5/4 of it",
    )
    args = parser.parse_args()
    print(
        f"{'node ranks':>10} {'to all pods (s)':>16} {'to all Running (s)':>19} {'operator CPU (s)':>17} "
        f"{'operator RSS (MiB)':>19}"
    )
    for size in args.sizes:
        workdir = Path(tempfile.mkdtemp(prefix="upstream-scale-"))
        try:
            row = measure(size, workdir, args.lease_seconds)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        print(
            f"{row['nodes']:>10} {row['seconds']:>16.2f} {row['running']:>19.2f} {row['cpu']:>17.2f} "
            f"{row['rss_mib']:>19.0f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
