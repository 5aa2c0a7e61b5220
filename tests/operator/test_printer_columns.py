"""`kubectl get pj` columns: the CRD's additionalPrinterColumns evaluated by the real kubectl on a live job.

kubectl evaluates `-o custom-columns` JSONPaths client side, the same evaluator that prints the CRD's columns
when the API server returns plain objects; the columns are taken from the generated CRD, so a wrong path
shows up as <none>. kubectl comes from scripts/install-k8s-tools.sh (.tools/bin).
"""

from __future__ import annotations

from paralleljob.api import crd
from tests.operator.helpers import job_doc, printed_row, wait_for


def test_printer_columns_show_layout_gpus_phase_step_loss_restarts(cluster, operator, apiserver):
    cluster.add_nodes(16)
    cluster.apply(job_doc())
    wait_for(lambda: len(cluster.pods()) == 16, what="pods")
    wait_for(lambda: cluster.status().get("message", "").startswith("16 pods"), what="placed")
    cluster.bind_all()
    wait_for(lambda: cluster.status().get("phase") == "Running", what="Running")
    # What the operator copies from rank 0's progress ConfigMap (tests/operator/test_progress_channel.py).
    progress = {"step": 42, "totalSteps": 100, "loss": 3.25, "tokensPerSecond": 1.5e5, "validationLoss": 3.5}
    cluster.custom.patch_namespaced_custom_object_status(
        "paralleljob.io",
        "v1alpha1",
        "research",
        "paralleljobs",
        "gpt",
        {"status": {"progress": progress, "lastCheckpointStep": 40}},
    )
    columns = crd.build_crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    row = printed_row(apiserver.kubeconfig, columns)
    assert row == row | {
        "Layout": "4x4x4",
        "GPUs": "64",
        "Nodes": "16",
        "Phase": "Running",
        "Step": "42",
        "Loss": "3.25",
        "Restarts": "0",
        "Tokens/s": "150000",
        "Val-loss": "3.5",
        "Checkpoint": "40",
        "Message": "all 16 pods running",
    }
    assert row["Age"] == cluster.job()["metadata"]["creationTimestamp"]
