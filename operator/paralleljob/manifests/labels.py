"""Names, labels and owner references shared by every child object of a ParallelJob.

Pure. Names are deterministic (`<job>-<nodeRank>` pods, `<job>` Service, `<job>-config` ConfigMap,
`<job>-progress` ServiceAccount/Role/RoleBinding), so a restarted operator finds what it made before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from paralleljob.api import types as api_types

JOB_LABEL = "paralleljob.io/job"
NODE_RANK_LABEL = "paralleljob.io/node-rank"
ATTEMPT_LABEL = "paralleljob.io/attempt"
NODE_LABEL = "paralleljob.io/node"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "paralleljob-operator"
CONTAINER_NAME = "trainer"
MASTER_PORT = 29500


def pod_name(job: str, node_rank: int) -> str:
    return f"{job}-{node_rank}"


def service_name(job: str) -> str:
    return job


def config_map_name(job: str) -> str:
    return f"{job}-config"


def progress_account_name(job: str) -> str:
    return f"{job}-progress"


def master_address(job: str) -> str:
    """Rank 0's DNS name through the headless Service."""
    return f"{pod_name(job, 0)}.{service_name(job)}"


def job_labels(job: str) -> dict[str, str]:
    """Labels every child carries; the pod watch selects on JOB_LABEL."""
    return {JOB_LABEL: job, MANAGED_BY_LABEL: MANAGED_BY}


def owner_reference(owner: Mapping[str, Any]) -> dict[str, Any]:
    """The controller owner reference to the ParallelJob, so that deleting the job deletes its children."""
    metadata = owner["metadata"]
    return {
        "apiVersion": api_types.API_VERSION,
        "kind": api_types.KIND,
        "name": metadata["name"],
        "uid": metadata["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def child_metadata(owner: Mapping[str, Any], name: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """metadata of a child object: name, the job's namespace, labels and the owner reference."""
    job = owner["metadata"]["name"]
    return {
        "name": name,
        "namespace": owner["metadata"]["namespace"],
        "labels": {**job_labels(job), **(labels or {})},
        "ownerReferences": [owner_reference(owner)],
    }
