"""MultiKueue, pure (the Kueue step, `handlers.steps.kueue`, decides with it): a ParallelJob dispatched from a
manager cluster to a worker cluster by Kueue's generic adapter for external frameworks (Kueue's Configuration `multiKueue.externalFrameworks` naming the kind, feature gate
MultiKueueAdaptersForCustomJobs; docs/install.md, MultiKueue). Kueue v0.17's adapter
(pkg/controller/admissionchecks/multikueue/externalframeworks) works on the job object alone:

- on the manager, a job with `spec.managedBy: kueue.x-k8s.io/multikueue` (any other value: Kueue rejects the
  admission check) is queued like any other: the operator creates its Workload (`handlers.steps.kueue`), owned by
  the job, which is how Kueue finds the job. Kueue copies the Workload to the worker clusters, and once one
  admits it, creates the job there (the spec without `managedBy`, labelled `kueue.x-k8s.io/prebuilt-workload-name`
  with the Workload's name) and from then on copies the worker job's whole status into the manager's. The
  manager's operator creates no pods for it and stops writing its status once the Workload has a worker
  (`dispatched`): from then on the status is the worker's;
- on the worker, the job names the Workload Kueue made for it (`prebuilt`): the operator adopts it (a
  controller ownerReference to the job, as Kueue's own integrations do with a prebuilt Workload: `adoptable`)
  instead of creating one, and runs the job once it is admitted, as any queued job;
- deleting the job on the manager deletes its Workload (garbage collector); Kueue then deletes the job and the
  Workload on the worker. A job that ends on the worker ends its Workload there (Finished), which Kueue copies
  to the manager's Workload before it removes the worker's objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from paralleljob.api import ResolvedJob
from paralleljob.manifests import workload as wl

# Kueue's MultiKueue controller (kueue.MultiKueueControllerName), as `spec.managedBy` names it.
MULTIKUEUE = "kueue.x-k8s.io/multikueue"
# The label Kueue puts on the job it creates on a worker: the name of the Workload it made there for it.
PREBUILT_LABEL = "kueue.x-k8s.io/prebuilt-workload-name"


def managed_elsewhere(current: ResolvedJob) -> bool:
    return current.spec.managed_by == MULTIKUEUE


def prebuilt(job: Mapping[str, Any]) -> str | None:
    """The Workload Kueue made for this job (on a worker cluster), or None."""
    found = ((job.get("metadata") or {}).get("labels") or {}).get(PREBUILT_LABEL)
    return str(found) if found else None


def dispatched(found: Mapping[str, Any]) -> bool:
    """Kueue chose a worker for the Workload (status.clusterName; the manager admits it only then), or it ended:
    the job's status is the worker's."""
    status = found.get("status") or {}
    return bool(status.get("clusterName")) or wl.is_true(found, wl.ADMITTED) or wl.is_true(found, wl.FINISHED)


def adoptable(job: Mapping[str, Any], found: Mapping[str, Any]) -> bool:
    """Whether `found` is this job's prebuilt Workload with no controller yet, which the job is to control."""
    metadata = found.get("metadata") or {}
    if prebuilt(job) != metadata.get("name"):
        return False
    return not any(ref.get("controller") for ref in metadata.get("ownerReferences") or ())
