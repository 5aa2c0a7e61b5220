"""A replica whose start failed and was run again leads and acts (issue 39).

kopf runs a start that raised again. The start had campaigned for the Lease before it served the metrics port,
so a replica whose port was taken (two replicas on one host network: the upstream product test's process kubelet)
took the Lease with its first candidacy, failed, and started again with a second one, which the fence asks and
which never got the Lease its own first candidacy kept renewing. That replica held the Lease and acted on nothing:
after the leader's eviction the job stayed Restarting ("placed 2 node ranks; creating pods") for good, and no
standby could take over. Here the metrics port is held by the test when the operator starts, and freed once the
operator has said so; the job applied after the start ran again must be placed.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from tests.operator.helpers import TWO_NODES, Operator, chart_leader_election_args, job_doc, wait_for


@pytest.fixture
def taken_port() -> Iterator[socket.socket]:
    """A port bound and listened on, as another process on the same network holds it."""
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        yield held


@pytest.fixture
def operator_args(taken_port: socket.socket) -> list[str]:
    port = str(taken_port.getsockname()[1])
    return [*Operator.ARGS, *chart_leader_election_args(), "--metrics-port", port, "--log-level", "info"]


def test_a_start_run_again_after_its_metrics_port_was_taken_leads_and_places_a_job(
    cluster, operator, taken_port, tmp_path
):
    log = tmp_path / "operator.log"
    wait_for(lambda: "Address already in use" in log.read_text(), timeout=60, what="the start refused its port")
    taken_port.close()
    wait_for(lambda: "paralleljob operator started" in log.read_text(), timeout=60, what="the start run again")
    cluster.add_nodes(2)
    cluster.apply(job_doc(parallelism=TWO_NODES))
    wait_for(lambda: len(cluster.pods()) == 2, timeout=60, what="the job's pods, made by the replica that leads")
    assert "not acting" not in log.read_text()
