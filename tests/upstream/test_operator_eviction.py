"""The operator's own pod evicted in the middle of a gang restart, with two replicas (issue 39).

The product as a user installs it (`helm install --set replicas=2`) on the upstream control plane: the real
Deployment, scheduler and controller-manager, the process kubelet running both replicas from the operator image.
A job pod is killed, which starts a gang restart, and the leading replica is evicted through the Eviction API
(what `kubectl drain` does) as soon as the restart has begun. The standby takes the Lease and finishes the
restart from what it reads: the job succeeds with exactly the one restart it would have had without the
eviction, each node rank ran in exactly two pods (no double, nothing left over), and the Deployment brought a
replacement replica back.

The process kubelet runs both replicas on this machine's one network, so one of them finds its metrics port taken
and its start fails until the port is free: the test also holds the operator to the start-up that fails and is run
again (in the CI rehearsals a replica that had campaigned before its start failed held the Lease and acted on
nothing, and the job stayed Restarting; tests/operator/test_failed_start.py pins that).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testcluster.api import RELEASE, RELEASE_NAMESPACE, REPO
from testcluster.product import Product
from testcluster.quickstart import JOB
from tests.upstream.helpers import job_status, wait_for

pytestmark = pytest.mark.slow
EXAMPLE = REPO / "examples" / "quickstart-on-a-cluster.yaml"
OPERATOR_POD_PREFIX = f"{RELEASE}-paralleljob-operator"
LEADS = "leads: it holds the Lease"


def small_job() -> dict[str, Any]:
    """The example at 1x2x2 on two 2-GPU nodes, 40 steps with a checkpoint every 4."""
    job: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    spec = job["spec"]
    spec["parallelism"], spec["gpusPerNode"] = {"pipeline": 1, "tensor": 2, "data": 2}, 2
    spec["training"].update(steps=40, logInterval=1)
    spec["checkpoint"]["intervalSteps"] = 4
    return job


@pytest.fixture
def product(tmp_path: Path) -> Iterator[Product]:
    with Product.running(tmp_path, nodes=2, gpus_per_node=2) as made:
        yield made


def operator_pods(product: Product) -> list[dict[str, Any]]:
    listed = json.loads(product.kubectl("get", "pods", "-n", RELEASE_NAMESPACE, "-o", "json"))["items"]
    return [p for p in listed if p["metadata"]["name"].startswith(OPERATOR_POD_PREFIX)]


def leader(product: Product) -> str | None:
    """The running replica whose log says it holds the Lease (the Lease names a host, which the process kubelet's
    pods share)."""
    for pod in operator_pods(product):
        meta = pod["metadata"]
        folder = product.cluster.folder / "kubelet" / "pods" / f"{RELEASE_NAMESPACE}_{meta['name']}_{meta['uid'][:8]}"
        log = folder / "container.log"
        if pod["status"].get("phase") == "Running" and log.exists() and LEADS in log.read_text(errors="replace"):
            return str(meta["name"])
    return None


def evict(product: Product, name: str) -> None:
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": RELEASE_NAMESPACE}}
    response = product.admin.send("POST", f"/api/v1/namespaces/{RELEASE_NAMESPACE}/pods/{name}/eviction", body)
    assert response.status_code == 201, response.text


def job_pod_folders(product: Product, node_rank: int) -> list[Path]:
    return [f for f in product.cluster.container_folders() if f.name.startswith(f"default_{JOB}-{node_rank}_")]


def test_the_leading_replica_evicted_mid_gang_restart_the_standby_finishes_it_with_one_restart(
    product: Product, tmp_path: Path
) -> None:
    product.install("replicas=2")
    product.fill_corpus()
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(small_job()))
    product.kubectl("apply", "-f", str(REPO / "examples" / "quickstart-volumes.yaml"))
    product.kubectl("apply", "-f", str(tmp_path / "job.yaml"))
    wait_for("two operator replicas running", lambda: len(operator_pods(product)) == 2, product, 120)
    first = wait_for("the leading replica", lambda: leader(product), product, 120)
    stepping = lambda: (job_status(product).get("progress") or {}).get("step", "0") not in ("0", 0)  # noqa: E731
    wait_for("the job stepping", lambda: job_status(product).get("phase") == "Running" and stepping(), product, 300)

    product.cluster.fault("kill-container", namespace="default", pod=f"{JOB}-1")
    # The leader has written the restart and is replacing the gang's pods: it is evicted now.
    wait_for("the gang restarting", lambda: job_status(product).get("phase") == "Restarting", product, 120)
    evict(product, first)

    wait_for("a new leader", lambda: leader(product) not in (None, first), product, 120)
    wait_for("Succeeded", lambda: job_status(product).get("phase") in ("Succeeded", "Failed"), product, 480)
    final = job_status(product)
    assert final["phase"] == "Succeeded", product.what_was_seen()
    assert final["restarts"] == 1, final
    assert (final.get("progress") or {}).get("step") in ("40", 40), final.get("progress")
    # Each node rank ran in its first pod and in the one the restart made: none doubled, none left over.
    assert [len(job_pod_folders(product, rank)) for rank in (0, 1)] == [2, 2], product.what_was_seen()
    assert first not in [p["metadata"]["name"] for p in operator_pods(product)]
    wait_for("the Deployment's replacement replica", lambda: len(operator_pods(product)) == 2, product, 120)
    events = product.kubectl("get", "events", "--field-selector", f"involvedObject.name={JOB},reason=Restarting")
    assert len([line for line in events.splitlines()[1:] if "Restarting" in line]) == 1, events
