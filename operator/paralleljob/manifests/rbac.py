"""The per-job identity rank 0 reports progress with: a ServiceAccount bound to a Role that may only `patch`
the job's own progress ConfigMap (resourceNames: [<job>-progress], see `manifests.progress`): the hook sends
merge patches and never reads. Nothing else: not the ParallelJob or its status, not Secrets, not another job's
progress object.

Pure. The operator creates these unless spec.template.serviceAccountName names the user's own account.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from paralleljob.manifests import labels

PROGRESS_VERBS = ("patch",)


def build_service_account(owner: Mapping[str, Any]) -> dict[str, Any]:
    name = labels.progress_account_name(owner["metadata"]["name"])
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": labels.child_metadata(owner, name)}


def build_role(owner: Mapping[str, Any]) -> dict[str, Any]:
    job = owner["metadata"]["name"]
    rule = {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "resourceNames": [labels.progress_config_map_name(job)],
        "verbs": list(PROGRESS_VERBS),
    }
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": labels.child_metadata(owner, labels.progress_account_name(job)),
        "rules": [rule],
    }


def build_role_binding(owner: Mapping[str, Any]) -> dict[str, Any]:
    job = owner["metadata"]["name"]
    name = labels.progress_account_name(job)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": labels.child_metadata(owner, name),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": owner["metadata"]["namespace"]}],
    }


def build_progress_rbac(owner: Mapping[str, Any]) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding, in creation order."""
    return [build_service_account(owner), build_role(owner), build_role_binding(owner)]
