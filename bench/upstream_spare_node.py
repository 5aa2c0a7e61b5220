"""A lost node with a hot spare, to the next training step, on the upstream control plane with the trainer.

    .venv/bin/python -m bench.upstream_spare_node [--kill-at 8] [--not-ready-grace 2] [--then out-of-service]
    .venv/bin/python -m bench.upstream_spare_node --chart-defaults

The whole product as tests/upstream/test_whole_product.py installs it (`helm install`, the operator from its image:
`make images-operator` first), on a test cluster of 4 nodes, one of them cordoned with the operator's pod on it:
the quickstart (2x2x2 on 4-GPU nodes, so 2 pods) with spec.failurePolicy.spareNodes 1, 40 steps and a checkpoint
every 4. Once step --kill-at is logged, the node of pod 1 is killed (the process kubelet's `kill-node`: its
processes die and it stops heartbeating, so the node-lifecycle controller marks it NotReady after its 8 s grace).
The chart's recovery values make the operator act on a NotReady node after --not-ready-grace seconds and
force-delete its stuck pod 1 s after asking for its deletion. With `--then out-of-service` the node is tainted
node.kubernetes.io/out-of-service once NotReady, as Kubernetes' non-graceful node shutdown has an administrator
or a remediation controller do, and with `--then delete` its Node is deleted, as a cloud provider does with a VM
that is gone. Measured: the kill to rank 0's first step record after it (goal, issue 26: <= 30 s), and where the
time went: the node NotReady, the lost pod made again on the spare, every pod Running again; whether the
survivors kept their pods (an in-place re-formation) or the gang was made again; and the restarts counted.
With `--chart-defaults` the chart is installed with its default recovery values (a 300 s NotReady grace, force
deletion 120 s after asking, a 20 s Lease threshold): the node is replaced on its gang's report (`lostPeers`,
from node rank 0's coordinator) and its stale Lease together, and the bench also marks when the report reached
the progress ConfigMap (goal, issue 36: <= 60 s to the next step). Printed, and recorded in docs/operator.md.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.common import product_steps, wait_for
from testcluster.api import RELEASE_NAMESPACE
from testcluster.product import Product

REPO = Path(__file__).resolve().parents[1]

GOAL_SECONDS = 30.0
# Issue 36: with the chart's default recovery values, the gang's report and the node's Lease.
CHART_DEFAULTS_GOAL_SECONDS = 60.0

JOB = "quickstart"


def pods(product: Product) -> dict[str, dict[str, Any]]:
    listing = json.loads(product.kubectl("get", "pods", "-l", f"paralleljob.io/job={JOB}", "-o", "json"))
    return {p["metadata"]["name"]: p for p in listing["items"]}


def node_ready(product: Product, node: str) -> bool:
    found = json.loads(product.kubectl("get", "nodes", "-o", "json"))["items"]
    conditions = [c for n in found if n["metadata"]["name"] == node for c in n["status"]["conditions"]]
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def lost_peers(product: Product) -> str:
    """The peers node rank 0's coordinator reports lost in the progress ConfigMap ("" before any report)."""
    found = json.loads(product.kubectl("get", "configmap", f"{JOB}-progress", "-o", "json"))
    return str((found.get("data") or {}).get("lostPeers") or "")


def measure(folder: Path, kill_at: int, grace: float | None, then: str) -> dict[str, Any]:
    """`grace` None: the chart's default recovery values."""
    with Product.running(folder, nodes=4) as product:
        if grace is None:
            product.install()
        else:
            product.install(
                f"recovery.notReadyGraceSeconds={grace:g}",
                "recovery.forceDeleteAfterSeconds=1",
                "recovery.restartHoldSeconds=0",
            )
        # The operator's pod runs on a node of its own, cordoned, so that the job uses the three others and the
        # killed node never takes the operator with it (on a cluster it runs on a system node).
        operator = json.loads(product.kubectl("get", "pods", "-n", RELEASE_NAMESPACE, "-o", "json"))["items"][0]
        product.kubectl("cordon", operator["spec"]["nodeName"])
        product.fill_corpus()
        job = yaml.safe_load((REPO / "examples" / "quickstart-on-a-cluster.yaml").read_text())
        job["spec"]["training"].update(steps=40, logInterval=1)
        job["spec"]["checkpoint"]["intervalSteps"] = 4
        job["spec"]["failurePolicy"] = {"backoffLimit": 3, "inPlaceRestarts": 2, "spareNodes": 1}
        (folder / "job.yaml").write_text(yaml.safe_dump(job))
        product.kubectl("apply", "-f", str(REPO / "examples" / "quickstart-volumes.yaml"))
        product.kubectl("apply", "-f", str(folder / "job.yaml"))
        wait_for(f"step {kill_at}", lambda: any(r["step"] >= kill_at for r in product_steps(product)))
        before = {name: (p["metadata"]["uid"], p["spec"]["nodeName"]) for name, p in pods(product).items()}
        spare = json.loads(product.kubectl("get", "pj", JOB, "-o", "json"))["status"].get("spareNodes")
        lost = before[f"{JOB}-1"][1]
        seen = len(product_steps(product))
        product.cluster.fault("kill-node", node=lost)
        killed = time.monotonic()
        marks: dict[str, float] = {}

        def progressed() -> bool:
            now = time.monotonic() - killed
            if "not_ready" not in marks and not node_ready(product, lost):
                marks["not_ready"] = now
                if then == "out-of-service":
                    taint = "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"
                    product.kubectl("taint", "nodes", lost, taint)
                elif then == "delete":
                    product.kubectl("delete", "node", lost, "--wait=false")
            if "gang_reported" not in marks and lost in lost_peers(product):
                marks["gang_reported"] = now
            current = pods(product)
            replaced = current.get(f"{JOB}-1")
            if "replaced" not in marks and replaced and replaced["metadata"]["uid"] != before[f"{JOB}-1"][0]:
                marks["replaced"] = now
            running = [p for p in current.values() if (p.get("status") or {}).get("phase") == "Running"]
            if "replaced" in marks and "running" not in marks and len(running) == len(before):
                marks["running"] = now
            return len(product_steps(product)) > seen and product_steps(product)[-1]["step"] > 0 and "replaced" in marks

        wait_for("the next step after the lost node", progressed, 600)
        marks["next_step"] = time.monotonic() - killed
        after = {name: (p["metadata"]["uid"], p["spec"].get("nodeName")) for name, p in pods(product).items()}
        # Rank 0 reports the survivors' in-place re-formation with its next progress report: a few seconds.
        deadline = time.monotonic() + 15
        while True:
            status = json.loads(product.kubectl("get", "pj", JOB, "-o", "json"))["status"]
            if status.get("inPlaceRestarts") or status.get("restarts") or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    return {
        "marks": marks,
        "spare": spare,
        "lost": lost,
        "kept": sorted(name for name in before if after.get(name, ("",))[0] == before[name][0]),
        "remade": sorted(name for name in before if after.get(name, ("",))[0] != before[name][0]),
        "placed": {name: node for name, (_, node) in after.items()},
        "restarts": status.get("restarts", 0),
        "in_place": status.get("inPlaceRestarts", 0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kill-at", type=int, default=8)
    parser.add_argument("--not-ready-grace", type=int, default=2)
    parser.add_argument("--then", choices=("none", "out-of-service", "delete"), default="none")
    parser.add_argument(
        "--chart-defaults", action="store_true", help="the chart's default recovery values (--not-ready-grace unused)"
    )
    arguments = parser.parse_args()
    grace = None if arguments.chart_defaults else arguments.not_ready_grace
    goal = CHART_DEFAULTS_GOAL_SECONDS if arguments.chart_defaults else GOAL_SECONDS
    with tempfile.TemporaryDirectory() as scratch:
        found = measure(Path(scratch), arguments.kill_at, grace, arguments.then)
    marks = found["marks"]
    verdict = "met" if marks["next_step"] <= goal else "missed"
    print(
        f"3 job nodes (2 + spare {found['spare']}), node {found['lost']} killed at step {arguments.kill_at}, "
        f"then {arguments.then}"
    )
    print(f"killed node to the next step: {marks['next_step']:.1f} s (goal <= {goal:.0f} s: {verdict})")
    for mark in ("gang_reported", "not_ready", "replaced", "running"):
        if mark in marks:
            print(f"  {mark.replace('_', ' ')} at {marks[mark]:.1f} s")
    print(f"pods kept: {found['kept']}, made again: {found['remade']}, now on {found['placed']}")
    print(f"status.restarts {found['restarts']}, status.inPlaceRestarts {found['in_place']}")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
