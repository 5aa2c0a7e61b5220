"""The quickstart's pods run from the CPU trainer image (`make images`; `make images-test` runs this test): the
chart installed with the CPU flavour as the jobs' default trainer image, the operator from its own image, and
examples/quickstart-on-a-cluster.yaml applied as written, shortened. The kubelet runs every rank's pod in the
trainer image's root filesystem as the chart's job user (10001) on a read-only root, with the operator's emptyDirs
and the claims (group-owned through fsGroup) as the only writable folders. The job Succeeds and its losses are the
single-process reference's, trained on the job file the pods read.

Not part of `make test`: the CPU trainer image's first build downloads PyPI's torch (3 GB with its CUDA libraries).
It fails, naming the command, when that image was not built.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from paralleljob_contract import jobfile
from testcluster.api import REPO
from testcluster.product import Product
from testcluster.quickstart import CHECKPOINT_EVERY, JOB, LOSS_TOLERANCE, losses
from tests.trainer.reference import train_reference
from tests.upstream.helpers import OPERATOR_IMAGE, ran_from_image, require_image, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.trainer_image]
TRAINER_IMAGE = "ghcr.io/paralleljob/trainer:0.1.0-cpu"
STEPS = CHECKPOINT_EVERY


@pytest.fixture
def product(tmp_path: Path) -> Iterator[Product]:
    with Product.running(tmp_path) as made:
        yield made


def test_the_quickstart_trains_from_the_cpu_trainer_image_on_the_single_process_loss_curve(
    product: Product, tmp_path: Path
) -> None:
    require_image(TRAINER_IMAGE, "make images")
    require_image(OPERATOR_IMAGE, "make images-operator")
    product.install("jobDefaults.trainerImage.tag=0.1.0-cpu")
    corpus = product.fill_corpus()
    job = yaml.safe_load((REPO / "examples" / "quickstart-on-a-cluster.yaml").read_text())
    job["spec"]["training"]["steps"], job["spec"]["checkpoint"]["intervalSteps"] = STEPS, CHECKPOINT_EVERY
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    product.kubectl("apply", "-f", str(REPO / "examples" / "quickstart-volumes.yaml"))
    product.kubectl("apply", "-f", str(tmp_path / "job.yaml"))

    wait_for("Succeeded", lambda: product.job_row().get("PHASE") in ("Succeeded", "Failed"), product, 900)
    assert product.job_row()["PHASE"] == "Succeeded", product.what_was_seen()
    for rank in (0, 1):
        sandbox = ran_from_image(product, "default", f"{JOB}-{rank}")
        assert sandbox["user"]["uid"] == 10001 and sandbox["readOnlyRoot"], sandbox
        assert sandbox["command"][:3] == ["python", "-m", "paralleljob_contract.supervisor"], sandbox["command"]

    config = json.loads(product.kubectl("get", "configmap", f"{JOB}-config", "-o", "json"))
    trained = json.loads(config["data"][jobfile.FILE_NAME])
    trained["spec"]["training"]["data"]["path"] = str(corpus)
    reference = train_reference(jobfile.parse_job_config(trained))
    on_cluster = losses(product.checkpoints() / "metrics" / "metrics.jsonl")
    assert max(on_cluster) == STEPS
    assert on_cluster == pytest.approx({step: reference[step].loss for step in on_cluster}, **LOSS_TOLERANCE)
