"""The whole product on the upstream control plane, installed as a user installs it: `helm install` of the chart
(CRD, RBAC, the operator's Deployment), which the real controller-manager turns into a ReplicaSet and a pod, the
real scheduler binds, and the process kubelet runs with its ServiceAccount token through the in-cluster
configuration. examples/quickstart-on-a-cluster.yaml is applied with kubectl as written (no `--validate=false`),
with its corpus claim filled with the text `paralleljob run` trains the quickstart on; its pods run the unmodified
bundled trainer (torchrun, DeepSpeed on gloo); rank 0 reports progress through its own token, which RBAC limits
to its progress ConfigMap. One rank's process is killed, and the gang restarts in place: the same pods, the
restart counted in status, the attempt record and an Event. Then one pod's process is killed, the gang
restarts with new pods from the checkpoint, the job Succeeds, and its losses are those of the single-process
reference trained on the job file the pods read.

Nothing the operator did was refused: its log has no 403.

The operator runs from its image (`make images-operator`, which `make test` runs first): the kubelet runs the
chart's pod in the image's root filesystem, as uid 65532 on a read-only root, and the chart's liveness probe is
answered. The test fails, naming the command, when that image was not built.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from paralleljob_contract import jobfile
from testcluster.api import RELEASE, RELEASE_NAMESPACE, REPO, Api
from testcluster.product import Product
from testcluster.quickstart import CHECKPOINT_EVERY, JOB, LOSS_TOLERANCE, TOTAL_STEPS, checkpoint_saved, losses
from tests.trainer.reference import train_reference
from tests.upstream.helpers import OPERATOR_IMAGE, ran_from_image, require_image, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.both_releases]
EXAMPLE = REPO / "examples" / "quickstart-on-a-cluster.yaml"
# spec.failurePolicy.progressTimeoutSeconds of the test's job: how long the hung rank's heartbeat stays quiet.
HANG_TIMEOUT_SECONDS = 30


def check_the_operator_ran_from_its_image(product: Product) -> None:
    pods = json.loads(product.kubectl("get", "pods", "-n", RELEASE_NAMESPACE, "-o", "json"))["items"]
    pod = next(p for p in pods if p["metadata"]["name"].startswith(f"{RELEASE}-paralleljob-"))
    name = pod["metadata"]["name"]
    sandbox = ran_from_image(product, RELEASE_NAMESPACE, name)
    assert sandbox["user"]["uid"] == 65532 and sandbox["readOnlyRoot"], sandbox
    assert sandbox["command"][:2] == ["paralleljob", "operator"], "the image's entrypoint, with the chart's args"
    # The first probe may come before the operator listens (a few seconds on a busy machine), as on a cluster;
    # it has answered since, and was never stopped for failing.
    probes = (product.pod_folder(RELEASE_NAMESPACE, name) / "probes.log").read_text().splitlines()
    assert probes and probes[-1].endswith(": 200"), probes
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0 and pod["status"]["phase"] == "Running"


@pytest.fixture
def product(tmp_path: Path) -> Iterator[Product]:
    with Product.running(tmp_path) as made:
        yield made


def rank0_token(product: Product) -> str:
    """The token the kubelet asked the TokenRequest API for, in rank 0's projected ServiceAccount volume."""
    tokens = sorted((product.pod_folder("default", f"{JOB}-0") / "volumes").glob("*/token"))
    assert tokens, "rank 0's pod has a projected ServiceAccount token"
    return tokens[0].read_text()


def check_rank0_rights(product: Product) -> None:
    rank0 = Api(product.cluster.state, rank0_token(product))
    own = f"/api/v1/namespaces/default/configmaps/{JOB}-progress"
    # Rank 0 may patch its own progress ConfigMap and nothing else, not even read it.
    assert rank0.send("PATCH", own, {"metadata": {"annotations": {"probe": "1"}}}).status_code == 200
    for method, path in [
        ("GET", own),
        ("GET", "/api/v1/namespaces/default/pods"),
        ("GET", f"/api/v1/namespaces/default/configmaps/{JOB}-config"),
        ("PATCH", f"/api/v1/namespaces/default/configmaps/{JOB}-config"),
        ("GET", "/apis/paralleljob.io/v1alpha1/namespaces/default/paralleljobs"),
        ("GET", "/api/v1/nodes"),
    ]:
        response = rank0.send(method, path, {} if method == "PATCH" else None)
        assert response.status_code == 403, (method, path, response.status_code)


def pod_uids(product: Product) -> set[str]:
    pods = json.loads(product.kubectl("get", "pods", "-n", "default", "-l", f"paralleljob.io/job={JOB}", "-o", "json"))
    return {pod["metadata"]["uid"] for pod in pods["items"]}


def check_an_in_place_restart(product: Product, rows: list[dict[str, str]]) -> None:
    """A hung rank (stopped: it neither steps nor fails, and its peers wait for it in their collectives) restarts
    the gang inside its pods once its heartbeat has been quiet for progressTimeoutSeconds, long before the
    process-group timeout and the operator's watchdog: no pod is recreated, and the operator counts it."""
    before = pod_uids(product)
    pid = wait_for("rank 5's pid", lambda: product.rank_pid(f"{JOB}-1", 5), product, 60)
    os.kill(pid, signal.SIGSTOP)

    def counted() -> dict[str, object] | None:
        status = json.loads(product.kubectl("get", "pj", JOB, "-o", "json")).get("status") or {}
        return status if status.get("inPlaceRestarts") == 1 else None

    status = wait_for("the in-place restart counted", counted, product, 180)
    assert status["restarts"] == 1 and status["phase"] == "Running", status
    assert pod_uids(product) == before, "an in-place restart recreates no pod"
    config = json.loads(product.kubectl("get", "configmap", f"{JOB}-config", "-o", "json"))
    assert json.loads(config["data"]["attempt.json"])["inPlaceRestarts"] == 1
    events = product.kubectl("get", "events", "-n", "default", "--field-selector", "reason=RestartedInPlace")
    assert "in-place restart 1/2" in events, events
    log = (product.pod_folder("default", f"{JOB}-0") / "container.log").read_text(errors="replace")
    assert re.search(r"in-place restart 1/2: node \d: rank \d made no progress for \d+s", log), log[-3000:]
    rows.append(product.job_row())
    assert rows[-1]["RESTARTS"] == "1"


def test_the_quickstart_survives_a_killed_pod_on_the_upstream_control_plane(product: Product, tmp_path: Path) -> None:
    require_image(OPERATOR_IMAGE, "make images-operator")
    product.install()
    corpus = product.fill_corpus()
    # The example as written, but 24 steps with a checkpoint every 8 instead of 60 and 20 (CI's time).
    job = yaml.safe_load(EXAMPLE.read_text())
    job["spec"]["training"]["steps"], job["spec"]["checkpoint"]["intervalSteps"] = TOTAL_STEPS, CHECKPOINT_EVERY
    # Above each phase of a start on 2 loaded cores (process groups, engine, checkpoint) and any step.
    job["spec"]["failurePolicy"]["progressTimeoutSeconds"] = HANG_TIMEOUT_SECONDS
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    product.kubectl("apply", "-f", str(REPO / "examples" / "quickstart-volumes.yaml"))
    product.kubectl("apply", "-f", str(tmp_path / "job.yaml"))
    rows: list[dict[str, str]] = []

    def row() -> dict[str, str]:
        rows.append(product.job_row())
        return rows[-1]

    wait_for(
        "Running with progress",
        lambda: row().get("PHASE") == "Running" and row().get("STEP", "").isdigit(),
        product,
        300,
    )
    check_rank0_rights(product)
    wait_for(
        "the first checkpoint",
        lambda: row() and checkpoint_saved(product.checkpoints(), CHECKPOINT_EVERY),
        product,
        300,
    )
    check_an_in_place_restart(product, rows)
    # A lost pod restarts the gang with new pods, whatever in-place budget is left.
    product.cluster.fault("kill-container", namespace="default", pod=f"{JOB}-1")
    wait_for("Succeeded", lambda: row().get("PHASE") in ("Succeeded", "Failed"), product, 480)
    final = rows[-1]
    config = json.loads(product.kubectl("get", "configmap", f"{JOB}-config", "-o", "json"))
    assert final["PHASE"] == "Succeeded", product.what_was_seen()
    assert final["RESTARTS"] == "2"
    running = [r for r in rows if r.get("PHASE") == "Running" and r.get("LOSS")]
    assert float(running[-1]["LOSS"]) < float(running[0]["LOSS"]), "kubectl get pj shows a falling loss"
    log = product.operator_log()
    assert "(403)" not in log and "Forbidden" not in log, "the chart's RBAC refused the operator something"
    check_the_operator_ran_from_its_image(product)

    # The reference reads the corpus where this machine has it; the pods read it at the example's mount path.
    trained = json.loads(config["data"][jobfile.FILE_NAME])
    assert trained["spec"]["training"]["data"]["path"] == "/data/corpus"
    trained["spec"]["training"]["data"]["path"] = str(corpus)
    reference = train_reference(jobfile.parse_job_config(trained))
    on_cluster = losses(product.checkpoints() / "metrics" / "metrics.jsonl")
    assert max(on_cluster) == TOTAL_STEPS
    assert on_cluster == pytest.approx({step: reference[step].loss for step in on_cluster}, **LOSS_TOLERANCE)
