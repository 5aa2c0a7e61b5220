"""What the tests of tests/operator share besides their fixtures (those stay in conftest.py): import these from here,
never from a conftest.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from testcluster import polling
from testcluster import server as upstream
from testcluster.admin import TWO_NODES, Cluster, job_doc, wait_for
from testcluster.chart import chart_leader_election_args, chart_lease_name, install_operator_rbac, read_chart_lease
from testcluster.operators import Operator, OtherHolder, fresh_view
from testcluster.server import UpstreamServer

# The cluster, the operator process and the chart's parts are testcluster's (the benchmarks use them too); the
# operator's tests import them from here with the helpers that are theirs alone.
__all__ = [
    "OPERATOR_AGENTS",
    "TWO_NODES",
    "Cluster",
    "Operator",
    "OtherHolder",
    "chart_leader_election_args",
    "chart_lease_name",
    "finish_operator_passes",
    "fresh_view",
    "generations_overlapping",
    "gpus_oversubscribed",
    "install_operator_rbac",
    "job_doc",
    "made_here",
    "operator_calls",
    "operator_requests",
    "printed_row",
    "read_chart_lease",
    "restarted",
    "wait_for",
]

OPERATOR_AGENTS = ("kopf", "paralleljob-operator")  # kopf's own requests, and paralleljob.k8s's


def operator_calls(server: UpstreamServer) -> list[tuple[str, str, str, str]]:
    """(verb, group, resource, namespace) of every resource request the operator process made (through the
    proxy)."""
    return [call[:4] for call in server.calls if call[4].startswith(OPERATOR_AGENTS) and call[2]]


# What the cluster itself puts in every namespace: the controller-manager's root CA ConfigMap and `default`
# ServiceAccount.
CLUSTER_MADE = frozenset({"kube-root-ca.crt", "default"})


def made_here(listing: Any) -> list[str]:
    """Names of the objects of a listing, less what the cluster itself puts in every namespace."""
    return sorted(item.metadata.name for item in listing.items if item.metadata.name not in CLUSTER_MADE)


def operator_requests(server: UpstreamServer) -> list[tuple[str, str, str, str]]:
    """paralleljob.k8s's requests (kopf's list-and-watch is the framework's, made once at startup)."""
    return [c[:4] for c in server.calls if c[4].startswith("paralleljob-operator") and c[2]]


def finish_operator_passes(cluster: Cluster, name: str = "gpt", namespace: str = "research") -> None:
    """Return once the passes the operator started on the job before this call have most likely ended, shown by
    recorded requests: a job's passes run one after another (its coalescer key), and each begins by reading its
    attempt record (a ConfigMap) and then the job, so a record read after a poke followed by a job read is a
    pass that began after the poke; the second poke's is later than every pass begun before this call. A job
    read alone after the poke is not enough: the tail of a pass begun earlier (a pass was still running when
    the poke landed) can make it, and the poke's own pass is then still to come. Not a proof: one pass may read
    a ConfigMap and its job more than once. A test that needs one write of a pass waits for that write itself,
    then calls this to let what follows it settle."""
    for poke in ("1", "2"):
        mark = len(cluster.server.calls)
        patch = {"metadata": {"labels": {"test.paralleljob.io/poke": f"{time.monotonic_ns()}-{poke}"}}}
        cluster.custom.patch_namespaced_custom_object(
            "paralleljob.io", "v1alpha1", namespace, "paralleljobs", name, patch
        )

        def read_since(mark: int = mark) -> bool:
            later = [
                c[2] for c in cluster.server.calls[mark:] if c[0] == "get" and c[4].startswith("paralleljob-operator")
            ]
            return "configmaps" in later and "paralleljobs" in later[later.index("configmaps") :]

        wait_for(read_since, what=f"the operator's pass over the change {poke}")
    # A pass begun before the second poke can still make that pair (the first poke's own, when an earlier pass
    # held it back), with the second poke's pass still to come: wait until the operator has sent nothing for a
    # second, far longer than the gap between one pass and the next queued behind it.
    _wait_until_quiet(cluster, seconds=1.0)


def _wait_until_quiet(cluster: Cluster, seconds: float) -> None:
    """Return once the operator has made no request through the proxy for `seconds`."""

    def count() -> int:
        return sum(1 for c in cluster.server.calls if c[4].startswith("paralleljob-operator"))

    polling.wait_until_steady(count, seconds, what="the operator's requests to stop", interval=0.1)


def _history(server: UpstreamServer) -> list[upstream.Change]:
    """The pod changes a test replays: the node agent's watch."""
    assert server.agent.gaps == 0, "the pod watch expired: the history has a gap"
    return server.history


def generations_overlapping(server: Any, job: str = "gpt") -> list[str]:
    """Replays the history of the job's pods (the node agent's watch): every moment a pod of one attempt was
    created while a pod of another attempt still existed (Terminating included)."""
    live: dict[str, str] = {}
    overlaps = []
    for change in _history(server):
        if change.plural != "pods" or change.labels.get("paralleljob.io/job") != job:
            continue
        attempt = change.labels.get("paralleljob.io/attempt", "")
        if change.kind == "DELETED":
            live.pop(change.name, None)
            continue
        if change.kind == "ADDED" and any(other != attempt for other in live.values()):
            overlaps.append(f"{change.name} (attempt {attempt}) created while {sorted(live.items())} existed")
        live[change.name] = attempt
    return overlaps


def gpus_oversubscribed(server: Any, gpus_per_node: int = 4) -> list[str]:
    """Replays the history of every pod: each moment the pods pinned to a node (label paralleljob.io/node)
    and not finished requested more GPUs than the node has."""
    holding: dict[tuple[str, str], tuple[str, int]] = {}
    found = []
    for change in _history(server):
        node = change.labels.get("paralleljob.io/node")
        if change.plural != "pods" or not node:
            continue
        key = (change.namespace, change.name)
        if change.kind == "DELETED" or change.phase in ("Succeeded", "Failed"):
            holding.pop(key, None)
            continue
        holding[key] = (node, change.gpus)
        used = sum(gpus for held_node, gpus in holding.values() if held_node == node)
        if used > gpus_per_node:
            found.append(f"{node}: {used} GPUs requested after {change.kind} {key}")
    return found


def restarted(cluster, attempt, pods=16):
    found = cluster.pods()
    attempts = {p["metadata"]["labels"]["paralleljob.io/attempt"] for p in found}
    return len(found) == pods and attempts == {str(attempt)} and cluster.status().get("restarts") == attempt


KUBECTL = Path(__file__).resolve().parents[2] / ".tools" / "bin" / "kubectl"


def kubectl() -> str:
    if KUBECTL.is_file() and os.access(KUBECTL, os.X_OK):
        return str(KUBECTL)
    found = shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl not found: run scripts/install-k8s-tools.sh", pytrace=False)
    return found


def printed_row(kubeconfig: Path, columns: list[dict]) -> dict[str, str]:
    """One job's row of `kubectl get -o custom-columns`, split at the header's column starts."""
    spec = ",".join(f"{c['name'].upper()}:{c['jsonPath']}" for c in columns)
    completed = subprocess.run(
        [
            kubectl(),
            "--kubeconfig",
            str(kubeconfig),
            "get",
            "paralleljobs.paralleljob.io",
            "gpt",
            "-n",
            "research",
            "-o",
            f"custom-columns={spec}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    header, row = completed.stdout.splitlines()
    starts = [match.start() for match in re.finditer(r"\S+", header)]
    ends = [*starts[1:], None]
    return {column["name"]: row[start:end].strip() for column, start, end in zip(columns, starts, ends, strict=True)}
