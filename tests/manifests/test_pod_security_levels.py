"""The pods of every example pass Pod Security "restricted" over TCP. Over RDMA they need IPC_LOCK, which no
level below "privileged" allows: that is the only control they fail, and with `rdmaIpcLock` off (a runtime
that raises RLIMIT_MEMLOCK) they pass "restricted" too. The checker's table is tests/manifests/pod_security_standard.py;
the last tests show that it refuses what each level refuses."""

from __future__ import annotations

import copy
import pathlib

import pytest
import yaml

from paralleljob import planning
from paralleljob.api import validate_document
from paralleljob.manifests import children, security
from paralleljob.planning import synth
from paralleljob.planning.inventory import build_cluster
from tests.manifests import pod_security_standard as pss

EXAMPLES = pathlib.Path(__file__).parents[2] / "examples"
JOB_EXAMPLES = [
    "quickstart.yaml",
    "quickstart-prepared.yaml",
    "quickstart-on-a-cluster.yaml",
    "gpt-small-8gpu.yaml",
    "gpt-13b-fragmented.yaml",
    "gpt-175b-64xa100.yaml",
    "llama-8b-64xh100.yaml",
    "llama-tiny.yaml",
    "llama-tiny-pretrained.yaml",
]
RDMA = {"fabric": "infiniband", "rdmaResource": {"name": "rdma/ib"}}


def example_pods(name: str, network: dict | None = None, pod_security=security.DEFAULT) -> list[dict]:
    doc = yaml.safe_load((EXAMPLES / name).read_text())
    doc["metadata"].setdefault("namespace", "research")
    doc["metadata"]["uid"] = "u-1"
    if network is not None:
        doc["spec"]["network"] = network
    resolved = validate_document(doc).resolved
    assert resolved is not None
    nodes, _ = synth.synth_cluster(synth.SynthSpec(nodes=16, gpus_per_node=8, gpu_product="NVIDIA-H100-80GB-HBM3"))
    for node in nodes if network == RDMA else ():
        node["status"]["allocatable"]["rdma/ib"] = "1"
    plan = planning.plan_job(resolved, build_cluster(nodes, []))
    assert isinstance(plan, planning.Plan)
    planned = [n for n in nodes if n["metadata"]["name"] in {e.node for e in plan.nodes}]
    attempt = children.build_attempt(doc, resolved, plan, planned, attempt=0)
    placed = [entry.node for entry in plan.nodes]
    built = children.build_children(doc, resolved, attempt.config_map, placed, image="t:1", pod_security=pod_security)
    return built.pods


def test_every_example_is_checked() -> None:
    examples = {p.name for p in EXAMPLES.glob("*.yaml") if "kind: ParallelJob" in p.read_text()}
    # deepspeed-zero2-pipeline.yaml is the example of a job the API refuses (ZeRO 2 with a pipeline);
    # gpt-175b-budget.yaml is gpt-175b-64xa100.yaml with its layout left to the search: the same pods.
    assert examples - set(JOB_EXAMPLES) == {"deepspeed-zero2-pipeline.yaml", "gpt-175b-budget.yaml"}


@pytest.mark.parametrize("name", JOB_EXAMPLES)
def test_the_pods_of_every_example_pass_restricted_over_tcp(name: str) -> None:
    for pod in example_pods(name):
        assert pss.violations(pod, "restricted") == {}, pod["metadata"]["name"]


@pytest.mark.parametrize("name", JOB_EXAMPLES)
def test_over_rdma_the_pods_fail_only_the_capabilities_control_for_ipc_lock(name: str) -> None:
    for pod in example_pods(name, RDMA):
        assert pss.violations(pod, "baseline") == {
            "Capabilities": "capabilities IPC_LOCK are beyond the baseline set"
        }, pod["metadata"]["name"]
        assert set(pss.violations(pod, "restricted")) == {"Capabilities", "Capabilities (restricted)"}


@pytest.mark.parametrize("name", JOB_EXAMPLES)
def test_over_rdma_without_ipc_lock_the_pods_pass_restricted(name: str) -> None:
    for pod in example_pods(name, RDMA, security.PodSecurity(rdma_ipc_lock=False)):
        assert pss.violations(pod, "restricted") == {}


# The checker itself: a pod that breaks one control at a time is refused by that control only.
BREAKAGES = {
    "host-network": ("baseline", "Host Namespaces", lambda pod: pod["spec"].update(hostNetwork=True)),
    "privileged": ("baseline", "Privileged Containers", lambda pod: _container(pod).update(privileged=True)),
    "host-path": (
        "baseline",
        "HostPath Volumes",
        lambda pod: pod["spec"]["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
    ),
    "host-port": (
        "baseline",
        "Host Ports",
        lambda pod: pod["spec"]["containers"][0]["ports"][0].update(hostPort=29500),
    ),
    "apparmor-unconfined": (
        "baseline",
        "AppArmor",
        lambda pod: pod["metadata"].update(annotations={pss.APPARMOR_ANNOTATION + "trainer": "unconfined"}),
    ),
    "seccomp-unconfined": (
        "baseline",
        "Seccomp",
        lambda pod: pod["spec"]["securityContext"].update(seccompProfile={"type": "Unconfined"}),
    ),
    "unsafe-sysctl": (
        "baseline",
        "Sysctls",
        lambda pod: pod["spec"]["securityContext"].update(sysctls=[{"name": "kernel.msgmax", "value": "1"}]),
    ),
    "escalation": (
        "restricted",
        "Privilege Escalation",
        lambda pod: _container(pod).update(allowPrivilegeEscalation=True),
    ),
    "root": ("restricted", "Running as Non-root user", lambda pod: pod["spec"]["securityContext"].update(runAsUser=0)),
    "nfs-volume": (
        "restricted",
        "Volume Types",
        lambda pod: pod["spec"]["volumes"].append({"name": "n", "nfs": {"server": "s", "path": "/"}}),
    ),
}


def _container(pod: dict) -> dict:
    return pod["spec"]["containers"][0]["securityContext"]


@pytest.mark.parametrize("case", BREAKAGES, ids=list(BREAKAGES))
def test_the_checker_refuses_each_control_it_lists(case: str) -> None:
    level, control, breakage = BREAKAGES[case]
    pod = copy.deepcopy(example_pods("quickstart.yaml")[0])
    breakage(pod)
    found = pss.violations(pod, level)
    assert control in found, found
    assert {c for c in found if c != control} <= {"HostPath Volumes", "Volume Types"}  # a hostPath breaks both
