"""The chart on an API server: `helm template | kubectl apply` against the strict cluster (tests/cluster), then
the operator, run with the Deployment's own arguments as the chart's ServiceAccount (its token, so RBAC is
enforced on every call), reconciles an example job through a start, a gang restart and completion. The API calls
it made are then checked against the chart's RBAC, both ways, within this test session: no call was refused,
and every permission is used (the few exceptions are named and explained below).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from paralleljob.manifests import rbac as progress_rbac
from tests.chart.conftest import RELEASE_NAMESPACE, REPO, only, render, render_text
from tests.cluster.apiserver import ClusterThread
from tests.cluster.product import Kubectl
from tests.operator.conftest import operator_calls

JOB_NAMESPACE = "research"
JOB = "quickstart"
NODES_YAML = """
apiVersion: v1
kind: List
items:
""" + "".join(
    f"""
- apiVersion: v1
  kind: Node
  metadata:
    name: gpu-{i}
    labels:
      kubernetes.io/hostname: gpu-{i}
      nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB
      nvidia.com/gpu.count: "4"
  status:
    allocatable: {{nvidia.com/gpu: "4", cpu: "64", memory: 512Gi}}
    capacity: {{nvidia.com/gpu: "4", cpu: "64", memory: 512Gi}}
    conditions: [{{type: Ready, status: "True"}}]
"""
    for i in range(3)
)


def namespace_doc(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Cluster(Kubectl):
    """kubectl against the emulator."""

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        return self(*args, stdin=stdin)

    def get(self, *args: str) -> dict[str, Any]:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def pods(self) -> list[dict[str, Any]]:
        return self.get("pods", "-n", JOB_NAMESPACE, "-l", f"paralleljob.io/job={JOB}")["items"]

    def job_status(self) -> dict[str, Any]:
        return self.get("paralleljob", JOB, "-n", JOB_NAMESPACE).get("status") or {}

    def set_pod_phase(self, name: str, phase: str) -> None:
        self.kubectl(
            "patch",
            "pod",
            name,
            "-n",
            JOB_NAMESPACE,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": {"phase": phase}}),
        )


def wait_for(what: str, condition: Callable[[], Any], log: Path | None = None, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.2)
    tail = log.read_text()[-6000:] if log else ""
    pytest.fail(f"timed out waiting for {what}; the operator's log ends:\n{tail}")


@contextlib.contextmanager
def operator_process(args: list[str], kubeconfig: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "paralleljob", "operator", *args, "--kubeconfig", str(kubeconfig)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            yield process
        finally:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


def operator_args(values: dict[str, Any], health_port: int, metrics_port: int) -> list[str]:
    """The Deployment's arguments, with the two listening ports moved to free ones on this machine."""
    deployment = only(render(values), "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    moved = {
        "--liveness": f"--liveness=http://127.0.0.1:{health_port}/healthz",
        "--metrics-port": f"--metrics-port={metrics_port}",
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
UNUSED_IN_SCOPE_BUT_INTENDED = {(RELEASE_NAMESPACE, "", "events", "create")}


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


@pytest.fixture(scope="module", params=list(SCENARIOS))
def reconciled(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Install the chart on the emulator, run the operator as the Deployment would, and drive one job through
    start, a gang restart and completion. Returns what the tests below inspect."""
    values = SCENARIOS[request.param]
    workdir = tmp_path_factory.mktemp(request.param)
    return install_and_reconcile(values, workdir)


def install_and_reconcile(values: dict[str, Any], workdir: Path) -> dict[str, Any]:
    server = ClusterThread(workdir, crds=()).start()  # the chart brings the CRD
    try:
        cluster = Cluster(server.kubeconfig)
        for namespace in (RELEASE_NAMESPACE, JOB_NAMESPACE):
            cluster.kubectl("apply", "--validate=false", "-f", "-", stdin=json.dumps(namespace_doc(namespace)))
        # --validate=false: the test server serves no OpenAPI documents for kubectl's client-side check; the
        # server validates every object itself.
        applied = cluster.kubectl("apply", "--validate=false", "-f", "-", stdin=render_text(values, RELEASE_NAMESPACE))
        cluster.kubectl("apply", "--validate=false", "-f", "-", stdin=NODES_YAML)
        log = workdir / "operator.log"
        objects = render(values)
        account = only(objects, "ServiceAccount")["metadata"]
        as_operator = server.kubeconfig_for(account["namespace"], account["name"])
        with operator_process(operator_args(values, free_port(), free_port()), as_operator, log) as process:
            job = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
            job["metadata"]["namespace"] = JOB_NAMESPACE
            cluster.kubectl("apply", "--validate=false", "-f", "-", stdin=json.dumps(job))
            trace = drive_the_job(cluster, process, log)
        assert server.emulator is not None
        # The operator's calls on resources (kopf's and paralleljob.k8s's user agents; not kubectl's, which are
        # this test's). Discovery (/api, /apis) is open to every authenticated user, so it is not counted.
        calls = set(operator_calls(server))
        stored = json.loads(
            cluster.kubectl("get", "-f", "-", "-o", "json", stdin=render_text(values, RELEASE_NAMESPACE))
        )
        denied = list(server.server.denied)
        return {
            "applied": applied,
            "objects": objects,
            "stored": stored,
            "calls": calls,
            "denied": denied,
            "trace": trace,
        }
    finally:
        server.stop()


def drive_the_job(cluster: Cluster, process: subprocess.Popen[bytes], log: Path) -> dict[str, Any]:
    """Start, fail one pod (a gang restart), then finish; returns what was seen on the way."""

    def alive() -> None:
        if process.poll() is not None:
            pytest.fail(f"the operator exited with {process.returncode}:\n{log.read_text()[-4000:]}")

    def pods_of_attempt(attempt: int) -> list[dict[str, Any]] | None:
        alive()
        pods = cluster.pods()
        current = [p for p in pods if p["metadata"]["labels"].get("paralleljob.io/attempt") == str(attempt)]
        return current if len(current) == 2 and len(pods) == 2 else None

    trace: dict[str, Any] = {}
    first = wait_for("the first attempt's 2 pods", lambda: pods_of_attempt(0), log)
    trace["first_pods"] = sorted(p["metadata"]["name"] for p in first)
    for pod in first:
        cluster.set_pod_phase(pod["metadata"]["name"], "Running")
    wait_for("phase Running", lambda: cluster.job_status().get("phase") == "Running", log)
    cluster.set_pod_phase(first[1]["metadata"]["name"], "Failed")
    wait_for("restarts=1", lambda: cluster.job_status().get("restarts") == 1, log)
    second = wait_for("the second attempt's 2 pods", lambda: pods_of_attempt(1), log)
    for pod in second:
        cluster.set_pod_phase(pod["metadata"]["name"], "Running")
    wait_for("phase Running again", lambda: cluster.job_status().get("phase") == "Running", log)
    rank0 = next(p for p in second if p["metadata"]["name"].endswith("-0"))
    cluster.set_pod_phase(rank0["metadata"]["name"], "Succeeded")
    wait_for("phase Succeeded", lambda: cluster.job_status().get("phase") == "Succeeded", log)
    trace["final_status"] = cluster.job_status()

    def running_pods() -> list[str]:
        return [
            p["metadata"]["name"] for p in cluster.pods() if p["status"].get("phase") not in ("Succeeded", "Failed")
        ]

    wait_for("the remaining pods to be cleaned up", lambda: not running_pods(), log)
    return trace


def test_kubectl_applies_every_rendered_object(reconciled: dict[str, Any]) -> None:
    assert len(reconciled["applied"].splitlines()) == len(reconciled["objects"])
    for rendered, stored in zip(reconciled["objects"], reconciled["stored"]["items"], strict=True):
        assert stored["kind"] == rendered["kind"]
        assert stored.get("spec") == rendered.get("spec")
        assert stored.get("rules") == rendered.get("rules")


def test_the_operator_reconciles_the_example_job_through_a_restart_to_success(reconciled: dict[str, Any]) -> None:
    trace = reconciled["trace"]
    assert trace["first_pods"] == [f"{JOB}-0", f"{JOB}-1"]
    status = trace["final_status"]
    assert status["phase"] == "Succeeded"
    assert status["restarts"] == 1


def test_the_api_server_refused_no_call_of_the_operator(reconciled: dict[str, Any]) -> None:
    assert reconciled["denied"] == []


def test_the_operator_calls_only_what_the_chart_allows(reconciled: dict[str, Any]) -> None:
    objects = reconciled["objects"]
    account = only(objects, "ServiceAccount")["metadata"]["name"]
    assert forbidden_calls(chart_grants(objects, account), reconciled["calls"]) == []


def test_the_chart_allows_nothing_the_operator_does_not_use(reconciled: dict[str, Any]) -> None:
    objects = reconciled["objects"]
    account = only(objects, "ServiceAccount")["metadata"]["name"]
    assert unused_grants(chart_grants(objects, account), reconciled["calls"]) == []


def test_the_rbac_check_notices_a_missing_and_an_unused_permission() -> None:
    granted = {("ClusterRole/x", "*", "", "pods", "list"), ("Role/y", "ns", "", "pods", "delete")}
    calls = {("list", "", "pods", ""), ("create", "", "pods", "ns"), ("delete", "", "pods", "other")}
    assert forbidden_calls(granted, calls) == [("create", "", "pods", "ns"), ("delete", "", "pods", "other")]
    assert unused_grants(granted, calls) == [("Role/y", "ns", "", "pods", "delete")]
