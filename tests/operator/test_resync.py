"""The periodic resync: a running gang whose pod deletion the watch never delivered is still judged."""

from __future__ import annotations

import pytest

from tests.operator.helpers import Operator, job_doc, wait_for


@pytest.fixture
def operator_args():
    return [*Operator.ARGS, "--resync-period", "2"]


def test_a_pod_deletion_the_watch_missed_is_found_by_the_resync(cluster, operator, apiserver):
    cluster.add_nodes(16)
    cluster.apply(job_doc())
    cluster.start_running()
    apiserver.muted.add("pods")  # the pod watch loses what follows, as across a watch restart
    cluster.core.delete_namespaced_pod("gpt-5", "research", grace_period_seconds=0)
    status = wait_for(lambda: cluster.status().get("restarts") == 1 and cluster.status(), timeout=20, what="restart")
    assert "gpt-5" in status["message"] or "node rank 5" in status["message"]
