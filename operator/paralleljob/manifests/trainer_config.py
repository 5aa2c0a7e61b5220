"""The job file the trainer reads (`job.json`, docs/architecture.md), for pods and local runs alike.

Pure: a validated job and the plan's JSON form in, the job.json dict out. The operator stores it in the job's
ConfigMap (`manifests.configmap`); the local runner writes it to `DIR/job.json`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from paralleljob.api import ResolvedJob
from paralleljob.api import types as api_types

# Plan keys the trainer reads; estimates and cost stay out of job.json (they are the planner's report).
TRAINER_PLAN_KEYS = ("layout", "worldSize", "ranksPerNode", "axisOrder", "nodes")


def build_trainer_config(resolved: ResolvedJob, plan: Mapping[str, Any]) -> dict[str, Any]:
    """The job.json content: identity, the resolved spec, the DeepSpeed config and the plan."""
    return {
        "apiVersion": api_types.API_VERSION,
        "kind": api_types.KIND,
        "metadata": {"name": resolved.name, "namespace": resolved.namespace},
        "spec": resolved.resolved_spec(),
        "deepspeed": resolved.deepspeed_config(),
        "plan": {key: copy.deepcopy(plan[key]) for key in TRAINER_PLAN_KEYS if key in plan},
    }
