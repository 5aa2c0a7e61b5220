"""Topology-aware 3D placement: which node runs which ranks of a ParallelJob, and what it should cost.

Pure code (no kubernetes, kopf or torch): callers pass Kubernetes objects as dicts and get frozen outcomes.

    reservations = planning.job_reservations(job_dicts, pod_dicts, exclude=(namespace, name))
    cluster = planning.build_cluster(node_dicts, pod_dicts, reservations)
    outcome = planning.plan_job(resolved_job, cluster)      # Plan | Unschedulable
    outcome.to_dict()                                       # the plan as `paralleljob plan` prints it

The job file the trainer reads carries only the plan's layout (`manifests.trainer_config.contract_plan`), never
this per-node plan.

The operator, the local runner (`local_cluster_nodes`) and `paralleljob plan` call it; docs/planning.md
documents the rules, the cost model and the JSON schema.
"""

from paralleljob.planning.costmodel import CostModel
from paralleljob.planning.inventory import (
    Cluster,
    NodeInfo,
    Reservation,
    build_cluster,
    job_reservations,
    local_cluster_nodes,
)
from paralleljob.planning.plan import Estimates, NodePlan, PlacementCost, Plan, SpareNode, Unschedulable
from paralleljob.planning.planner import PlanningOptions, plan_job, pod_requests, spares_for
from paralleljob_contract.layout import Coord, Layout


def reservations_of(plan: Plan, holder: str) -> list[Reservation]:
    """The GPUs a plan holds, as reservations for planning other jobs before its pods are bound: its nodes' and
    its hot spares'."""
    held = [(node.node, node.gpus) for node in plan.nodes] + [(spare.node, spare.gpus) for spare in plan.spares]
    return [Reservation(node, gpus, holder) for node, gpus in held]


__all__ = [
    "Cluster",
    "Coord",
    "CostModel",
    "Estimates",
    "Layout",
    "NodeInfo",
    "NodePlan",
    "PlacementCost",
    "Plan",
    "PlanningOptions",
    "Reservation",
    "SpareNode",
    "Unschedulable",
    "build_cluster",
    "job_reservations",
    "local_cluster_nodes",
    "plan_job",
    "pod_requests",
    "reservations_of",
    "spares_for",
]
