"""Events on a ParallelJob, for `kubectl describe pj` and `kubectl get events`.

Posted by the reconciler when something a person should see happens: placement, start, restart,
completion, failure, an invalid spec. A failure to post an Event is logged, never raised: Events are
best-effort in Kubernetes, and must not fail a reconcile.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kubernetes
import urllib3

from paralleljob.k8s.session import Session
from paralleljob.manifests import timestamps

COMPONENT = "paralleljob-operator"
MESSAGE_LIMIT = 1024
log = logging.getLogger(__name__)


def build_event(job: Mapping[str, Any], kind: str, reason: str, message: str) -> dict[str, Any]:
    """A core/v1 Event about `job`; `kind` is Normal or Warning."""
    metadata = job["metadata"]
    now = timestamps.now()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{metadata['name']}.", "namespace": metadata["namespace"]},
        "involvedObject": {
            "apiVersion": job.get("apiVersion"),
            "kind": job.get("kind"),
            "name": metadata["name"],
            "namespace": metadata["namespace"],
            "uid": metadata.get("uid"),
        },
        "type": kind,
        "reason": reason,
        "message": message[:MESSAGE_LIMIT],
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
    }


def post(session: Session, job: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
    event = build_event(job, kind, reason, message)
    try:
        session.send(session.core.create_namespaced_event, job["metadata"]["namespace"], event)
    except (kubernetes.client.ApiException, urllib3.exceptions.HTTPError, OSError) as error:
        log.warning("could not post event %s on %s: %s", reason, job["metadata"]["name"], error)
