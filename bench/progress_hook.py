"""Rank 0's progress hook under a slow API server: how long a training step waits in `on_step` while each
progress patch takes a second (it should not wait at all), and how many patches 20 reports cost.

    .venv/bin/python -m bench.progress_hook [--latency 1.0] [--steps 20]

The API server is the upstream one of the operator tests (testcluster/server.py: etcd and kube-apiserver),
slowed by its fault proxy, which holds each patch of a ConfigMap `--latency` seconds before it forwards it. The
hook reports to the job's progress ConfigMap with the token of the job's progress account, through the proxy,
as rank 0 does in a pod. Figures are recorded in docs/operator.md.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
import time
from pathlib import Path

import kubernetes

from paralleljob.manifests import labels, progress
from paralleljob.manifests import rbac as progress_rbac
from paralleljob_trainer import k8s_status
from testcluster import server as upstream
from testcluster.admin import Cluster, job_doc


def measure(latency: float, steps: int) -> dict[str, float]:
    workdir = Path(tempfile.mkdtemp(prefix="progress-hook-"))
    try:
        with contextlib.contextmanager(upstream.started)(workdir) as server:
            cluster = Cluster(server)
            job = cluster.apply(job_doc())
            for obj in [progress.build_config_map(job), *progress_rbac.build_progress_rbac(job)]:
                kubernetes.utils.create_from_dict(cluster.client, obj)
            token = workdir / "token"
            token.write_text(server.token_for("research", labels.progress_account_name("gpt")))
            reporter = k8s_status.ProgressReporter(
                server.url, "research", "gpt", token_path=token, ca_path=server.ca, interval=0
            )
            server.latency[("patch", "configmaps")] = latency
            waits = []
            for step in range(1, steps + 1):
                started = time.perf_counter()
                reporter.on_step({"event": "step", "step": step, "loss": 3.0, "tokens_per_s": 1000.0})
                waits.append(time.perf_counter() - started)
            reporter.on_finish({"event": "summary"})
            reported = cluster.core.read_namespaced_config_map("gpt-progress", "research").data or {}
            assert reported.get("step") == str(steps), reported
            assert server.denied == [], server.denied
            return {
                "max_wait_ms": 1000 * max(waits),
                "mean_wait_ms": 1000 * sum(waits) / len(waits),
                "patches": reporter.patches,
            }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    row = measure(args.latency, args.steps)
    print(
        f"API latency {args.latency:.1f} s, {args.steps} steps: on_step waits {row['mean_wait_ms']:.2f} ms on average, "
        f"{row['max_wait_ms']:.2f} ms at most; {row['patches']} progress patches sent"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
