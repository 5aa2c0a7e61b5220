"""What the tests of tests/upstream share besides their fixtures: the operator's image, waiting on a product,
where a process ran, the process kubelet's pods, and the quickstart job that loses a node: its run, status, job
file and gangs' losses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from paralleljob_contract import jobfile
from paralleljob_contract import metrics as metrics_file
from testcluster import images, polling
from testcluster import trainer_harness as harness
from testcluster.api import RELEASE_NAMESPACE, REPO, Api
from testcluster.product import Product
from testcluster.quickstart import JOB

OPERATOR_IMAGE = "ghcr.io/paralleljob/operator:0.1.0"  # the chart's default image at its appVersion


def require_image(reference: str, build: str) -> None:
    """An image these tests run must have been built: they fail, never fall back to the venv, without it."""
    store = images.Store()
    try:
        if store.find(reference) is None:
            pytest.fail(f"{reference} is not in {store.folder}/store: run `{build}` first", pytrace=False)
    finally:
        store.close()


def ran_from_image(product: Product, namespace: str, pod: str) -> dict[str, Any]:
    """What the kubelet ran a pod's container with (its sandbox.json), checked to be the pod's image."""
    sandbox = json.loads((product.pod_folder(namespace, pod) / "sandbox.json").read_text())
    assert "image" in sandbox, f"{pod} ran from the venv, not from its image"
    status = json.loads(product.kubectl("get", "pod", pod, "-n", namespace, "-o", "json"))
    assert status["status"]["containerStatuses"][0]["imageID"].startswith("sha256:")
    return dict(sandbox)


def wait_for(what: str, condition: Any, product: Product, timeout: float) -> Any:
    try:
        return polling.wait_for(condition, timeout, what)
    except TimeoutError as error:
        pytest.fail(f"{error}; {product.what_was_seen()}")


def wait_for_kueue(product: Product, what: str, condition: Any, timeout: float = 240) -> Any:
    """`wait_for` on a product with Kueue installed: a timeout also shows its queues, Workloads and log."""
    try:
        return polling.wait_for(condition, timeout, what)
    except TimeoutError as error:
        log = (product.cluster.folder / "logs" / "kueue.log").read_text(errors="replace")[-3000:]
        seen = product.kubectl("get", "pj,workloads,clusterqueues,pods", "-A", "-o", "wide")
        pytest.fail(f"{error}\n{seen}\n--- kueue:\n{log}\n{product.what_was_seen()}")


PODS = "/api/v1/namespaces/default/pods"


def wait_for_pod(api: Api, name: str, condition: Any, timeout: float = 60) -> dict[str, Any]:
    def seen() -> dict[str, Any] | None:
        response = api.send("GET", f"{PODS}/{name}")
        return response.json() if response.ok and condition(response.json()) else None

    return dict(polling.wait_for(seen, timeout, f"pod {name}"))


def gang_runs(metrics: Path) -> list[dict[str, Any]]:
    """Each gang's part of a metrics.jsonl (a `resume` record opens the next): the step it resumed from and its
    losses by step."""
    found: list[dict[str, Any]] = [{"resumed": None, "losses": {}}]
    for record in metrics_file.read_records(metrics):
        if record.get("event") == "resume":
            found.append({"resumed": int(record["step"]), "losses": {}})
        elif record.get("event") == "step":
            found[-1]["losses"][int(record["step"])] = float(record["loss"])
    return found


def job_file(product: Product, corpus: Path) -> dict[str, Any]:
    """The job.json the pods of the quickstart's current attempt read, with the corpus where this machine has it."""
    config = json.loads(product.kubectl("get", "configmap", f"{JOB}-config", "-o", "json"))
    document = json.loads(config["data"][jobfile.FILE_NAME])
    assert document["spec"]["training"]["data"]["path"] == "/data/corpus"
    document["spec"]["training"]["data"]["path"] = str(corpus)
    return dict(document)


def job_status(product: Product) -> dict[str, Any]:
    """The quickstart job's status, read straight from the API server (a kubectl run can take longer than a
    restart phase lasts); empty while the job cannot be read."""
    response = product.admin.send("GET", f"/apis/paralleljob.io/v1alpha1/namespaces/default/paralleljobs/{JOB}")
    return dict(response.json().get("status") or {}) if response.ok else {}


def node_without_the_operator(product: Product, status: dict[str, Any]) -> str:
    """The job's node (status.placement) that the operator's pod does not run on (on a cluster it runs on a
    system node)."""
    operator = json.loads(product.kubectl("get", "pods", "-n", RELEASE_NAMESPACE, "-o", "json"))["items"][0]
    placed = {entry["node"] for entry in status["placement"]}
    assert len(placed) == 2, f"one pod a node: {status['placement']}"
    (lost,) = placed - {operator["spec"]["nodeName"]}
    return str(lost)


def run_losing_a_node(product: Product, job: dict[str, Any], folder: Path) -> tuple[dict[str, Any], str, Path]:
    """Installs the product, runs the quickstart `job` and, once its first checkpoint is whole, loses the job's
    node the operator does not run on (its processes killed, its Node deleted, as a cloud provider deletes a VM
    that is gone); waits for the job to finish. Returns the first attempt's job.json, the lost node and where the
    corpus is on this machine."""
    require_image(OPERATOR_IMAGE, "make images-operator")
    # The lost pod is force-deleted 1 s after the gang restart asks (its node's kubelet never confirms), and the
    # restarting gang holds no nodes for itself (there is no other job).
    product.install("recovery.forceDeleteAfterSeconds=1", "recovery.restartHoldSeconds=0")
    corpus = product.fill_corpus(text=harness.text_corpus())
    (folder / "job.yaml").write_text(yaml.safe_dump(job))
    product.kubectl("apply", "-f", str(REPO / "examples" / "quickstart-volumes.yaml"))
    product.kubectl("apply", "-f", str(folder / "job.yaml"))
    running = wait_for("Running", lambda: (s := job_status(product)).get("phase") == "Running" and s, product, 300)
    first = job_file(product, corpus)
    lost = node_without_the_operator(product, running)
    # A step takes a fraction of a second on an idle machine: the node goes as soon as the first checkpoint is
    # whole (`latest` names it), whichever step that gang has reached since.
    wait_for("the first checkpoint", lambda: (product.checkpoints() / "latest").exists(), product, 300)
    product.cluster.fault("kill-node", node=lost)
    product.kubectl("delete", "node", lost, "--wait=false")
    wait_for("Succeeded", lambda: job_status(product).get("phase") in ("Succeeded", "Failed"), product, 900)
    return first, lost, corpus
