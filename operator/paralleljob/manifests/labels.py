"""Names, labels and owner references shared by every child object of a ParallelJob.

Pure. Names are deterministic (`<job>-<nodeRank>` pods, `<job>` Service, `<job>-config` ConfigMap,
`<job>-progress` ServiceAccount/Role/RoleBinding and rank 0's progress ConfigMap), so a restarted operator
finds what it made before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from paralleljob.api import types as api_types
from paralleljob_contract import launcher, progress

JOB_LABEL = "paralleljob.io/job"
NODE_RANK_LABEL = "paralleljob.io/node-rank"
ATTEMPT_LABEL = "paralleljob.io/attempt"
NODE_LABEL = "paralleljob.io/node"
# The number of pods of the pod's gang: the only pod of a single-node gang is never force-deleted.
GANG_SIZE_LABEL = "paralleljob.io/gang-size"
# On a job's `-config` ConfigMap while its attempt record reserves nodes (`records.AttemptRecord.reserving`), so
# that an admission reads every reservation of the cluster with one label-selected list.
RESERVING_LABEL = "paralleljob.io/reserving"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "paralleljob-operator"
CONTAINER_NAME = "trainer"
MASTER_PORT = launcher.DEFAULT_MASTER_PORT


def pod_name(job: str, node_rank: int) -> str:
    return f"{job}-{node_rank}"


def service_name(job: str) -> str:
    return job


def config_map_name(job: str) -> str:
    return f"{job}-config"


def progress_account_name(job: str) -> str:
    return f"{job}-progress"


def progress_config_map_name(job: str) -> str:
    return progress.config_map_name(job)


def master_address(job: str) -> str:
    """Rank 0's DNS name through the headless Service."""
    return f"{pod_name(job, 0)}.{service_name(job)}"


def job_labels(job: str) -> dict[str, str]:
    """Labels every child carries; the pod watch selects on JOB_LABEL."""
    return {JOB_LABEL: job, MANAGED_BY_LABEL: MANAGED_BY}


def owner_reference(owner: Mapping[str, Any]) -> dict[str, Any]:
    """The controller owner reference to the ParallelJob, so that deleting the job deletes its children.

    No `blockOwnerDeletion`: setting it needs `update` on `paralleljobs/finalizers` (clusters with the
    OwnerReferencesPermissionEnforcement admission plugin refuse it otherwise), and only foreground deletion
    of the job would wait on it.
    """
    metadata = owner["metadata"]
    return {
        "apiVersion": api_types.API_VERSION,
        "kind": api_types.KIND,
        "name": metadata["name"],
        "uid": metadata["uid"],
        "controller": True,
    }


def owner_uid(obj: Mapping[str, Any]) -> str | None:
    """The uid of the ParallelJob that controls `obj`, or None."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("kind") == api_types.KIND and ref.get("controller"):
            return str(ref.get("uid"))
    return None


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether `obj` is a child of the ParallelJob with this uid (not of an earlier job of the same name)."""
    return owner_uid(obj) == uid


def claim_of(obj: Mapping[str, Any], job: str, uid: str) -> Literal["own", "namesake", "foreign"]:
    """Whose an object holding one of a job's child names is: the job's own (by owner uid), a leftover of a
    deleted job of the same name (the garbage collector removes it soon), or anyone else's (a name conflict)."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("kind") == api_types.KIND and ref.get("controller"):
            if str(ref.get("uid")) == uid:
                return "own"
            if ref.get("name") == job:
                return "namesake"
    return "foreign"


def holder_of(obj: Mapping[str, Any]) -> str:
    """Who controls `obj`, for a person: its controller owner, or that it has none."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("controller"):
            return f"{ref.get('kind')} {ref.get('name')}"
    return "no controller"


def child_metadata(owner: Mapping[str, Any], name: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """metadata of a child object: name, the job's namespace, labels and the owner reference. The job's labels
    come last, so no extra label can override the ones the operator selects its pods by."""
    job = owner["metadata"]["name"]
    return {
        "name": name,
        "namespace": owner["metadata"]["namespace"],
        "labels": {**(labels or {}), **job_labels(job)},
        "ownerReferences": [owner_reference(owner)],
    }
