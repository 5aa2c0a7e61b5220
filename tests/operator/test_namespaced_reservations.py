"""Reservations see every job of the cluster: two operators installed per namespace (the chart's
`watchNamespaces`, with the RBAC it renders) never place their jobs on the same nodes."""

from __future__ import annotations

from tests.operator.conftest import Cluster, Operator, install_operator_rbac, job_doc, wait_for

TWO_NODES = {"pipeline": 2, "tensor": 4, "data": 1}


def test_operators_of_two_namespaces_never_place_two_jobs_on_the_same_nodes(cluster, emulator, tmp_path):
    for namespace in ("team-a", "team-b"):
        cluster.core.create_namespace({"metadata": {"name": namespace}})
    cluster.add_nodes(2)
    # The chart's RBAC for these watchNamespaces: Roles in the two namespaces only, and the cluster-wide rules.
    kubeconfig = install_operator_rbac(emulator, cluster.client, ("team-a", "team-b"))
    operators = []
    for team in ("team-a", "team-b"):
        log = tmp_path / f"operator-{team}.log"
        operators.append(Operator(emulator, log, kubeconfig, [*Operator.ARGS, "--namespace", team]).start())
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
