"""The observe step of a reconcile pass: read what the pass decides from into one frozen `Observed`.

Called by `handlers.reconcile` once per pass, after the job and its attempt record are read, and again after a
write was refused for a name someone else holds (the refusal is then part of what is observed, with the pods
read again). It reads the job's pods (one LIST by the job's label), the nodes of the terminating ones the
watches do not know (`passes.lost_nodes`), and, for a job whose record says a name conflict released it, the
object named there; the rest comes from the pass (`Pass`: the job, its record, the watches' view).
"""

from __future__ import annotations

from paralleljob.api import ResolvedJob
from paralleljob.handlers import gang
from paralleljob.handlers.observed import Observed, attempt_of, is_terminating
from paralleljob.handlers.passes import Pass, lost_nodes
from paralleljob.k8s import reads, writes
from paralleljob.manifests import labels


def observe(p: Pass, spec: ResolvedJob | None, spec_problems: str, *, refused: str = "") -> Observed:
    """What the pass `p` decides from: its job and record, the current spec's verdict, the job's pods read now.
    A job with an invalid spec that never had an attempt has no pods to look at: it is not listed (an invalid
    job costs its passes no LIST)."""
    never_admitted_invalid = spec is None and p.record is None
    labelled = () if never_admitted_invalid else tuple(reads.list_job_pods(p.session, p.namespace, p.name))
    pods = tuple(pod for pod in labelled if labels.owned_by(pod, p.uid))
    namesake = tuple(pod for pod in labelled if labels.claim_of(pod, p.name, p.uid) == "namesake")
    old = [pod for pod in pods if attempt_of(pod) != p.attempt] + list(namesake)
    lost = lost_nodes(p, [gang.node_of(pod) for pod in old if is_terminating(pod)])
    return Observed(
        job=p.job,
        record=p.record,
        config_map=p.config_map,
        spec=spec,
        spec_problems=spec_problems,
        pods=pods,
        namesake=namesake,
        labelled=labelled,
        lost=lost,
        not_ready=p.nodes.not_ready,
        out_of_service=frozenset(p.nodes.snapshot.out_of_service),
        conflict_held=_conflict_held(p, pods),
        spec_problem=p.spec_problem,
        refused=refused,
    )


def _conflict_held(p: Pass, pods: tuple[object, ...]) -> bool:
    """Whether the object a name conflict in the record names is still someone else's (read only when the
    record says so and the job's own pods are gone: until then the pass waits for them anyway)."""
    if p.record is None or not p.record.conflict or pods:
        return False
    named = writes.NameConflict.named_in(p.record.conflict)
    if named is None:
        return False
    held = writes.read(p.session, named[0], named[1], p.namespace)
    return held is not None and labels.claim_of(held, p.name, p.uid) == "foreign"
