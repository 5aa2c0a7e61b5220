"""A slow link named by the link check and moved away from on the upstream control plane, for real (issue 36).

The product as a user installs it, on five 1-GPU nodes whose kubelet runs each pod in a network namespace of its
own on a bridge (testcluster/podnet.py): a 2x1x2 job (pipeline 2 x data 2, one rank a node, so every node has a
pipeline and a data link to other nodes) with `spec.network.preflight: fail`, and one node free. Before the job is
applied, the node that node rank 3's pod will start on is slowed with `tc` to a tenth of the bandwidth the link
check measures on this machine's bridges (the kubelet's `slow-link` fault by pod name: the pod's node, every pod
there from its start). The check names that node (NetworkVerified False, reason SlowLink), the operator excludes
it and restarts the gang planned without it, and the job Succeeds on the single-process reference's loss curve.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from paralleljob_contract import jobfile
from paralleljob_contract.layout import Layout
from paralleljob_contract.network import SLOW_LINK
from testcluster import netns
from testcluster.api import REPO
from testcluster.product import Product
from testcluster.quickstart import JOB, LOSS_TOLERANCE, cluster_quickstart, losses
from tests.trainer.reference import train_reference
from tests.upstream.helpers import job_status, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not netns.available(), reason="needs root and iproute2 (network namespaces, tc)"),
]
STEPS = 8
SLOW_POD = f"{JOB}-3"


def slow_link_job() -> dict[str, Any]:
    job = cluster_quickstart(steps=STEPS, checkpoint_every=4)
    spec = job["spec"]
    spec["parallelism"], spec["gpusPerNode"] = {"pipeline": 2, "tensor": 1, "data": 2}, 1
    spec["network"] = {"preflight": "fail"}
    spec["failurePolicy"] = {"backoffLimit": 3}
    return job


def measured_mbit(folder: Path) -> float:
    """The slowest class's median bandwidth the link check measures between namespaces on a bridge of this
    machine, unslowed (as tests/trainer/test_linkcheck.py measures it), in Mbit/s."""
    bridge = netns.Bridge("sl", 4, subnet=netns.free_subnet())
    try:
        healthy = netns.run_linkcheck_ranks(bridge, folder / "healthy.json", Layout(2, 1, 2))
    finally:
        bridge.close()
    assert (healthy["verified"], healthy["slowNodes"]) == ("True", []), healthy
    return float(min(c["medianGBps"] for c in healthy["classes"].values()) * 8000)


@pytest.fixture
def product(tmp_path: Path) -> Iterator[Product]:
    with Product.running(tmp_path, nodes=5, gpus_per_node=1, network_namespaces=True) as made:
        yield made


def first_attempt_node(product: Product, pod: str) -> str | None:
    found = product.admin.send("GET", f"/api/v1/namespaces/default/pods/{pod}")
    if not found.ok:
        return None
    body = found.json()
    first = body["metadata"].get("labels", {}).get("paralleljob.io/attempt") == "0"
    return str(body["spec"]["nodeName"]) if first and body["spec"].get("nodeName") else None


def network_verified(product: Product) -> dict[str, Any] | None:
    conditions = {c["type"]: c for c in job_status(product).get("conditions") or []}
    return conditions.get("NetworkVerified")


def test_a_link_slowed_to_a_tenth_is_named_and_the_gang_restarts_without_its_node(
    product: Product, tmp_path: Path
) -> None:
    mbit = measured_mbit(tmp_path) / 10
    product.install()
    # Whichever node node rank 3's pod starts on is slow from the pod's start (its NIC, as every pod there sees it).
    product.cluster.fault("slow-link", namespace="default", pod=SLOW_POD, mbit=f"{mbit:.0f}")
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(slow_link_job()))
    product.kubectl("apply", "-f", str(REPO / "examples" / "quickstart-volumes.yaml"))
    product.kubectl("apply", "-f", str(tmp_path / "job.yaml"))
    slow = wait_for(f"{SLOW_POD} on a node", lambda: first_attempt_node(product, SLOW_POD), product, 300)

    named = lambda: (c := network_verified(product)) and c["status"] == "False" and c  # noqa: E731
    verified = wait_for("NetworkVerified False", named, product, 300)
    assert verified["reason"] == SLOW_LINK, verified
    assert verified["message"].startswith(f"slow node {slow}: "), verified
    excluded = lambda: slow in (job_status(product).get("excludedNodes") or [])  # noqa: E731
    wait_for(f"{slow} excluded", excluded, product, 120)
    wait_for("Succeeded", lambda: job_status(product).get("phase") in ("Succeeded", "Failed"), product, 600)
    final = job_status(product)
    assert final["phase"] == "Succeeded", product.what_was_seen()
    assert final["excludedNodes"] == [slow], final
    assert slow not in [p["node"] for p in final["placement"]], final["placement"]

    config = json.loads(product.kubectl("get", "configmap", f"{JOB}-config", "-o", "json"))
    reference = train_reference(jobfile.parse_job_config(json.loads(config["data"][jobfile.FILE_NAME])))
    on_cluster = losses(product.checkpoints() / "metrics" / "metrics.jsonl")
    assert max(on_cluster) == STEPS
    off = {
        s: (on_cluster[s], reference[s].loss)
        for s in on_cluster
        if on_cluster[s] != pytest.approx(reference[s].loss, **LOSS_TOLERANCE)
    }
    assert not off, f"steps off the reference (cluster, reference): {off}"
