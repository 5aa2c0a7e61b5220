"""The chart's RBAC is what the operator uses, both ways. The operator runs with the Deployment's own arguments as
the chart's ServiceAccount (the chart's RBAC from `helm template`, applied; a token from the TokenRequest API) on
the upstream server, once watching every namespace and once the one namespace the chart lists, and reconciles the
quickstart through a start, a gang restart and completion. Then no call it made was refused (the `apiserver`
fixture fails a test on any 403), every call is allowed by a rule of the chart, and every rule of the chart is
used by a call (the few exceptions are named and explained below).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from paralleljob.manifests import rbac as progress_rbac
from testcluster import controlplane
from testcluster.server import UpstreamServer
from tests.chart.helpers import RELEASE_NAMESPACE, REPO, only, render
from tests.operator.helpers import Cluster, Operator, install_operator_rbac, operator_calls, wait_for

JOB_NAMESPACE = "research"
JOB = "quickstart"


def deployment_args(values: dict[str, Any]) -> list[str]:
    """The Deployment's arguments, with its two listening ports moved to free ones on this machine."""
    deployment = only(render(values), "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    moved = {
        "--liveness": f"--liveness=http://127.0.0.1:{controlplane.free_port()}/healthz",
        "--metrics-port": f"--metrics-port={controlplane.free_port()}",
    }
    return [moved.get(arg.split("=", 1)[0], arg) for arg in args]


# -- RBAC: what the chart allows, and what the operator did --------------------------------------------------

Grant = tuple[str, str, str, str]  # (scope: "" for cluster-wide or a namespace, group, resource, verb)


def chart_grants(objects: list[dict[str, Any]], account: str) -> set[tuple[str, str, str, str, str]]:
    """(role, scope, group, resource, verb) for every rule bound to the operator's account; scope "*" is any."""
    roles = {
        (o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
        for o in objects
        if o["kind"] in {"ClusterRole", "Role"}
    }
    granted = set()
    for binding in (o for o in objects if o["kind"] in {"ClusterRoleBinding", "RoleBinding"}):
        if not any(s["kind"] == "ServiceAccount" and s["name"] == account for s in binding["subjects"]):
            continue
        namespace = binding["metadata"].get("namespace")
        ref = binding["roleRef"]
        role = roles[(ref["kind"], namespace if ref["kind"] == "Role" else None, ref["name"])]
        scope = "*" if binding["kind"] == "ClusterRoleBinding" else namespace
        role_id = f"{role['kind']}/{role['metadata']['name']}"
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        granted.add((role_id, scope, group, resource, verb))
    return granted


def allows(grant: tuple[str, str, str, str, str], call: tuple[str, str, str, str]) -> bool:
    _, scope, group, resource, verb = grant
    call_verb, call_group, call_resource, call_namespace = call
    in_scope = scope == "*" or (call_namespace != "" and scope == call_namespace)
    return in_scope and (group, resource, verb) == (call_group, call_resource, call_verb)


def progress_role_needs() -> set[tuple[str, str, str]]:
    """What the operator grants each job's progress account, and so must hold itself (no `escalate`)."""
    owner = {
        "metadata": {"name": JOB, "namespace": JOB_NAMESPACE, "uid": "u"},
        "apiVersion": "paralleljob.io/v1alpha1",
        "kind": "ParallelJob",
    }
    return {
        (g, r, v)
        for rule in progress_rbac.build_role(owner)["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


# Permissions the chart holds although the operator never calls them, each for a reason:
# - nodes get: issue #7 lists get, list and watch on nodes; get reveals nothing that list does not (the
#   operator gets a node only when a gang's node is missing from its Node watch).
# - pods get: read only when creating a rank's pod finds its name taken (tests/operator/test_name_conflicts.py).
# - priorityclasses get: read only for a job whose pods name a PriorityClass; the example job names none.
UNUSED_BUT_INTENDED = {("", "nodes", "get"), ("", "pods", "get"), ("scheduling.k8s.io", "priorityclasses", "get")}
# - events create in the release namespace: the RivalOperator Event on the operator's Lease, posted only when
#   another operator manages the same namespaces (tests/operator/test_leader_election.py).
# - leases get in kube-node-lease: read only when a gang reports a peer lost (tests/operator/test_lost_peers.py).
UNUSED_IN_SCOPE_BUT_INTENDED = {
    (RELEASE_NAMESPACE, "", "events", "create"),
    ("kube-node-lease", "coordination.k8s.io", "leases", "get"),
}


def unused_grants(
    granted: set[tuple[str, str, str, str, str]], calls: set[tuple[str, str, str, str]]
) -> list[tuple[str, str, str, str, str]]:
    intended = UNUSED_BUT_INTENDED | progress_role_needs()
    return sorted(
        g
        for g in granted
        if g[2:] not in intended and g[1:] not in UNUSED_IN_SCOPE_BUT_INTENDED and not any(allows(g, c) for c in calls)
    )


def forbidden_calls(
    granted: set[tuple[str, str, str, str, str]], calls: set[tuple[str, str, str, str]]
) -> list[tuple[str, str, str, str]]:
    return sorted(c for c in calls if not any(allows(g, c) for g in granted))


# -- the scenario ------------------------------------------------------------------------------------------

SCENARIOS = {
    "all-namespaces": {},
    "listed-namespaces": {"watchNamespaces": [JOB_NAMESPACE]},
}


def attempt_pods(cluster: Cluster, operator: Operator, attempt: int) -> list[dict[str, Any]] | None:
    """The job's two pods once they are all of the attempt's, none of an earlier one left."""
    assert operator.process is not None and operator.process.poll() is None, operator.log.read_text()[-4000:]
    pods = cluster.pods(JOB, JOB_NAMESPACE)
    current = [p for p in pods if p["metadata"]["labels"].get("paralleljob.io/attempt") == str(attempt)]
    return current if len(current) == 2 and len(pods) == 2 else None


def phase(cluster: Cluster) -> str | None:
    return cluster.status(JOB, JOB_NAMESPACE).get("phase")


def drive_the_job(cluster: Cluster, operator: Operator) -> dict[str, Any]:
    """Start, fail one pod (a gang restart), then finish, playing the scheduler and the kubelets; returns the
    job's final status."""
    first = wait_for(lambda: attempt_pods(cluster, operator, 0), what="the first attempt's 2 pods")
    assert sorted(p["metadata"]["name"] for p in first) == [f"{JOB}-0", f"{JOB}-1"]
    cluster.bind_all(JOB, JOB_NAMESPACE)
    wait_for(lambda: phase(cluster) == "Running", what="phase Running")
    cluster.set_pod_phase(f"{JOB}-1", "Failed", JOB_NAMESPACE)
    wait_for(lambda: cluster.status(JOB, JOB_NAMESPACE).get("restarts") == 1, what="restarts=1")
    wait_for(lambda: attempt_pods(cluster, operator, 1), what="the second attempt's 2 pods")
    cluster.bind_all(JOB, JOB_NAMESPACE)
    wait_for(lambda: phase(cluster) == "Running", what="phase Running again")
    cluster.set_pod_phase(f"{JOB}-0", "Succeeded", JOB_NAMESPACE)
    wait_for(lambda: phase(cluster) == "Succeeded", what="phase Succeeded")

    def unfinished() -> list[str]:
        pods = cluster.pods(JOB, JOB_NAMESPACE)
        return [p["metadata"]["name"] for p in pods if p["status"].get("phase") not in ("Succeeded", "Failed")]

    wait_for(lambda: not unfinished(), what="the remaining pods to be cleaned up")
    return cluster.status(JOB, JOB_NAMESPACE)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_operator_calls_exactly_what_the_chart_allows(
    scenario: str, server: UpstreamServer, cluster: Cluster, tmp_path: Path
) -> None:
    values = SCENARIOS[scenario]
    kubeconfig = install_operator_rbac(server, cluster.client, values=values)
    cluster.add_nodes(3)
    operator = Operator(server, tmp_path / "operator.log", kubeconfig, deployment_args(values)).start()
    try:
        job = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
        job["metadata"]["namespace"] = JOB_NAMESPACE
        cluster.apply(job)
        final = drive_the_job(cluster, operator)
    finally:
        operator.stop()
        sys.stderr.write(operator.log.read_text()[-4000:])  # shown when the test fails, as the `operator` fixture does
    assert (final["phase"], final["restarts"]) == ("Succeeded", 1)
    objects = render(values)
    granted = chart_grants(objects, only(objects, "ServiceAccount")["metadata"]["name"])
    calls = set(operator_calls(server))
    assert forbidden_calls(granted, calls) == [], "the operator called what the chart does not allow"
    assert unused_grants(granted, calls) == [], "the chart allows what the operator never called"


def test_the_rbac_check_notices_a_missing_and_an_unused_permission() -> None:
    granted = {("ClusterRole/x", "*", "", "pods", "list"), ("Role/y", "ns", "", "pods", "delete")}
    calls = {("list", "", "pods", ""), ("create", "", "pods", "ns"), ("delete", "", "pods", "other")}
    assert forbidden_calls(granted, calls) == [("create", "", "pods", "ns"), ("delete", "", "pods", "other")]
    assert unused_grants(granted, calls) == [("Role/y", "ns", "", "pods", "delete")]
