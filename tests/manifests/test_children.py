"""The child objects of one attempt: ConfigMap, headless Service, progress RBAC and pinned pods."""

from __future__ import annotations

import dataclasses
import json
import types

import pytest

from paralleljob.manifests import children, configmap, labels, trainer_config
from paralleljob.manifests import pods as pod_manifests
from tests.manifests.helpers import make_node, make_plan, resolve

OWNER = {"metadata": {"name": "gpt", "namespace": "research", "uid": "u-1"}}
IB_NODES = [make_node(f"node-{i}", {}, {"nvidia.com/gpu": "4", "rdma/ib": "1"}) for i in range(4)]
PLAIN_NODES = [make_node(f"node-{i}", {}, {"nvidia.com/gpu": "4"}) for i in range(4)]
EFA_NODES = [make_node(f"node-{i}", {}, {"nvidia.com/gpu": "4", "vpc.amazonaws.com/efa": "4"}) for i in range(4)]


def build(nodes=PLAIN_NODES, attempt=0, plan=None, default_nccl_env=None, **spec_patch):
    """Both steps, as the operator takes them: the attempt's ConfigMap, then the children built from it."""
    resolved = resolve(**spec_patch)
    made = children.build_attempt(
        OWNER, resolved, plan or make_plan(), nodes, attempt=attempt, default_nccl_env=default_nccl_env
    )
    nodes = (plan or make_plan()).node_names()
    built = children.build_children(OWNER, resolved, made.config_map, nodes, image="trainer:1")
    return types.SimpleNamespace(attempt=made, config_map=made.config_map, **vars(built))


def env_of(pod):
    return {item["name"]: item.get("value") for item in pod["spec"]["containers"][0]["env"]}


def test_every_child_is_owned_by_the_job_and_labelled():
    built = build()
    for obj in [built.config_map, built.service, *built.rbac, *built.pods]:
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "u-1"
        assert obj["metadata"]["ownerReferences"][0]["controller"] is True
        # blockOwnerDeletion needs `update` on paralleljobs/finalizers, which the operator does not hold.
        assert "blockOwnerDeletion" not in obj["metadata"]["ownerReferences"][0]
        assert obj["metadata"]["labels"][labels.JOB_LABEL] == "gpt"
        assert obj["metadata"]["namespace"] == "research"


def test_one_pod_per_node_rank_pinned_by_required_affinity():
    pods = build().pods
    assert [p["metadata"]["name"] for p in pods] == ["gpt-0", "gpt-1", "gpt-2", "gpt-3"]
    for rank, pod in enumerate(pods):
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"][0]["matchExpressions"] == [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [f"node-{rank}"]}
        ]
        assert "nodeName" not in pod["spec"]
        assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == (f"gpt-{rank}", "gpt")


def test_pods_run_the_supervisor_with_rank_zero_as_master_and_the_in_place_budget():
    pod = build().pods[2]
    command = pod["spec"]["containers"][0]["command"]
    assert command[:9] == [
        "python",
        "-m",
        "paralleljob_contract.supervisor",
        "--nnodes=4",
        "--node-rank=2",
        "--nproc-per-node=4",
        "--master-addr=gpt-0.gpt",
        "--master-port=29500",
        "--in-place-restarts=3",
    ]
    assert command[-2] == "--entrypoint=paralleljob_trainer.cli:main"
    assert command[-1].startswith("--preload=torch,torch._dynamo,")


@pytest.mark.parametrize(
    ("restarts", "policy", "budget"),
    [
        (0, {}, 3),
        (2, {}, 1),
        (3, {}, 0),
        (0, {"inPlaceRestarts": 0}, 0),
        (1, {"backoffLimit": 10, "inPlaceRestarts": 5}, 5),
    ],
    ids=["fresh-job", "backoff-limit-nearly-spent", "backoff-limit-spent", "in-place-off", "policy-budget"],
)
def test_the_in_place_budget_never_lets_restarts_pass_backoff_limit(restarts, policy, budget):
    resolved = resolve(failurePolicy=policy)
    assert pod_manifests.in_place_budget(resolved, restarts) == budget


def test_user_command_runs_under_the_supervisor_with_the_same_env():
    pod = build(command=["python", "/app/train.py"]).pods[0]
    assert pod["spec"]["containers"][0]["command"][-3:] == ["--", "python", "/app/train.py"]
    assert env_of(pod)["PARALLELJOB_NODE_RANK"] == "0"


@pytest.mark.parametrize(
    ("nodes", "network", "resource", "ipc_lock", "nccl_net"),
    [
        (PLAIN_NODES, {}, None, False, None),
        (IB_NODES, {}, "rdma/ib", True, "IB"),
        (EFA_NODES, {"fabric": "efa"}, "vpc.amazonaws.com/efa", True, "AWS Libfabric"),
        (IB_NODES, {"fabric": "roce"}, "rdma/ib", True, "IB"),
        (PLAIN_NODES, {"fabric": "infiniband"}, None, False, "IB"),
    ],
    # An inferred tcp names no transport (NCCL may still find RDMA); each RDMA fabric names its own; IPC_LOCK
    # only where the pods really get RDMA devices.
    ids=["tcp", "infiniband-detected", "efa", "roce", "infiniband-without-rdma-devices"],
)
def test_fabric_decides_network_resources_capabilities_and_nccl(nodes, network, resource, ipc_lock, nccl_net):
    built = build(nodes, network=network)
    container = built.pods[1]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert (resource in container["resources"]["limits"]) if resource else len(container["resources"]["limits"]) == 1
    assert ("IPC_LOCK" in str(container.get("securityContext"))) == ipc_lock
    assert env_of(built.pods[1]).get("NCCL_NET") == nccl_net
    assert (f"NCCL_NET={nccl_net}" in built.config_map["data"]["nccl.env"]) == (nccl_net is not None)


def test_volumes_shm_in_memory_config_and_checkpoint():
    pod = build().pods[0]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory"}
    assert volumes["checkpoint"]["persistentVolumeClaim"] == {"claimName": "ckpt"}
    assert volumes["job-config"]["configMap"]["name"] == "gpt-config"
    assert mounts == {
        "job-config": "/etc/paralleljob",
        "dshm": "/dev/shm",
        "checkpoint": "/checkpoints",
        "scratch-tmp": "/tmp",
        "scratch-home": "/home/trainer",
    }


def test_each_job_checkpoints_into_its_own_namespace_and_name_folder_of_the_shared_volume():
    pod = build().pods[0]
    assert env_of(pod)["PARALLELJOB_CHECKPOINT_DIR"] == "/checkpoints/research/gpt"
    assert "PARALLELJOB_RESUME_FROM" not in env_of(pod)


def test_metrics_are_written_in_the_job_checkpoint_folder_so_they_survive_gang_restarts():
    pod = build().pods[0]
    assert env_of(pod)["PARALLELJOB_OUTPUT_DIR"] == "/checkpoints/research/gpt/metrics"
    assert "output" not in {v["name"] for v in pod["spec"]["volumes"]}


@pytest.mark.parametrize(
    ("resume_from", "sub_path"),
    [("gpt-base", "research/gpt-base"), ("shared/models/gpt-base", "shared/models/gpt-base")],
    ids=["another-job-of-the-namespace", "a-folder-on-the-volume"],
)
def test_resume_from_is_the_same_volume_mounted_again_read_only(resume_from, sub_path):
    checkpoint = {"volume": {"persistentVolumeClaim": {"claimName": "ckpt"}}, "resumeFrom": resume_from}
    pod = build(checkpoint=checkpoint).pods[0]
    mounts = pod["spec"]["containers"][0]["volumeMounts"]
    source = next(m for m in mounts if m["mountPath"] == "/var/run/paralleljob/resume-from")
    assert source == {
        "name": "checkpoint",
        "mountPath": "/var/run/paralleljob/resume-from",
        "subPath": sub_path,
        "readOnly": True,
    }
    assert env_of(pod)["PARALLELJOB_RESUME_FROM"] == "/var/run/paralleljob/resume-from"
    assert env_of(pod)["PARALLELJOB_CHECKPOINT_DIR"] == "/checkpoints/research/gpt"


def test_without_a_checkpoint_metrics_go_to_an_empty_dir():
    pod = build(checkpoint=None).pods[0]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["output"] == {"name": "output", "emptyDir": {}}
    assert env_of(pod)["PARALLELJOB_OUTPUT_DIR"] == "/var/run/paralleljob/output"


def test_only_rank_zero_reports_progress_through_its_own_account():
    built = build()
    assert [("PARALLELJOB_PROGRESS_HOOK" in env_of(p)) for p in built.pods] == [True, False, False, False]
    assert {p["spec"]["serviceAccountName"] for p in built.pods} == {"gpt-progress"}
    role = built.rbac[1]
    # Its own progress ConfigMap and nothing else: not the job, not its status (which the operator trusts).
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["gpt-progress"], "verbs": ["patch"]}
    ]
    assert built.progress["metadata"]["name"] == "gpt-progress"
    assert built.progress["metadata"]["labels"]["paralleljob.io/progress"] == "true"
    assert built.progress["data"] == {}


def test_only_rank_zero_gets_an_api_token():
    automount = [p["spec"].get("automountServiceAccountToken", True) for p in build().pods]
    assert automount == [True, False, False, False]


def test_users_own_service_account_replaces_the_progress_rbac():
    built = build(template={"serviceAccountName": "mine"})
    assert built.rbac == []
    assert built.pods[0]["spec"]["serviceAccountName"] == "mine"
    # The user chose this identity for the pods; the operator does not take its token away from them.
    assert all("automountServiceAccountToken" not in p["spec"] for p in built.pods)


def test_config_map_holds_job_file_deepspeed_plan_and_nccl_for_its_attempt():
    built = build(attempt=2)
    data = built.config_map["data"]
    assert json.loads(data["job.json"])["plan"]["ranksPerNode"] == 4
    assert json.loads(data["deepspeed.json"])["train_batch_size"] == 32
    assert json.loads(data["plan.json"]) == {
        key: value for key, value in make_plan().to_dict().items() if key != "nodes"
    }
    assert configmap.plan_of(built.config_map) == trainer_config.contract_plan(make_plan())
    assert built.config_map["metadata"]["labels"][labels.ATTEMPT_LABEL] == "2"
    assert all(p["metadata"]["labels"][labels.ATTEMPT_LABEL] == "2" for p in built.pods)


def test_headless_service_publishes_not_ready_addresses():
    spec = build().service["spec"]
    assert spec["clusterIP"] == "None"
    assert spec["publishNotReadyAddresses"] is True
    assert spec["selector"] == {labels.JOB_LABEL: "gpt"}


def test_template_scheduling_fields_reach_the_pod():
    tolerations = [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    spec = build(
        template={"nodeSelector": {"pool": "a100"}, "tolerations": tolerations, "priorityClassName": "high"}
    ).pods[0]["spec"]
    assert (spec["nodeSelector"], spec["tolerations"], spec["priorityClassName"]) == (
        {"pool": "a100"},
        tolerations,
        "high",
    )


def test_operator_default_nccl_env_reaches_pods_unless_the_job_sets_the_same_name():
    built = build(
        PLAIN_NODES,
        default_nccl_env={"NCCL_DEBUG": "INFO", "NCCL_IB_HCA": "=mlx5_0"},
        network={"ncclEnv": {"NCCL_DEBUG": "TRACE"}},
    )
    env = env_of(built.pods[0])
    assert env["NCCL_IB_HCA"] == "=mlx5_0"
    assert env["NCCL_DEBUG"] == "TRACE"
    assert built.nccl_env["NCCL_IB_HCA"] == "=mlx5_0"


def test_pods_run_exactly_the_nccl_env_the_attempt_recorded():
    """status.ncclEnv is written from the attempt; the pods are built from its ConfigMap alone, so a Node
    relabelled or an operator restarted in between cannot make them differ."""
    built = build(IB_NODES)
    recorded = built.attempt.nccl_env
    assert recorded["NCCL_NET"] == "IB"
    for pod in built.pods:
        env = env_of(pod)
        assert {key: env[key] for key in recorded} == recorded
    assert built.nccl_env == recorded
    assert configmap.network_of(built.config_map)["ncclEnv"] == recorded


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("PARALLELJOB_NODE_RANK", "set by the operator"),
        ("PARALLELJOB_OUTPUT_DIR", "set by the operator"),
        ("NCCL_IB_HCA", "spec.network.ncclEnv"),
        ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "spec.network.ncclEnv"),
        ("FI_PROVIDER", "spec.network.ncclEnv"),
        ("PARALLELJOB_PEAK_TFLOPS", None),
        ("HF_HOME", None),
        ("OMP_NUM_THREADS", None),
    ],
    ids=["identity", "output", "nccl", "torch-nccl", "libfabric", "trainer-knob", "user", "threads"],
)
def test_template_env_may_not_override_what_the_operator_sets(name, problem):
    resolved = resolve(template={"env": [{"name": "A", "value": "1"}, {"name": name, "value": "x"}]})
    problems = pod_manifests.env_problems(resolved)
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1
        assert problems[0].startswith(f"spec.template.env[1].name: {name}") and problem in problems[0]


IMEX_CLAIMS = [{"name": "imex", "resourceClaimTemplateName": "gpt-compute-domain-channel"}]


def test_resource_claims_reach_every_pod_and_its_training_container():
    built = build(template={"resourceClaims": IMEX_CLAIMS})
    for pod in built.pods:
        assert pod["spec"]["resourceClaims"] == IMEX_CLAIMS
        assert pod["spec"]["containers"][0]["resources"]["claims"] == [{"name": "imex"}]


def test_a_failing_rank_can_say_why_in_its_termination_message():
    container = build().pods[0]["spec"]["containers"][0]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_network_warnings_are_recorded_with_the_attempt():
    built = build(PLAIN_NODES, network={"fabric": "infiniband"})
    warnings = configmap.network_of(built.config_map)["warnings"]
    assert any("offer no RDMA resource" in note for note in warnings)


@pytest.mark.parametrize(
    ("network", "template", "refused"),
    [
        ({"fabric": "infiniband", "verify": "fail"}, {}, True),
        ({"fabric": "infiniband"}, {}, False),
        ({"fabric": "efa", "verify": "fail"}, {"resourceClaims": [{"name": "efa", "resourceClaimName": "efa"}]}, False),
    ],
    ids=["verify-fail", "verify-warn-only-warns", "dra-claims-may-give-the-devices"],
)
def test_verify_fail_refuses_an_rdma_fabric_on_nodes_without_rdma_before_any_pod(network, template, refused):
    resolved = resolve(network=network, template=template)
    attempt = children.build_attempt(OWNER, resolved, make_plan(), PLAIN_NODES, attempt=0)
    refusal = attempt.refusal(resolved)
    assert (refusal is not None) == refused
    assert refusal is None or "offer no" in refusal


def test_mnnvl_follows_the_nvlink_label_the_plan_used_not_only_the_specs():
    # Topograph's label, found on the nodes by the planner; the spec names none.
    label = "network.topology.nvidia.com/accelerator"
    rack = [make_node(f"node-{i}", {label: "nvl72-a"}, {"nvidia.com/gpu": "4", "rdma/ib": "4"}) for i in range(4)]
    plan = dataclasses.replace(make_plan(), nvlink_domain_label=label)
    imex = {"resourceClaims": IMEX_CLAIMS}
    with_claim = build(rack, plan=plan, network={"imexChannelClaim": "imex"}, template=imex).attempt.nccl_env
    assert with_claim.get("PARALLELJOB_MNNVL") == "1" and "NCCL_MNNVL_ENABLE" not in with_claim
    without = build(rack, plan=dataclasses.replace(plan, nvlink_domain_label=None)).attempt.nccl_env
    assert without["NCCL_MNNVL_ENABLE"] == "0" and "PARALLELJOB_MNNVL" not in without


def test_a_pod_admitted_by_kueues_tas_names_its_node_in_its_node_selector_as_kueues_own_tas_pods_do():
    annotations = {"kueue.x-k8s.io/podset-preferred-topology": "example.com/block", "kueue.x-k8s.io/workload": "w"}
    tas = build(template={"annotations": annotations, "nodeSelector": {"pool": "a"}}).pods
    assert [pod["spec"]["nodeSelector"] for pod in tas[:2]] == [
        {"pool": "a", "kubernetes.io/hostname": "node-0"},
        {"pool": "a", "kubernetes.io/hostname": "node-1"},
    ]
    assert tas[0]["metadata"]["annotations"] == annotations
    assert "nodeSelector" not in build().pods[0]["spec"]
