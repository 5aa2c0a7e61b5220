"""The re-plan end to end on the upstream control plane, as tests/upstream/test_data_shrink.py runs the DP shrink:
the product installed (`helm install`, the operator from its image, the bundled trainer in pods run by the process
kubelet) on a cluster of exactly the job's two 2-GPU nodes, so that no spare and no free node exists.

The quickstart's size is a budget here (`parallelism.nodes: 2` with data kept at 1, so the layout search picks a
pipeline x tensor of 4) with `allowRelayout`. It loses the node the operator does not run on (its processes
killed, its Node deleted, so it never returns). Data 1 cannot shrink: the operator resumes the job at the layout
search's best layout for the 2 GPUs left, a pipeline x tensor of 2, global batch kept; every rank re-cuts the
checkpoint saved at the other layout (`paralleljob_trainer.recut`); the job Succeeds.

Its losses, those the first gang logged before the node went and those the second logged after, are the
single-process reference's within the any-layout resume test's tolerances (tests/trainer/test_relayout.py): the
first step of each gang to 1e-5, the later ones to 1e-4 relative (reduction order differs with TP and drifts).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from paralleljob_contract import jobfile
from testcluster.api import REPO
from testcluster.product import Product
from testcluster.quickstart import JOB
from tests.trainer.reference import ReferenceStep, train_reference
from tests.upstream.helpers import (
    gang_runs,
    job_file,
    job_status,
    run_losing_a_node,
)

pytestmark = pytest.mark.slow
STEPS, CHECKPOINT_EVERY, BATCH = 20, 4, 16
FIRST_STEP_TOLERANCE, LATER_TOLERANCE = 1e-5, 1e-4


def budget_quickstart() -> dict[str, Any]:
    """examples/quickstart-on-a-cluster.yaml as a budget of two 2-GPU nodes with data 1, allowed to re-plan; the
    operator chooses the micro-batch and accumulation for the global batch of 16."""
    job = yaml.safe_load((REPO / "examples" / "quickstart-on-a-cluster.yaml").read_text())
    spec = job["spec"]
    spec["parallelism"], spec["gpusPerNode"] = {"nodes": 2, "data": 1}, 2
    for chosen in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        spec["deepspeed"].pop(chosen)
    spec["deepspeed"]["train_batch_size"] = BATCH
    spec["training"].update(steps=STEPS, logInterval=1)
    spec["checkpoint"]["intervalSteps"] = CHECKPOINT_EVERY
    spec["failurePolicy"] = {"backoffLimit": 2, "allowRelayout": True}
    return job


def layout_of(document: dict[str, Any]) -> tuple[int, int, int]:
    layout = document["plan"]["layout"]
    return layout["pipeline"], layout["tensor"], layout["data"]


def worst_relative(losses: dict[int, float], reference: dict[int, ReferenceStep], steps: list[int]) -> float:
    return max((abs(losses[step] - reference[step].loss) / abs(reference[step].loss) for step in steps), default=0)


@pytest.fixture
def product(tmp_path: Path) -> Iterator[Product]:
    with Product.running(tmp_path, nodes=2, gpus_per_node=2) as made:
        yield made


def test_a_budget_job_that_loses_a_node_resumes_at_another_pipeline_x_tensor_on_the_single_process_curve(
    product: Product, tmp_path: Path
) -> None:
    full, lost, corpus = run_losing_a_node(product, budget_quickstart(), tmp_path)
    pipeline, tensor, data = layout_of(full)
    assert (pipeline * tensor, data) == (4, 1), full["plan"]["layout"]

    status = job_status(product)
    assert status["phase"] == "Succeeded", product.what_was_seen()
    replanned = job_file(product, corpus)
    new_pipeline, new_tensor, new_data = layout_of(replanned)
    assert (new_pipeline * new_tensor, new_data) == (2, 1), replanned["plan"]["layout"]
    assert status["layout"] == f"{new_pipeline}x{new_tensor}x1" and status["restarts"] == 1, status
    assert len(status["placement"]) == 1 and status["placement"][0]["node"] != lost, status
    events = product.kubectl("get", "events", "--field-selector", f"involvedObject.name={JOB}")
    assert "Relayout" in events and "GrowBack" not in events, events
    progress = status.get("progress") or {}
    saved, resumed = f"PP{pipeline}xTP{tensor}xDP1", f"PP{new_pipeline}xTP{new_tensor}xDP1"
    assert (progress.get("resumedFromLayout"), progress.get("resumedAtLayout")) == (saved, resumed), progress
    assert full["deepspeed"]["train_batch_size"] == replanned["deepspeed"]["train_batch_size"] == BATCH
    # The reference trains whole global batches: either attempt's job file describes the unbroken run.
    reference = train_reference(jobfile.parse_job_config(full))
    assert train_reference(jobfile.parse_job_config(replanned)) == reference

    parts = gang_runs(product.checkpoints() / "metrics" / "metrics.jsonl")
    assert len(parts) == 2, f"one resume, by the re-planned gang: {parts}"
    before, after = parts
    assert after["resumed"] % CHECKPOINT_EVERY == 0, after
    assert CHECKPOINT_EVERY <= after["resumed"] <= min(max(before["losses"]), STEPS - CHECKPOINT_EVERY), (before, after)
    assert sorted(after["losses"]) == list(range(after["resumed"] + 1, STEPS + 1))
    for part in (before, after):
        losses = part["losses"]
        first = min(losses)
        assert abs(losses[first] - reference[first].loss) <= FIRST_STEP_TOLERANCE, (first, losses, reference[first])
        later = worst_relative(losses, reference, sorted(losses)[1:])
        assert later <= LATER_TOLERANCE, f"losses {losses} differ from the reference by {later:.2e} relative"
    assert reference[STEPS].loss < reference[1].loss - 0.05, "the run trained"
