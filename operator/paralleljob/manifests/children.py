"""Everything one attempt of a ParallelJob needs, built in two steps from the job, its plan and its nodes.

Pure. At admission the operator calls `build_attempt()`: it derives the network (fabric, NCCL environment,
RDMA resources) from the planned nodes once and records it, with the plan's layout, in the ConfigMap. Then
`build_children()` builds the Service, rank 0's progress ConfigMap and RBAC, and the pods from that ConfigMap,
the attempt's pinned spec and image, and the node of each node rank (all three from the attempt record in
the same ConfigMap), so the pods run what the ConfigMap and `status.ncclEnv` say, even after an edit, an
operator restart or a Node relabel.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from paralleljob.api import ResolvedJob
from paralleljob.manifests import (
    configmap,
    labels,
    nccl,
    pods,
    progress,
    rbac,
    records,
    security,
    service,
    trainer_config,
)
from paralleljob.planning import Plan
from paralleljob_contract import environment


@dataclasses.dataclass(frozen=True)
class Attempt:
    """The decisions of one attempt: its ConfigMap and the network record inside it."""

    config_map: dict[str, Any]
    network: dict[str, Any]

    @property
    def nccl_env(self) -> dict[str, str]:
        return dict(self.network["ncclEnv"])

    @property
    def fabric(self) -> str:
        return str(self.network["fabric"])

    def refusal(self, resolved: ResolvedJob) -> str | None:
        """Why spec.network.verify: fail refuses this attempt before any pod exists: an RDMA fabric on nodes
        that offer no RDMA resource, unless spec.template.resourceClaims may give the devices (DRA)."""
        if resolved.spec.network.verify != "fail" or not self.network.get("rdmaMissing"):
            return None
        if resolved.spec.template.resource_claims:
            return None
        return "; ".join(self.network.get("warnings") or ("no RDMA resource on the nodes",))


@dataclasses.dataclass(frozen=True)
class Children:
    """The child objects of one attempt besides its ConfigMap, in creation order."""

    service: dict[str, Any]
    # Rank 0's progress ConfigMap; created whatever account the pods run as.
    progress: dict[str, Any]
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


def build_attempt(
    owner: Mapping[str, Any],
    resolved: ResolvedJob,
    plan: Plan,
    planned_nodes: Sequence[Mapping[str, Any]],
    *,
    attempt: int,
    default_fabric: str = "auto",
    default_nccl_env: Mapping[str, str] | None = None,
    record: records.AttemptRecord | None = None,
) -> Attempt:
    """The ConfigMap of one attempt, with the network derived from the planned nodes, and the attempt's record
    (`manifests.records`) when given."""
    network = network_of(resolved, default_fabric, default_nccl_env)
    # MNNVL follows the NVLink-domain label the planner used (the spec's, or one it found on the nodes).
    facts, request, env = nccl.build_network(network, planned_nodes, plan.nvlink_domain_label)
    env = {**env, environment.PLANNED_GBPS: nccl.planned_gbps(plan.cost.levels, plan.gpu_product)}
    network_record = configmap.network_record(
        facts.fabric,
        env,
        request.resources,
        # IPC_LOCK only when the pods really get RDMA devices: a fabric without its device resource is unused.
        nccl.uses_rdma(facts) and bool(request.resources),
        warnings=request.warnings,
        rdma_missing=request.missing,
    )
    job_file = trainer_config.build_trainer_config(resolved, plan, uid=owner["metadata"].get("uid"))
    config_map = configmap.build_config_map(owner, job_file, plan, network_record, attempt)
    if record is not None:
        records.stamp(config_map, record)
    return Attempt(config_map, network_record)


def build_children(
    owner: Mapping[str, Any],
    resolved: ResolvedJob,
    config_map: Mapping[str, Any],
    nodes: Sequence[str],
    *,
    image: str,
    pod_security: security.PodSecurity = security.DEFAULT,
) -> Children:
    """Service, progress RBAC (unless the user names an account) and pods of the ConfigMap's attempt, node
    rank R on `nodes[R]`."""
    plan = configmap.plan_of(config_map)
    if len(nodes) != plan.nodes:
        raise ValueError(f"{len(nodes)} nodes given for a plan of {plan.nodes}")
    network = configmap.network_of(config_map)
    own_account = resolved.spec.template.service_account_name
    settings = pods.PodSettings(
        image=image,
        plan=plan,
        nodes=tuple(nodes),
        nccl_env=network["ncclEnv"],
        network_resources=network["resources"],
        ipc_lock=bool(network["ipcLock"]),
        attempt=configmap.attempt_of(config_map),
        service_account=own_account or labels.progress_account_name(resolved.name),
        progress_account=not own_account,
        security=pod_security,
        # The attempt number is the job's restarts so far (in place or not) when this attempt began.
        in_place_restarts=pods.in_place_budget(resolved, configmap.attempt_of(config_map)),
    )
    return Children(
        service=service.build_service(owner),
        progress=progress.build_config_map(owner),
        rbac=[] if own_account else rbac.build_progress_rbac(owner),
        pods=pods.build_pods(owner, resolved, settings),
        nccl_env=dict(network["ncclEnv"]),
        fabric=str(network["fabric"]),
    )
