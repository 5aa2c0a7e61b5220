"""With the chart's slowNodeLabel enabled (--slow-node-label), a node the operator names slow is labelled for
the cluster's administrators, on the upstream control plane; the node is neither cordoned nor changed otherwise,
and its peers are not labelled. (Off, the default, no node is ever written: tests/operator/test_stragglers.py
runs without the flag, and the chart grants no node patch then, tests/chart/test_rbac.py.)"""

from __future__ import annotations

import json
import sys

import pytest

from tests.operator.helpers import Operator, install_operator_rbac, job_doc, wait_for

KEY = "example.com/slow-node"


@pytest.fixture
def operator(server, cluster, tmp_path):
    """The operator with the chart's RBAC and flag for slowNodeLabel enabled (node patch granted)."""
    kubeconfig = install_operator_rbac(server, cluster.client, values={"slowNodeLabel": {"enabled": True, "key": KEY}})
    process = Operator(server, tmp_path / "operator.log", kubeconfig, [*Operator.ARGS, f"--slow-node-label={KEY}"])
    yield process.start()
    process.stop()
    sys.stderr.write((tmp_path / "operator.log").read_text()[-4000:])


def test_a_node_named_slow_is_labelled_for_administrators_and_its_peer_is_not(cluster, operator):
    cluster.add_nodes(2)
    cluster.apply(job_doc(parallelism={"pipeline": 1, "tensor": 4, "data": 2}))
    wait_for(lambda: len(cluster.pods()) == 2, what="2 pods")
    cluster.bind_all()
    status = wait_for(lambda: cluster.status().get("phase") == "Running" and cluster.status(), what="Running")
    slow, peer = (next(p["node"] for p in status["placement"] if p["nodeRank"] == rank) for rank in (1, 0))
    named = [{"nodeRank": 1, "factor": 2.57, "stage": 0, "steps": [21, 40]}]
    # What rank 0's hook does: merge-patch the data of the job's progress ConfigMap.
    cluster.core.patch_namespaced_config_map("gpt-progress", "research", {"data": {"stragglers": json.dumps(named)}})

    labelled = wait_for(
        lambda: (cluster.core.read_node(slow).metadata.labels or {}).get(KEY), what="the slow node labelled"
    )
    assert labelled == "true"
    assert KEY not in (cluster.core.read_node(peer).metadata.labels or {})
    assert not cluster.core.read_node(slow).spec.unschedulable
    assert [e for e in cluster.events() if e["reason"] == "SlowNode"]
