"""Failover with leader election: how long no operator acts when the leader stops, and how fast a leader that
lost its Lease stops.

    .venv/bin/python -m bench.leader_failover [--lease-seconds 15] [--repeat 2]

Each round starts `paralleljob operator --leader-elect` (the chart's Lease flags, with the chart's RBAC, through
the fault proxy) on the operator tests' upstream control plane (testcluster/server.py; one for every round,
reset between rounds as between tests) while another holder renews the Lease every 0.5 s, creates a 2-node job,
and then:
1. takeover: the holder stops renewing; measured from its last renewal to the moment the Lease names the
   operator (Lease expiry as the client's election sees it: counted from when it last saw the record change,
   plus a retry period), and to the first pod of the job the operator creates (then the recheck of every
   unfinished job, the admission and the creates);
2. fencing: another holder takes the Lease over; measured from that write to the old leader's exit (at most
   the renew deadline, 2/3 of the Lease, plus one renewal period).
Figures are recorded in docs/install.md ("High availability").
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from testcluster import server as upstream
from testcluster.admin import TWO_NODES, Cluster, job_doc, wait_for
from testcluster.api import RELEASE_NAMESPACE
from testcluster.chart import chart_leader_election_args, chart_lease_name, install_operator_rbac, read_chart_lease
from testcluster.operators import Operator, OtherHolder
from testcluster.server import UpstreamServer


def lease_holder(cluster: Cluster) -> str:
    return str(read_chart_lease(cluster.client).spec.holder_identity)


def one_round(server: UpstreamServer, workdir: Path, lease_seconds: int) -> tuple[float, float, float]:
    cluster = Cluster(server)
    kubeconfig = install_operator_rbac(server, cluster.client)
    holder = OtherHolder(cluster, RELEASE_NAMESPACE, chart_lease_name(), "replica-b").take()
    args = [*Operator.ARGS, *chart_leader_election_args(), "--lease-seconds", str(lease_seconds)]
    log = workdir / "operator.log"
    operator = Operator(server, log, kubeconfig, args).start()
    try:
        cluster.add_nodes(2)
        cluster.apply(job_doc(parallelism=TWO_NODES))
        wait_for(lambda: "is held by replica-b" in log.read_text(), timeout=120, what="the standby")
        holder.release()
        stopped = time.monotonic()
        wait_for(lambda: lease_holder(cluster) != "replica-b", timeout=120, what="the Lease taken")
        taken_over = time.monotonic() - stopped
        wait_for(lambda: cluster.pods(), timeout=120, what="the first pod")
        takeover = time.monotonic() - stopped
        usurper = OtherHolder(cluster, RELEASE_NAMESPACE, chart_lease_name(), "usurper").take()
        taken = time.monotonic()
        wait_for(lambda: operator.process is not None and operator.process.poll() is not None, timeout=60)
        fenced = time.monotonic() - taken
        usurper.release()
    finally:
        holder.release()
        operator.stop()
    return taken_over, takeover, fenced


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lease-seconds", type=int, default=15)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="leader-failover-"))
    rounds = []
    try:
        with contextlib.contextmanager(upstream.started)(workdir) as server:
            for number in range(args.repeat):
                # Each round on the cluster as it was after start-up, as each operator test begins.
                server.begin()
                folder = workdir / f"round-{number}"
                folder.mkdir()
                rounds.append(one_round(server, folder, args.lease_seconds))
                assert server.denied == [], server.denied
                server.reset()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    leases, takeovers, exits = ([r[i] for r in rounds] for i in range(3))
    print(f"lease {args.lease_seconds} s, {args.repeat} rounds")
    print(
        f"Lease taken (holder's last renewal -> Lease names the operator): median {statistics.median(leases):.1f} s, "
        f"max {max(leases):.1f} s"
    )
    print(
        f"takeover (holder's last renewal -> first pod): median {statistics.median(takeovers):.1f} s, "
        f"max {max(takeovers):.1f} s"
    )
    print(
        f"fencing (Lease taken over -> old leader exited): median {statistics.median(exits):.1f} s, "
        f"max {max(exits):.1f} s"
    )


if __name__ == "__main__":
    main()
