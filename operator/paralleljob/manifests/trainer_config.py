"""The job file the trainer reads (`job.json`, docs/contract.md), for pods and local runs alike.

Pure: a validated job and the planner's plan in, the job.json dict out, written by the contract's one writer
(`paralleljob_contract.jobfile.job_document`). Constant size: the plan's layout, never a per-node list. The
operator stores it in the job's ConfigMap (`manifests.configmap`); the local runner writes it to `DIR/job.json`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from paralleljob.api import ResolvedJob
from paralleljob.api import types as api_types
from paralleljob_contract import jobfile
from paralleljob_contract.layout import AXES, Layout, axis_order_of


def contract_plan(plan: Mapping[str, Any]) -> jobfile.Plan:
    """The job file's plan (layout, axis order, nodes, ranks per node) of a planner's plan (`Plan.to_dict()`)."""
    sizes = plan["layout"]
    order = axis_order_of(plan.get("axisOrder") or list(AXES))
    layout = Layout(int(sizes["pipeline"]), int(sizes["tensor"]), int(sizes["data"]), order)
    return jobfile.make_plan(layout, int(plan["ranksPerNode"]))


def build_trainer_config(resolved: ResolvedJob, plan: Mapping[str, Any], uid: str | None = None) -> dict[str, Any]:
    """The job.json content: identity (with the object's uid on a cluster, which each checkpoint records), the
    resolved spec, the DeepSpeed config and the plan's layout (the resource's apiVersion and kind too, for
    people reading the file; the reader does not need them)."""
    document = jobfile.job_document(
        name=resolved.name,
        namespace=resolved.namespace,
        uid=uid,
        spec=resolved.resolved_spec(),
        deepspeed=resolved.deepspeed_config(),
        plan=contract_plan(plan),
    )
    return {"apiVersion": api_types.API_VERSION, "kind": api_types.KIND, **document}
