"""The headless Service that gives every pod of a job a DNS name (`<job>-<r>.<job>`), so rank 0 is findable.

Pure. `publishNotReadyAddresses` lets ranks resolve rank 0 while pods start, before any readiness.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from paralleljob.manifests import labels


def build_service(owner: Mapping[str, Any]) -> dict[str, Any]:
    """The headless Service `<job>` selecting the job's pods."""
    job = owner["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": labels.child_metadata(owner, labels.service_name(job)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {labels.JOB_LABEL: job},
            "ports": [{"name": "rendezvous", "port": labels.MASTER_PORT, "targetPort": labels.MASTER_PORT}],
        },
    }
