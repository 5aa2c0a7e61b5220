"""The pods of every example against the real Pod Security admission plugin of kube-apiserver, in namespaces
labelled `pod-security.kubernetes.io/enforce`: over TCP they pass "restricted"; over RDMA they need IPC_LOCK,
which no level below "privileged" allows, and that is the one control they fail; with `rdmaIpcLock` off (a
runtime that raises RLIMIT_MEMLOCK) they pass "restricted" too. Each pod is a dry-run create, so it goes through
admission whole and nothing is stored.

The last test breaks one control at a time in a pod that passes: the plugin refuses it at the level that forbids
it, naming that control, and the level below admits it. Without enforcement (a namespace left unlabelled, or the
plugin off) that test fails, so the passes above mean what they say.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from paralleljob.manifests import security
from testcluster.api import Api
from tests.manifests.helpers import EXAMPLES, JOB_EXAMPLES, RDMA, example_pods

pytestmark = pytest.mark.both_releases

LEVELS = ("baseline", "restricted")


@pytest.fixture(scope="module")
def enforcing(admin_api: Api) -> Iterator[dict[str, str]]:
    """A namespace per level, enforcing it."""
    names = {level: f"pss-{level}-{uuid.uuid4().hex[:6]}" for level in LEVELS}
    for level, name in names.items():
        labels = {"pod-security.kubernetes.io/enforce": level, "pod-security.kubernetes.io/enforce-version": "latest"}
        admin_api.create(
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}},
        )
    yield names
    for name in names.values():
        admin_api.send("DELETE", f"/api/v1/namespaces/{name}")


def dry_run_create(api: Api, namespace: str, pod: dict[str, Any]) -> str | None:
    """None when admission accepts the pod, else the server's refusal. The ServiceAccount the pod runs as (the
    job's own, which the operator creates beside its pods) is created first if missing."""
    account = {"metadata": {"name": pod["spec"]["serviceAccountName"]}}
    made = api.send("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", account)
    assert made.status_code in (201, 409), made.text
    pod = copy.deepcopy(pod)
    pod["metadata"]["namespace"] = namespace
    pod["metadata"].pop("ownerReferences", None)
    response = api.send("POST", f"/api/v1/namespaces/{namespace}/pods", pod, dryRun="All")
    if response.status_code == 201:
        return None
    assert response.status_code == 403, response.text
    return str(response.json()["message"])


def test_every_example_is_checked() -> None:
    examples = {p.name for p in EXAMPLES.glob("*.yaml") if "kind: ParallelJob" in p.read_text()}
    assert examples - set(JOB_EXAMPLES) == {"deepspeed-zero2-pipeline.yaml", "gpt-175b-budget.yaml"}


@pytest.mark.parametrize("name", JOB_EXAMPLES)
def test_the_pods_of_every_example_pass_restricted_over_tcp(
    admin_api: Api, enforcing: dict[str, str], name: str
) -> None:
    for pod in example_pods(name):
        assert dry_run_create(admin_api, enforcing["restricted"], pod) is None, pod["metadata"]["name"]


@pytest.mark.parametrize("name", JOB_EXAMPLES)
def test_over_rdma_the_pods_fail_only_the_capabilities_control_for_ipc_lock(
    admin_api: Api, enforcing: dict[str, str], name: str
) -> None:
    for pod in example_pods(name, RDMA):
        refused = dry_run_create(admin_api, enforcing["baseline"], pod)
        assert refused is not None and refused.endswith(
            'violates PodSecurity "baseline:latest": non-default capabilities (container "trainer" must not include'
            ' "IPC_LOCK" in securityContext.capabilities.add)'
        ), refused
        refused = dry_run_create(admin_api, enforcing["restricted"], pod)
        assert refused is not None and refused.endswith(
            'violates PodSecurity "restricted:latest": unrestricted capabilities (container "trainer" must not'
            ' include "IPC_LOCK" in securityContext.capabilities.add)'
        ), refused


@pytest.mark.parametrize("name", JOB_EXAMPLES)
def test_over_rdma_without_ipc_lock_the_pods_pass_restricted(
    admin_api: Api, enforcing: dict[str, str], name: str
) -> None:
    for pod in example_pods(name, RDMA, security.PodSecurity(rdma_ipc_lock=False)):
        assert dry_run_create(admin_api, enforcing["restricted"], pod) is None, pod["metadata"]["name"]


def _set(path: Callable[[dict[str, Any]], dict[str, Any]], **fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda pod: path(pod).update(fields)


# One control broken at a time: (the lowest level that forbids it, how the plugin names it, the breakage).
BREAKAGES: dict[str, tuple[str, str, Callable[[dict[str, Any]], None]]] = {
    "host-network": ("baseline", "host namespaces", _set(lambda pod: pod["spec"], hostNetwork=True)),
    "privileged": (
        "baseline",
        "privileged",
        _set(
            lambda pod: pod["spec"]["containers"][0]["securityContext"], privileged=True, allowPrivilegeEscalation=True
        ),
    ),
    "host-path": (
        "baseline",
        "hostPath volumes",
        lambda pod: pod["spec"]["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
    ),
    "host-port": ("baseline", "hostPort", _set(lambda pod: pod["spec"]["containers"][0]["ports"][0], hostPort=29500)),
    "apparmor-unconfined": (
        "baseline",
        "forbidden AppArmor profile",
        _set(lambda pod: pod["spec"]["securityContext"], appArmorProfile={"type": "Unconfined"}),
    ),
    "seccomp-unconfined": (
        "baseline",
        "seccompProfile",
        _set(lambda pod: pod["spec"]["securityContext"], seccompProfile={"type": "Unconfined"}),
    ),
    "unsafe-sysctl": (
        "baseline",
        "forbidden sysctls",
        _set(lambda pod: pod["spec"]["securityContext"], sysctls=[{"name": "kernel.msgmax", "value": "1"}]),
    ),
    "escalation": (
        "restricted",
        "allowPrivilegeEscalation != false",
        _set(lambda pod: pod["spec"]["containers"][0]["securityContext"], allowPrivilegeEscalation=True),
    ),
    "root": ("restricted", "runAsUser=0", _set(lambda pod: pod["spec"]["securityContext"], runAsUser=0)),
    "nfs-volume": (
        "restricted",
        "restricted volume types",
        lambda pod: pod["spec"]["volumes"].append({"name": "n", "nfs": {"server": "s", "path": "/"}}),
    ),
}


@pytest.mark.parametrize("case", BREAKAGES, ids=list(BREAKAGES))
def test_the_plugin_refuses_each_broken_control_at_its_level_only(
    admin_api: Api, enforcing: dict[str, str], case: str
) -> None:
    level, control, breakage = BREAKAGES[case]
    pod = copy.deepcopy(example_pods("quickstart.yaml")[0])
    breakage(pod)
    refused = dry_run_create(admin_api, enforcing[level], pod)
    assert refused is not None and f'violates PodSecurity "{level}:latest": {control}' in refused, refused
    if level == "restricted":
        assert dry_run_create(admin_api, enforcing["baseline"], pod) is None
