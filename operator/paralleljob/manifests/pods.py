"""One Pod per node rank, `<job>-<nodeRank>`: pinned, resourced and wired for torchrun and NCCL.

Pure. Each pod is pinned to its planned node by *required node affinity* on kubernetes.io/hostname (not
spec.nodeName), so the scheduler still checks resources and taints; it requests the planned GPUs and the
fabric's RDMA/EFA resource, mounts /dev/shm in memory (the 64 MB default crashes NCCL), job.json, the
checkpoint volume, and runs hardened (`manifests.security`: non-root, no capabilities but IPC_LOCK for RDMA,
read-only root with writable scratch folders). The checkpoint volume's root is mounted at
spec.checkpoint.path and the job writes only its own folder on it, `<path>/<namespace>/<name>` (the trainer
creates it as the pod's user, which a kubelet-created subPath folder, owned by root, would not allow), so
jobs can share one claim; spec.checkpoint.resumeFrom's folder is mounted a second time, read-only. The
environment comes from `manifests.env.build_node_env` and the torchrun line from
`paralleljob_contract.launcher`, as for the local runner; `spec.template.env` follows the environment and may
not set a name the operator owns (`env_problems`). Only node rank 0, which reports progress,
mounts the per-job progress account's token.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

from paralleljob.api import ResolvedJob
from paralleljob.api.types import spec_to_dict
from paralleljob.manifests import configmap, env, kueue_topology, labels, security
from paralleljob_contract import environment, launcher
from paralleljob_contract import stragglers as straggler_channel
from paralleljob_contract.jobfile import Plan

GPU_RESOURCE = "nvidia.com/gpu"
HOSTNAME_LABEL = "kubernetes.io/hostname"
OUTPUT_DIR = "/var/run/paralleljob/output"
# spec.checkpoint.resumeFrom's folder, mounted read-only (subPath of the checkpoint volume).
RESUME_FROM_DIR = "/var/run/paralleljob/resume-from"
# metrics.jsonl goes here, under the checkpoint path, so it survives gang restarts (the trainer appends).
METRICS_SUBDIR = "metrics"
# Trainer knobs a user may set in spec.template.env; every other PARALLELJOB_ name is the operator's.
USER_SETTABLE = environment.USER_SETTABLE
# The NCCL, torch-NCCL and libfabric variables: set them in spec.network.ncclEnv, which the operator applies.
NCCL_PREFIXES = ("NCCL_", "TORCH_NCCL_", "FI_")
PROGRESS_HOOK = "paralleljob_trainer.k8s_status:create_hook"
TRAINER_MODULE = launcher.TRAINER_MODULE


@dataclasses.dataclass(frozen=True)
class PodSettings:
    """What every pod of one attempt shares."""

    image: str
    plan: Plan
    # The node each node rank runs on (status.placement), by node rank.
    nodes: tuple[str, ...]
    nccl_env: Mapping[str, str]
    network_resources: Mapping[str, int | str]
    # Whether the pods use RDMA devices (the attempt's network record); they then get IPC_LOCK unless the
    # administrator's PodSecurity says otherwise.
    ipc_lock: bool
    attempt: int
    service_account: str
    # True when service_account is the operator's per-job progress account (its token is for rank 0 only).
    progress_account: bool = True
    security: security.PodSecurity = dataclasses.field(default_factory=security.PodSecurity)
    # In-place restarts these pods' supervisors may make (in_place_budget).
    in_place_restarts: int = 0


def env_problems(resolved: ResolvedJob) -> list[str]:
    """Why spec.template.env cannot be used: names that would override the operator's environment."""
    problems = []
    for index, item in enumerate(resolved.spec.template.env or ()):
        name = str(item.get("name", ""))
        where = f"spec.template.env[{index}].name"
        if name.startswith(environment.PREFIX) and name not in USER_SETTABLE:
            problems.append(f"{where}: {name} is set by the operator and cannot be overridden")
        elif name.startswith(NCCL_PREFIXES) or name in ("DEEPSPEED_TIMEOUT",):
            problems.append(f"{where}: {name} belongs in spec.network.ncclEnv, which the operator applies")
    return problems


def job_folder(resolved: ResolvedJob) -> str | None:
    """This job's checkpoint folder inside the pod, `<spec.checkpoint.path>/<namespace>/<name>`."""
    checkpoint = resolved.spec.checkpoint
    if checkpoint is None:
        return None
    return f"{checkpoint.path.rstrip('/')}/{resolved.namespace}/{resolved.name}"


def resume_from_folder(resolved: ResolvedJob) -> str | None:
    """spec.checkpoint.resumeFrom as a folder relative to the volume's root: a bare name is a job of this
    namespace (`<namespace>/<name>`), anything with a slash is a folder on the volume."""
    checkpoint = resolved.spec.checkpoint
    if checkpoint is None or not checkpoint.resume_from:
        return None
    source = checkpoint.resume_from.strip("/")
    return source if "/" in source else f"{resolved.namespace}/{source}"


def output_dir(resolved: ResolvedJob) -> str:
    """Where rank 0 appends metrics.jsonl: in the job's checkpoint folder when there is one, else an emptyDir."""
    folder = job_folder(resolved)
    return f"{folder}/{METRICS_SUBDIR}" if folder is not None else OUTPUT_DIR


def node_command(resolved: ResolvedJob, settings: PodSettings, node_rank: int) -> list[str]:
    """The in-pod supervisor for this node rank, running the bundled trainer or spec.command once per GPU and
    restarting the gang in place up to the attempt's in-place budget."""
    return launcher.supervisor_command(
        nodes=settings.plan.nodes,
        node_rank=node_rank,
        ranks_per_node=settings.plan.ranks_per_node,
        master_addr=labels.master_address(resolved.name),
        master_port=labels.MASTER_PORT,
        in_place_restarts=settings.in_place_restarts,
        command=resolved.spec.command,
        progress_timeout_seconds=resolved.spec.failure_policy.progress_timeout_seconds,
    )


def in_place_budget(resolved: ResolvedJob, restarts: int) -> int:
    """In-place restarts the pods of a new attempt may make: spec.failurePolicy.inPlaceRestarts, less what
    backoffLimit has left after the job's `restarts` so far (each in-place restart counts against it)."""
    policy = resolved.spec.failure_policy
    return max(0, min(policy.in_place_restarts, policy.backoff_limit - restarts))


def node_affinity(node: str) -> dict[str, Any]:
    term = {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": [node]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def container_resources(resolved: ResolvedJob, gpus: int, network: Mapping[str, int | str]) -> dict[str, Any]:
    """spec.template.resources plus the GPUs and network devices, as both requests and limits, and the
    container's share of spec.template.resourceClaims (an IMEX channel, DRA network devices)."""
    extra = copy.deepcopy(dict(resolved.spec.template.resources or {}))
    devices = {GPU_RESOURCE: str(gpus), **{name: str(count) for name, count in network.items()}}
    resources: dict[str, Any] = {
        "requests": {**extra.get("requests", {}), **devices},
        "limits": {**extra.get("limits", {}), **devices},
    }
    claims = [{"name": claim.name} for claim in resolved.spec.template.resource_claims or ()]
    if claims:
        resources["claims"] = claims
    return resources


def volumes(resolved: ResolvedJob) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(pod volumes, container mounts): job.json, /dev/shm, output (without a checkpoint), checkpoint, then
    the user's."""
    name = labels.config_map_name(resolved.name)
    pod_volumes: list[dict[str, Any]] = [
        {"name": "job-config", "configMap": {"name": name}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "job-config", "mountPath": configmap.MOUNT_PATH, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    checkpoint = resolved.spec.checkpoint
    if checkpoint is None:
        pod_volumes.append({"name": "output", "emptyDir": {}})
        mounts.append({"name": "output", "mountPath": OUTPUT_DIR})
    elif checkpoint.volume:
        pod_volumes.append({"name": "checkpoint", **copy.deepcopy(dict(checkpoint.volume))})
        mounts.append({"name": "checkpoint", "mountPath": checkpoint.path})
        if (source := resume_from_folder(resolved)) is not None:
            mounts.append({"name": "checkpoint", "mountPath": RESUME_FROM_DIR, "subPath": source, "readOnly": True})
    template = resolved.spec.template
    pod_volumes += copy.deepcopy(list(template.volumes or []))
    mounts += copy.deepcopy(list(template.volume_mounts or []))
    return pod_volumes, mounts


def straggler_policy(resolved: ResolvedJob) -> straggler_channel.Policy:
    """spec.failurePolicy.stragglers as the trainer takes it."""
    policy = resolved.spec.failure_policy.stragglers
    return straggler_channel.Policy(policy.threshold, policy.window_steps, policy.windows)


def node_env(resolved: ResolvedJob, settings: PodSettings, node_rank: int) -> list[dict[str, Any]]:
    """The container env: build_node_env's variables, then the user's spec.template.env (which
    `env_problems` keeps off the operator's names)."""
    variables = env.build_node_env(
        settings.plan,
        node_rank,
        job_name=resolved.name,
        namespace=resolved.namespace,
        node_name=settings.nodes[node_rank],
        config_path=configmap.CONFIG_PATH,
        output_dir=output_dir(resolved),
        checkpoint_dir=job_folder(resolved),
        resume_from=RESUME_FROM_DIR if resume_from_folder(resolved) is not None else None,
        progress_hook=PROGRESS_HOOK if node_rank == 0 else None,
        nccl_env=settings.nccl_env,
        stragglers=straggler_policy(resolved),
    )
    return env.as_env_list(variables) + copy.deepcopy(list(resolved.spec.template.env or []))


def build_container(
    resolved: ResolvedJob, settings: PodSettings, node_rank: int, mounts: list[dict[str, Any]]
) -> dict[str, Any]:
    gpus = settings.plan.ranks_per_node
    template = resolved.spec.template
    container: dict[str, Any] = {
        "name": labels.CONTAINER_NAME,
        "image": template.image or settings.image,
        "command": node_command(resolved, settings, node_rank),
        "env": node_env(resolved, settings, node_rank),
        "resources": container_resources(resolved, gpus, settings.network_resources),
        "volumeMounts": mounts,
        "ports": [{"name": "rendezvous", "containerPort": labels.MASTER_PORT}],
        # A rank whose network preflight fails writes its one-line reason to the termination message, which
        # the operator turns into the NetworkReady condition; other failures fall back to the log's tail.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if template.image_pull_policy:
        container["imagePullPolicy"] = template.image_pull_policy
    container["securityContext"] = security.container_security_context(settings.security, settings.ipc_lock)
    return container


def build_pod(owner: Mapping[str, Any], resolved: ResolvedJob, settings: PodSettings, node_rank: int) -> dict[str, Any]:
    """The pod of `node_rank` in attempt `settings.attempt`."""
    job = resolved.name
    node = settings.nodes[node_rank]
    template = resolved.spec.template
    extra_labels = {
        **(template.labels or {}),
        labels.NODE_RANK_LABEL: str(node_rank),
        labels.ATTEMPT_LABEL: str(settings.attempt),
        labels.NODE_LABEL: node,
        labels.GANG_SIZE_LABEL: str(len(settings.nodes)),
    }
    metadata = labels.child_metadata(owner, labels.pod_name(job, node_rank), extra_labels)
    if template.annotations:
        metadata["annotations"] = dict(template.annotations)
    pod_volumes, mounts = volumes(resolved)
    scratch_volumes, scratch_mounts = security.scratch_volumes(settings.security)
    pod_volumes, mounts = pod_volumes + scratch_volumes, mounts + scratch_mounts
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "hostname": labels.pod_name(job, node_rank),
        "subdomain": labels.service_name(job),
        "affinity": node_affinity(node),
        "serviceAccountName": settings.service_account,
        "enableServiceLinks": False,
        "securityContext": security.pod_security_context(settings.security),
        "containers": [build_container(resolved, settings, node_rank, mounts)],
        "volumes": pod_volumes,
    }
    if settings.progress_account and node_rank != 0:
        # Only rank 0 reports progress; the other ranks get no API credentials at all.
        spec["automountServiceAccountToken"] = False
    selector = dict(template.node_selector or {})
    if kueue_topology.is_tas_pod(template.annotations):
        # Under Kueue's TAS the pod names its node in its nodeSelector too, as Kueue's own TAS pods do: Kueue's
        # node controller finds the pods of a failed node by it (the affinity above alone pins the pod).
        selector[HOSTNAME_LABEL] = node
    optional = {
        "nodeSelector": selector or None,
        "tolerations": copy.deepcopy(list(template.tolerations)) if template.tolerations else None,
        "priorityClassName": template.priority_class_name,
        "resourceClaims": [spec_to_dict(c) for c in template.resource_claims] if template.resource_claims else None,
    }
    spec.update({key: value for key, value in optional.items() if value is not None})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def build_pods(owner: Mapping[str, Any], resolved: ResolvedJob, settings: PodSettings) -> list[dict[str, Any]]:
    """Every pod of the plan, by node rank."""
    return [build_pod(owner, resolved, settings, node_rank) for node_rank in range(settings.plan.nodes)]
