"""Failed rank -> every pod of its gang deleted, while 100 other jobs wait for admission.

    .venv/bin/python bench/restart_latency.py [--pending 100] [--repeat 3]

A 16-node job (4x4x4 on 4-GPU nodes) runs on all 16 nodes of the emulated cluster; `--pending` more 16-node
jobs wait, unschedulable. Each round relabels a node (every waiting job is offered to the admission queue at
once), then marks one rank's pod Failed, and measures the wall time from that status write to the moment
every pod of the gang carries a deletionTimestamp (or is gone), polling the emulator's store every 5 ms.
The operator runs as `paralleljob operator` in a subprocess; figures are recorded in docs/operator.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.cluster.apiserver import ClusterThread
from tests.operator.conftest import Cluster, Operator, install_operator_rbac, job_doc, wait_for


def gang_pods(emulator: ClusterThread, attempt: str) -> list[dict]:  # type: ignore[type-arg]
    assert emulator.emulator is not None
    while True:
        try:
            items = list(emulator.emulator.objects.items())
            break
        except RuntimeError:  # the store changed size while being read: read again
            continue
    return [
        obj.raw
        for (res, _, _), obj in items
        if res.plural == "pods"
        and not obj.deleted
        and obj.raw["metadata"].get("labels", {}).get("paralleljob.io/job") == "gpt"
        and obj.raw["metadata"]["labels"].get("paralleljob.io/attempt") == attempt
    ]


def pending_jobs(emulator: ClusterThread) -> int:
    """Waiting jobs already found not to fit, read from the emulator's store (polling 100 jobs over HTTP would
    starve the emulator, which serves from this process)."""
    time.sleep(0.5)
    assert emulator.emulator is not None
    items = list(emulator.emulator.objects.items())
    return sum(
        1
        for (res, _, name), obj in items
        if res.plural == "paralleljobs"
        and name.startswith("waiting-")
        and not obj.deleted
        and (obj.raw.get("status") or {}).get("phase") == "Pending"
    )


def all_deleting(emulator: ClusterThread, attempt: str) -> bool:
    return all(pod["metadata"].get("deletionTimestamp") for pod in gang_pods(emulator, attempt))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pending", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp())
    emulator = ClusterThread(workdir).start()
    cluster = Cluster(emulator)
    cluster.add_nodes(16)
    kubeconfig = install_operator_rbac(emulator, cluster.client)
    operator = Operator(emulator, workdir / "operator.log", kubeconfig).start()
    samples = []
    try:
        cluster.apply(job_doc(failurePolicy={"backoffLimit": args.repeat + 1}))
        for i in range(args.pending):
            cluster.apply(job_doc(f"waiting-{i}"))
        wait_for(lambda: pending_jobs(emulator) >= args.pending, timeout=900, what="every waiting job Pending")
        for attempt in range(args.repeat):
            wait_for(lambda a=attempt: len(gang_pods(emulator, str(a))) == 16, timeout=120, what="the gang's pods")
            cluster.bind_all()
            wait_for(lambda: cluster.status().get("phase") == "Running", timeout=120, what="Running")
            cluster.core.patch_node("gpu-000", {"metadata": {"labels": {"example.com/round": str(attempt)}}})
            started = time.perf_counter()
            cluster.set_pod_phase("gpt-5", "Failed", reason="Error")
            while not all_deleting(emulator, str(attempt)):
                time.sleep(0.005)
            samples.append(time.perf_counter() - started)
            print(
                f"round {attempt}: every pod of the gang deleted {samples[-1] * 1e3:.0f} ms after the failure",
                flush=True,
            )
    finally:
        operator.stop()
        emulator.stop()
    print(
        f"failed rank -> gang deleted with {args.pending} jobs pending: best {min(samples) * 1e3:.0f} ms, "
        f"median {statistics.median(samples) * 1e3:.0f} ms, worst {max(samples) * 1e3:.0f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
