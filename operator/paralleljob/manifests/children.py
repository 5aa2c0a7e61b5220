"""Everything one attempt of a ParallelJob needs, built in one place from the job, its plan and its nodes.

Pure. The operator calls `build_children()` once per attempt; the NCCL facts come from the planned nodes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from paralleljob.api import ResolvedJob
from paralleljob.manifests import configmap, labels, nccl, pods, rbac, service, trainer_config


@dataclasses.dataclass(frozen=True)
class Children:
    """The child objects of one attempt, in creation order."""

    config_map: dict[str, Any]
    service: dict[str, Any]
    rbac: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    nccl_env: dict[str, str]
    fabric: str


def network_of(
    resolved: ResolvedJob, default_fabric: str = "auto", default_nccl_env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """spec.network as YAML, with the operator's defaults beneath it: its fabric replaces `auto`, and its
    NCCL variables apply unless the job's spec.network.ncclEnv sets the same name."""
    network = dict(resolved.resolved_spec().get("network") or {})
    if network.get("fabric", "auto") == "auto":
        network["fabric"] = default_fabric
    if default_nccl_env:
        network["ncclEnv"] = {**default_nccl_env, **(network.get("ncclEnv") or {})}
    return network


def build_children(
    owner: Mapping[str, Any],
    resolved: ResolvedJob,
    plan: Mapping[str, Any],
    planned_nodes: Sequence[Mapping[str, Any]],
    *,
    image: str,
    attempt: int,
    default_fabric: str = "auto",
    default_nccl_env: Mapping[str, str] | None = None,
) -> Children:
    """ConfigMap, Service, progress RBAC (unless the user names an account) and pods of one attempt."""
    network = network_of(resolved, default_fabric, default_nccl_env)
    facts = nccl.detect_facts(network, planned_nodes, resolved.spec.topology.nvlink_domain_label)
    nccl_env = nccl.build_nccl_env(network, facts.fabric, nvswitch=facts.nvswitch, mnnvl=facts.mnnvl)
    own_account = resolved.spec.template.service_account_name
    settings = pods.PodSettings(
        image=image,
        plan=plan,
        nccl_env=nccl_env,
        network_resources=nccl.rdma_request(network, facts),
        ipc_lock=nccl.uses_rdma(facts),
        attempt=attempt,
        service_account=own_account or labels.progress_account_name(resolved.name),
    )
    job_file = trainer_config.build_trainer_config(resolved, plan)
    return Children(
        config_map=configmap.build_config_map(owner, job_file, plan, nccl_env, attempt),
        service=service.build_service(owner),
        rbac=[] if own_account else rbac.build_progress_rbac(owner),
        pods=pods.build_pods(owner, resolved, settings),
        nccl_env=nccl_env,
        fabric=facts.fabric,
    )
