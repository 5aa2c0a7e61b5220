"""The operator's own log, read as a platform engineer reads `kubectl logs` of its pod: at the chart's default
level (info), leader election says who leads once, not once per renewal."""

from __future__ import annotations

import time
from pathlib import Path

from testcluster import controlplane, polling
from testcluster.api import Api
from tests.operator.helpers import Operator


def test_a_leader_logs_its_election_once_not_every_renewal(
    upstream: controlplane.State, admin_api: Api, namespace: str, tmp_path: Path
) -> None:
    log = tmp_path / "operator.log"
    args = (
        *("--log-level", "info", "--leader-elect", "--leader-election-namespace", namespace),
        *("--lease-seconds", "3", "--namespace", namespace, "--admission-lock", "none"),
    )
    operator = Operator(None, log, upstream.kubeconfig, args=args).start()  # type: ignore[arg-type]
    try:
        # Leading first (a loaded machine's kopf may take more than 10 s to start: seen in a rehearsal), then a
        # 3 s Lease is renewed every 3/7 s: 20 renewals or more in the next 10 s.
        leads = lambda: log.exists() and "leads: it holds the Lease" in log.read_text()  # noqa: E731
        polling.wait_for(leads, 120, "the operator to lead", interval=0.2)
        time.sleep(10)
    finally:
        operator.stop()
    text = log.read_text()
    assert "leads: it holds the Lease" in text, text[-2000:]
    renewals = [line for line in text.splitlines() if "has successfully acquired lease" in line]
    assert len(renewals) <= 1, f"{len(renewals)} renewal lines in 10 s"
