"""The DP shrink end to end on the upstream control plane: the product installed as in test_whole_product.py
(`helm install`, the operator from its image, the bundled trainer in pods run by the process kubelet), on a
cluster of exactly the job's two 2-GPU nodes, so that no spare and no free node exists. The quickstart at
pipeline 1 x tensor 2 x data 2 with `allowDataShrink` loses the node the operator does not run on (its
processes killed, its Node deleted, as a cloud provider deletes a VM that is gone, so it never returns and the
job never grows back). The operator restarts the gang at data 1 on the node left, with the global batch kept
and gradient accumulation doubled; the trainer resumes from the checkpoint with the other DP; the job Succeeds.

Its losses, those the DP-2 gang logged before the node went and those the DP-1 gang logged after, are the
single-process reference's within 1e-5, the tolerance of the DP-change resume test
(tests/trainer/test_checkpoints.py) and of the trainer's other single-process proofs. The reference is one
curve for both: it trains whole global batches, which the shrink keeps (job.json at either DP describes the
same experiment, which the test checks). The corpus is the trainer tests' fixed one, not the quickstart's
(this repository's sources change with every commit, and a batch of them once spiked the gradient norm enough
to move a loss by 1.4e-5 on float rounding alone; tests/local/test_run.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from paralleljob_contract import jobfile
from paralleljob_contract import metrics as metrics_file
from testcluster import trainer_harness as harness
from testcluster.api import RELEASE_NAMESPACE, REPO
from testcluster.product import Product
from testcluster.quickstart import JOB
from tests.trainer.reference import train_reference
from tests.upstream.helpers import OPERATOR_IMAGE, require_image, wait_for

pytestmark = pytest.mark.slow
STEPS, CHECKPOINT_EVERY = 20, 4
# The DP-change resume test's tolerance (absolute, fp32): one step of this model moves its loss by far more.
TOLERANCE = 1e-5


def shrinkable_quickstart() -> dict[str, Any]:
    """examples/quickstart-on-a-cluster.yaml at 1x2x2 on 2-GPU nodes (two pods of two ranks), allowed to shrink;
    micro-batch 4 x accumulation 4 x DP 2 makes its global batch of 32."""
    job = yaml.safe_load((REPO / "examples" / "quickstart-on-a-cluster.yaml").read_text())
    spec = job["spec"]
    spec["parallelism"], spec["gpusPerNode"] = {"pipeline": 1, "tensor": 2, "data": 2}, 2
    spec["training"].update(steps=STEPS, logInterval=1)
    spec["checkpoint"]["intervalSteps"] = CHECKPOINT_EVERY
    spec["failurePolicy"] = {"backoffLimit": 2, "allowDataShrink": True}
    return job


def runs(metrics: Path) -> list[dict[str, Any]]:
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
    """The job.json the pods of the current attempt read, with the corpus where this machine has it."""
    config = json.loads(product.kubectl("get", "configmap", f"{JOB}-config", "-o", "json"))
    document = json.loads(config["data"][jobfile.FILE_NAME])
    assert document["spec"]["training"]["data"]["path"] == "/data/corpus"
    document["spec"]["training"]["data"]["path"] = str(corpus)
    return dict(document)


def job_status(product: Product) -> dict[str, Any]:
    return dict(json.loads(product.kubectl("get", "pj", JOB, "-o", "json")).get("status") or {})


def node_without_the_operator(product: Product, status: dict[str, Any]) -> str:
    """The job's node (status.placement) that the operator's pod does not run on (on a cluster it runs on a
    system node)."""
    operator = json.loads(product.kubectl("get", "pods", "-n", RELEASE_NAMESPACE, "-o", "json"))["items"][0]
    placed = {entry["node"] for entry in status["placement"]}
    assert len(placed) == 2, f"one pod a node: {status['placement']}"
    (lost,) = placed - {operator["spec"]["nodeName"]}
    return str(lost)


@pytest.fixture
def product(tmp_path: Path) -> Iterator[Product]:
    with Product.running(tmp_path, nodes=2, gpus_per_node=2) as made:
        yield made


def test_a_job_that_loses_a_node_with_no_spare_shrinks_its_dp_and_stays_on_the_single_process_loss_curve(
    product: Product, tmp_path: Path
) -> None:
    require_image(OPERATOR_IMAGE, "make images-operator")
    # The lost pod is force-deleted 1 s after the gang restart asks (its node's kubelet never confirms), and the
    # restarting gang holds no nodes for itself (there is no other job).
    product.install("recovery.forceDeleteAfterSeconds=1", "recovery.restartHoldSeconds=0")
    corpus = product.fill_corpus(text=harness.text_corpus())
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(shrinkable_quickstart()))
    product.kubectl("apply", "-f", str(REPO / "examples" / "quickstart-volumes.yaml"))
    product.kubectl("apply", "-f", str(tmp_path / "job.yaml"))
    running = wait_for("Running", lambda: (s := job_status(product)).get("phase") == "Running" and s, product, 300)
    full = job_file(product, corpus)
    assert full["plan"]["layout"] == {"pipeline": 1, "tensor": 2, "data": 2}
    lost = node_without_the_operator(product, running)
    # A step takes a fraction of a second on an idle machine: the node goes as soon as the first checkpoint is
    # whole (`latest` names it), whichever step that gang has reached since.
    wait_for("the first checkpoint", lambda: (product.checkpoints() / "latest").exists(), product, 300)
    product.cluster.fault("kill-node", node=lost)
    product.kubectl("delete", "node", lost, "--wait=false")
    wait_for("Succeeded", lambda: job_status(product).get("phase") in ("Succeeded", "Failed"), product, 600)

    status = job_status(product)
    assert status["phase"] == "Succeeded", product.what_was_seen()
    assert status["layout"] == "1x2x1" and status["restarts"] == 1, status
    assert len(status["placement"]) == 1 and status["placement"][0]["node"] != lost, status
    events = product.kubectl("get", "events", "--field-selector", f"involvedObject.name={JOB}")
    assert "DataShrunk" in events and "GrowBack" not in events, events
    shrunk = job_file(product, corpus)
    assert shrunk["plan"]["layout"] == {"pipeline": 1, "tensor": 2, "data": 1}
    batch = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    assert [full["deepspeed"][key] for key in batch] == [32, 4, 4]
    assert [shrunk["deepspeed"][key] for key in batch] == [32, 4, 8]
    # The reference trains whole global batches: the job file at DP 1 describes the unbroken run's experiment.
    reference = train_reference(jobfile.parse_job_config(full))
    assert train_reference(jobfile.parse_job_config(shrunk)) == reference

    parts = runs(product.checkpoints() / "metrics" / "metrics.jsonl")
    assert len(parts) == 2, f"one resume, by the DP-1 gang: {parts}"
    before, after = parts
    # The DP-1 gang resumed from a checkpoint of the DP-2 gang (the only one that saved before it), at a step
    # that gang trained, and had steps left to train.
    assert after["resumed"] % CHECKPOINT_EVERY == 0, after
    assert CHECKPOINT_EVERY <= after["resumed"] <= min(max(before["losses"]), STEPS - CHECKPOINT_EVERY), (before, after)
    assert sorted(before["losses"]) == list(range(1, max(before["losses"]) + 1))
    assert sorted(after["losses"]) == list(range(after["resumed"] + 1, STEPS + 1))
    for part in (before, after):
        worst = max(abs(loss - reference[step].loss) for step, loss in part["losses"].items())
        assert worst <= TOLERANCE, f"losses {part['losses']} differ from the reference by {worst:.2e}"
    assert reference[STEPS].loss < reference[1].loss - 0.05, "the run trained"
