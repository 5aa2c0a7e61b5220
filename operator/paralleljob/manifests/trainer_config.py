"""The job file the trainer reads (`job.json`, docs/contract.md), for pods and local runs alike.

Pure: a validated job and the planner's plan in, the job.json dict out, written by the contract's one writer
(`paralleljob_contract.jobfile.job_document`). Constant size: the plan's layout, never a per-node list. The
operator stores it in the job's ConfigMap (`manifests.configmap`); the local runner writes it to `DIR/job.json`.
"""

from __future__ import annotations

from typing import Any

from paralleljob.api import ResolvedJob
from paralleljob.api import types as api_types
from paralleljob.planning import Plan
from paralleljob_contract import efficiency, jobfile


def contract_plan(plan: Plan) -> jobfile.Plan:
    """The job file's plan (layout, axis order, nodes, ranks per node) of a planner's plan."""
    return jobfile.make_plan(plan.layout, plan.ranks_per_node)


def modeled_of(plan: Plan) -> efficiency.Modeled | None:
    """The planner's promise the run reports against: its modeled step time, and the peak it assumed where the
    GPU product is one it knows (elsewhere, a CPU among them, MFU is not reported rather than invented)."""
    step = plan.estimates.step_seconds
    if not step or step <= 0:
        return None
    known = efficiency.peak_tflops_for(plan.gpu_product) is not None
    assumed = plan.estimates.assumptions.get("peakTFLOPS")
    peak = float(assumed) if known and isinstance(assumed, int | float) and assumed > 0 else None
    return efficiency.Modeled(step_seconds=step, peak_tflops=peak)


def build_trainer_config(resolved: ResolvedJob, plan: Plan, uid: str | None = None) -> dict[str, Any]:
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
        modeled=modeled_of(plan),
    )
    return {"apiVersion": api_types.API_VERSION, "kind": api_types.KIND, **document}
