"""The operator killed mid-pass, as the kill-loop tests do it: a pass of a freshly started operator cut off after
a number of API requests (the fault proxy answers every later request 503), and what the history must not show."""

from __future__ import annotations

from typing import Any

import kubernetes

from paralleljob.handlers import reconcile
from tests.operator.helpers import Cluster, fresh_view


def one_pass(
    session: Any,
    settings: reconcile.Settings,
    cluster: Cluster,
    apiserver: Any,
    job: str,
    kill_after: int | None,
    answer_lost: bool = False,
) -> bool:
    """A pass of a freshly started operator (supervision, then admission when it asks for it), killed after
    `kill_after` requests, the last of them unanswered when `answer_lost`; True when it was killed."""
    apiserver.operator_outage_after = kill_after
    apiserver.operator_outage_loses_last_answer = answer_lost
    try:
        view = fresh_view(cluster)
        outcome = reconcile.reconcile(session, settings, "research", job, view)
        if outcome.admission is not None:
            reconcile.reconcile(session, settings, "research", job, view, admit=True)
    except kubernetes.client.ApiException as error:
        if error.status != 503:
            raise
        return True
    finally:
        apiserver.operator_outage_after = None
        apiserver.operator_outage_loses_last_answer = False
    return False


def duplicate_pods(apiserver: Any) -> list[str]:
    """Every pod name created again while a pod of that name still existed."""
    live: set[str] = set()
    found = []
    for change in apiserver.history:
        if change.plural != "pods":
            continue
        if change.kind == "DELETED":
            live.discard(change.name)
        elif change.kind == "ADDED":
            if change.name in live:
                found.append(change.name)
            live.add(change.name)
    return found
