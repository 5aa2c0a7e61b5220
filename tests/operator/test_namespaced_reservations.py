"""Reservations see every job of the cluster: two operators installed per namespace (the chart's
`watchNamespaces`, with the RBAC it renders) never place their jobs on the same nodes, one after the other or
at the same moment (the shared admission lock, `--admission-lock`), also when each release is left at its
defaults."""

from __future__ import annotations

from typing import Any

import pytest

from testcluster.server import UpstreamServer
from tests.chart.helpers import only, render
from tests.operator.helpers import (
    OPERATOR_AGENTS,
    Cluster,
    Operator,
    gpus_oversubscribed,
    install_operator_rbac,
    job_doc,
    wait_for,
)

TWO_NODES = {"pipeline": 2, "tensor": 4, "data": 1}


def test_operators_of_two_namespaces_never_place_two_jobs_on_the_same_nodes(cluster, apiserver, tmp_path):
    for namespace in ("team-a", "team-b"):
        cluster.create_namespace(namespace)  # with its default ServiceAccount: pods are refused before it
    cluster.add_nodes(2)
    # The chart's RBAC for these watchNamespaces: Roles in the two namespaces only, and the cluster-wide rules.
    kubeconfig = install_operator_rbac(apiserver, cluster.client, ("team-a", "team-b"))
    operators = []
    for team in ("team-a", "team-b"):
        log = tmp_path / f"operator-{team}.log"
        operators.append(Operator(apiserver, log, kubeconfig, [*Operator.ARGS, "--namespace", team]).start())
    try:
        cluster.apply(job_doc("first", "team-a", parallelism=TWO_NODES))  # both nodes
        wait_for(lambda: len(cluster.pods("first", "team-a")) == 2, what="the first job's pods")
        cluster.apply(job_doc("second", "team-b", parallelism=TWO_NODES))
        status = wait_for(lambda: scheduled_reason(cluster, "second", "team-b"), what="the second job's verdict")
        assert status == "Unschedulable"
        assert cluster.pods("second", "team-b") == []
    finally:
        for each in operators:
            each.stop()


def scheduled_reason(cluster: Cluster, name: str, namespace: str) -> str | None:
    conditions = {c["type"]: c for c in cluster.status(name, namespace).get("conditions") or []}
    return conditions.get("Scheduled", {}).get("reason")


LOCK_NAMESPACE = "paralleljob-locks"  # only the admission Lease lives here, so its calls are told apart
LOCK_FLAG = f"--admission-lock={LOCK_NAMESPACE}/paralleljob-admission"
VERDICTS = ("Admitted", "Placed", "Unschedulable")  # a job's Scheduled reason once its admission is decided
# Where every release's admission Lease is by default (the chart's admissionLock.namespace, the binary's
# --admission-lock): a namespace every cluster has, so that releases left at their defaults share it.
DEFAULT_LOCK_NAMESPACE = "kube-system"
# The Deployment's flags that the test's Operator sets itself (ports, logging, the trainer image).
FLAGS_THE_TEST_SETS = ("--liveness", "--metrics-port", "--log-format", "--log-level", "--trainer-image")


def operator_calls_since(apiserver: UpstreamServer, mark: int, verb: str, plural: str, namespace: str) -> int:
    calls = apiserver.calls[mark:]
    return sum(
        1 for c in calls if c[0] == verb and c[2] == plural and c[3] == namespace and c[4].startswith(OPERATOR_AGENTS)
    )


def test_two_operators_admitting_at_the_same_moment_take_turns_on_the_admission_lock(cluster, apiserver, tmp_path):
    for namespace in ("team-a", "team-b"):
        cluster.create_namespace(namespace)  # with its default ServiceAccount: pods are refused before it
    cluster.add_nodes(2)
    values = {"admissionLock": {"namespace": LOCK_NAMESPACE}}
    kubeconfig = install_operator_rbac(apiserver, cluster.client, ("team-a", "team-b"), values)
    operators = [
        Operator(
            apiserver, tmp_path / f"operator-{team}.log", kubeconfig, [*Operator.ARGS, "--namespace", team, LOCK_FLAG]
        )
        for team in ("team-a", "team-b")
    ]
    admit_at_the_same_moment(cluster, apiserver, operators, LOCK_NAMESPACE)


def release_at_defaults(team: str) -> tuple[dict[str, Any], str]:
    """The values of a team's release left at the chart's defaults (but for its name and watched namespace),
    and the namespace it is installed in."""
    return {"fullnameOverride": f"{team}-pj", "watchNamespaces": [team]}, f"{team}-ops"


def deployment_flags(values: dict[str, Any], namespace: str) -> list[str]:
    """The flags the release's Deployment runs the operator with, less those the test's Operator sets."""
    deployment = only(render(values, namespace), "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return [arg for arg in args if arg.split("=", 1)[0] not in FLAGS_THE_TEST_SETS]


@pytest.mark.parametrize(
    "flags", ["the-charts", "the-binarys"], ids=["with-the-charts-flags", "with-the-binarys-defaults"]
)
def test_two_releases_at_their_defaults_in_two_namespaces_never_place_two_jobs_on_the_same_nodes(
    cluster, apiserver, tmp_path, flags
):
    cluster.add_nodes(2)
    operators = []
    for team in ("team-a", "team-b"):
        cluster.create_namespace(team)  # with its default ServiceAccount: pods are refused before it
        values, namespace = release_at_defaults(team)
        kubeconfig = install_operator_rbac(apiserver, cluster.client, values=values, release_namespace=namespace)
        args = deployment_flags(values, namespace) if flags == "the-charts" else ["--namespace", team]
        operators.append(Operator(apiserver, tmp_path / f"operator-{team}.log", kubeconfig, [*Operator.ARGS, *args]))
    admit_at_the_same_moment(cluster, apiserver, operators, DEFAULT_LOCK_NAMESPACE)


def held_creates(server: UpstreamServer) -> list[tuple[str, str, str]]:
    """The ConfigMap creates waiting in the proxy now."""
    return [h for h in server.holding if h[:2] == ("create", "configmaps")]


def admit_at_the_same_moment(
    cluster: Cluster, apiserver: UpstreamServer, operators: list[Operator], lock_namespace: str
) -> None:
    """Start the two operators, create a two-node job for each at the same moment on a two-node cluster, and
    check that only one of them was placed."""
    for each in operators:
        each.start()
    server = apiserver
    # An admission's attempt ConfigMap is its first write after planning: holding it holds whichever operator
    # planned first right after it read the reservations, and lets the other one go as far as it can.
    server.held.add(("create", "configmaps"))
    try:
        cluster.apply(job_doc("first", "team-a", parallelism=TWO_NODES))  # both nodes
        cluster.apply(job_doc("second", "team-b", parallelism=TWO_NODES))  # both nodes too
        # The proxy records a request once it is answered: a held one is seen in `holding` while it waits.
        wait_for(lambda: held_creates(server), what="the first admission's write")
        first_create = len(server.calls)
        # The other operator either planned too (it creates its own ConfigMap) or waits on the lock (it reads
        # the Lease again and again while the first one holds it).
        wait_for(
            lambda: (
                len(held_creates(server)) == 2
                or operator_calls_since(server, first_create, "get", "leases", lock_namespace) >= 2
            ),
            what="the second operator's admission",
        )
        server.held.discard(("create", "configmaps"))
        jobs = (("first", "team-a"), ("second", "team-b"))

        def verdicts() -> list[str] | None:
            found = [scheduled_reason(cluster, job, team) for job, team in jobs]
            return sorted(str(r) for r in found) if all(r in VERDICTS for r in found) else None

        found = wait_for(verdicts, what="both jobs' verdicts")
        assert "Unschedulable" in found, f"both jobs were placed on the same two nodes: {found}"
        # The admitted one creates its pods next (a verdict of Admitted comes before them).
        placed = wait_for(lambda: [job for job, team in jobs if cluster.pods(job, team)], what="the placed job's pods")
        assert len(placed) == 1, f"both jobs got pods on the same two nodes: {placed}"
        assert gpus_oversubscribed(apiserver) == []
    finally:
        server.held.clear()
        for each in operators:
            each.stop()
