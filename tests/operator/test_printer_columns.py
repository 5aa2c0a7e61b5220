"""`kubectl get pj` columns: the CRD's additionalPrinterColumns JSONPaths evaluated on a live job.

kubectl evaluates these simple `.a.b` paths client side; `column_value` does the same.
"""

from __future__ import annotations

from paralleljob.api import crd
from tests.operator.conftest import job_doc, wait_for


def column_value(obj, path):
    value = obj
    for part in path.lstrip(".").split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def test_printer_columns_show_layout_gpus_phase_step_loss_restarts(cluster, operator):
    cluster.add_nodes(16)
    cluster.apply(job_doc())
    wait_for(lambda: len(cluster.pods()) == 16, what="pods")
    wait_for(lambda: cluster.status().get("message", "").startswith("16 pods"), what="placed")
    cluster.bind_all()
    wait_for(lambda: cluster.status().get("phase") == "Running", what="Running")
    # What rank 0's progress hook writes (tests/operator/test_progress_hook.py drives the real hook).
    progress = {"step": 42, "totalSteps": 100, "loss": 3.25, "tokensPerSecond": 1.5e5}
    cluster.custom.patch_namespaced_custom_object_status(
        "paralleljob.io",
        "v1alpha1",
        "research",
        "paralleljobs",
        "gpt",
        {"status": {"progress": progress, "lastCheckpointStep": 40}},
    )
    job = cluster.job()
    columns = crd.build_crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    row = {c["name"]: column_value(job, c["jsonPath"]) for c in columns}
    assert row["Layout"] == "4x4x4"
    assert row["GPUs"] == 64
    assert row["Nodes"] == 16
    assert row["Phase"] == "Running"
    assert row["Step"] == 42
    assert row["Loss"] == 3.25
    assert row["Restarts"] == 0
    assert row["Age"]
    assert row["Tokens/s"] == 1.5e5
    assert row["Checkpoint"] == 40
    assert row["Message"] == "all 16 pods running"
