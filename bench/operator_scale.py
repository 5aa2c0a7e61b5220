"""Operator scale benchmark against the strict cluster's API server (tests/cluster, RBAC enforced): time from creating a ParallelJob to all of
its pods existing, for 16, 128 and 1,024 node ranks, and the API writes the operator makes per job, then
over a quiet window in which nothing changes.

    .venv/bin/python bench/operator_scale.py [--sizes 16 128 1024] [--quiet-seconds 60]

Figures are recorded in docs/operator.md. The operator runs as `paralleljob operator` in a subprocess.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.cluster.apiserver import ClusterThread
from tests.operator.conftest import Cluster, Operator, install_operator_rbac, job_doc, operator_calls, wait_for

WRITES = {"create", "patch", "delete"}


def writes(emulator: ClusterThread) -> int:
    return sum(1 for verb, *_ in operator_calls(emulator) if verb in WRITES)


def measure(nodes: int, quiet_seconds: float) -> dict[str, float]:
    workdir = Path(tempfile.mkdtemp())
    emulator = ClusterThread(workdir).start()
    cluster = Cluster(emulator)
    cluster.add_nodes(nodes)
    kubeconfig = install_operator_rbac(emulator, cluster.client)
    operator = Operator(emulator, workdir / "operator.log", kubeconfig).start()
    try:
        time.sleep(3)  # let kopf list the nodes before the clock starts
        data = nodes // 4  # PP 4 x TP 4 x DP on 4-GPU nodes: 4 node ranks per data-parallel replica
        doc = job_doc(
            parallelism={"pipeline": 4, "tensor": 4, "data": data},
            deepspeed={"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 16},
        )
        before = writes(emulator)
        started = time.perf_counter()
        cluster.apply(doc)

        def pods() -> int:
            objects = list(emulator.emulator.objects.items())
            return sum(1 for (res, _, _), obj in objects if res.plural == "pods" and not obj.deleted)

        wait_for(lambda: pods() == nodes, timeout=600, what=f"{nodes} pods")
        elapsed = time.perf_counter() - started
        wait_for(lambda: cluster.status().get("message", "").startswith(f"{nodes} pods"), timeout=120, what="placed")
        time.sleep(2)
        per_job = writes(emulator) - before
        quiet_before = writes(emulator)
        time.sleep(quiet_seconds)
        quiet = writes(emulator) - quiet_before
        assert emulator.server.denied == [], emulator.server.denied[:3]
        return {"nodes": nodes, "seconds": elapsed, "writes": per_job, "quiet_writes": quiet}
    finally:
        operator.stop()
        emulator.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 128, 1024])
    parser.add_argument("--quiet-seconds", type=float, default=60)
    args = parser.parse_args()
    print(f"{'node ranks':>10} {'to all pods (s)':>16} {'writes/job':>11} {'writes in quiet window':>23}")
    for size in args.sizes:
        row = measure(size, args.quiet_seconds)
        print(f"{row['nodes']:>10} {row['seconds']:>16.2f} {row['writes']:>11} {row['quiet_writes']:>23}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
