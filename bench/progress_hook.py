"""Rank 0's progress hook under a slow API server: how long a training step waits in `on_step` while each
status patch takes a second (it should not wait at all), and how many patches 20 reports cost.

    .venv/bin/python bench/progress_hook.py [--latency 1.0] [--steps 20]

Figures are recorded in docs/operator.md. The API is the strict test cluster's (tests/cluster), the hook
reports with the job's own progress account, as in a pod.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kubernetes

from paralleljob.manifests import labels
from paralleljob.manifests import rbac as progress_rbac
from paralleljob_trainer import k8s_status
from tests.cluster.apiserver import ClusterThread
from tests.operator.conftest import Cluster, job_doc


def measure(latency: float, steps: int) -> dict[str, float]:
    workdir = Path(tempfile.mkdtemp())
    server = ClusterThread(workdir).start()
    try:
        cluster = Cluster(server)
        job = cluster.apply(job_doc())
        for obj in progress_rbac.build_progress_rbac(job):
            kubernetes.utils.create_from_dict(cluster.client, obj)
        token = workdir / "token"
        token.write_text(server.token_for("research", labels.progress_account_name("gpt")))
        reporter = k8s_status.StatusReporter(
            server.url, "research", "gpt", token_path=token, ca_path=server.ca, interval=0
        )
        server.server.latency[("patch", "paralleljobs/status")] = latency
        waits = []
        for step in range(1, steps + 1):
            started = time.perf_counter()
            reporter.on_step({"event": "step", "step": step, "loss": 3.0, "tokens_per_s": 1000.0})
            waits.append(time.perf_counter() - started)
        reporter.on_finish({"event": "summary"})
        return {
            "max_wait_ms": 1000 * max(waits),
            "mean_wait_ms": 1000 * sum(waits) / len(waits),
            "patches": reporter.patches,
        }
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    row = measure(args.latency, args.steps)
    print(
        f"API latency {args.latency:.1f} s, {args.steps} steps: on_step waits {row['mean_wait_ms']:.2f} ms on average, "
        f"{row['max_wait_ms']:.2f} ms at most; {row['patches']} status patches sent"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
