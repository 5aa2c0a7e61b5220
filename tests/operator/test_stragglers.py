"""A straggler rank 0 reports is named by the operator on the upstream control plane: status.progress.stragglers
(with the node from the placement), the Straggler condition, a SlowNode Event, and the wide Stragglers column."""

from __future__ import annotations

import json

from paralleljob.api import crd
from tests.operator.conftest import job_doc, wait_for
from tests.operator.test_printer_columns import printed_row

TWO_REPLICAS = {"parallelism": {"pipeline": 1, "tensor": 4, "data": 2}}


def report(cluster, **data: str) -> None:
    """What rank 0's hook does: merge-patch the data of the job's progress ConfigMap."""
    cluster.core.patch_namespaced_config_map("gpt-progress", "research", {"data": data})


def test_a_reported_straggler_is_named_in_status_condition_event_and_column(cluster, operator, apiserver):
    cluster.add_nodes(2)
    cluster.apply(job_doc(**TWO_REPLICAS))
    wait_for(lambda: len(cluster.pods()) == 2, what="2 pods")
    cluster.bind_all()
    status = wait_for(lambda: cluster.status().get("phase") == "Running" and cluster.status(), what="Running")
    node = next(p["node"] for p in status["placement"] if p["nodeRank"] == 1)
    named = [{"nodeRank": 1, "factor": 2.57, "stage": 0, "steps": [21, 40]}]
    report(cluster, step="40", stragglers=json.dumps(named))

    status = wait_for(lambda: cluster.status()["progress"].get("stragglers") and cluster.status(), what="copied")
    assert status["progress"]["stragglers"] == [{**named[0], "node": node}]
    condition = wait_for(
        lambda: next((c for c in cluster.status().get("conditions", []) if c["type"] == "Straggler"), None),
        what="the Straggler condition",
    )
    assert (condition["status"], condition["reason"]) == ("True", "SlowNode")
    assert f"{node} (node rank 1, stage 0) computed 2.57x" in condition["message"]
    event = wait_for(lambda: [e for e in cluster.events() if e["reason"] == "SlowNode"], what="a SlowNode Event")
    assert "steps 21-40" in event[0]["message"] and event[0]["type"] == "Warning"
    columns = crd.build_crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    assert printed_row(apiserver.kubeconfig, columns)["Stragglers"] == node

    # The next window names nobody: the condition turns False, no further Event, the column empties.
    report(cluster, step="60", stragglers="[]")
    wait_for(
        lambda: any(c["type"] == "Straggler" and c["status"] == "False" for c in cluster.status()["conditions"]),
        what="Straggler False",
    )
    assert cluster.status()["progress"]["stragglers"] == []
    assert len([e for e in cluster.events() if e["reason"] == "SlowNode"]) == 1
    # Rank 0 names nodes; it never moves a pod.
    assert all(pod["status"]["phase"] == "Running" for pod in cluster.pods())
