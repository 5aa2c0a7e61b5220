"""The observe step of a reconcile pass: read what the pass decides from into one frozen `Observed`.

Called by `handlers.reconcile` once per pass, after the job and its attempt record are read, and again after a
write was refused for a name someone else holds (the refusal is then part of what is observed, with the pods
read again). It reads the job's pods (one LIST by the job's label), the nodes of the terminating ones the
watches do not know (`passes.lost_nodes`), and, for a job whose record says a name conflict released it, the
object named there; the rest comes from the pass (`Pass`: the job, its record, the watches' view). What only a
placed gang's steps need is added later in the pass, once it is known to need it: `for_gang` (the lost nodes of
the gang, its spares and its pods, with the watch's NotReady times, pull failures and the weighed lost-peer
evidence: one look for the spare step and supervision, which judge the gang on the same evidence), `for_spares`
(the nodes of a gang whose pod vanished, looked up afresh, beside supervision's lost nodes), `last_checkpoint`
(for a shrunk job whose full size fits again), `cluster_view` and `for_admission` (what an admission plans against
and the `-config` ConfigMap it replaces, read under the admission lock) and `with_report` (rank 0's progress ConfigMap, read only when
supervision's decision uses it: a quiet running gang without a watchdog, in-place restarts or a grow-back costs
no read, as before).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from paralleljob.api import ResolvedJob
from paralleljob.handlers import gang
from paralleljob.handlers.nodes import shut_down
from paralleljob.handlers.observed import Observed, attempt_of, is_terminating
from paralleljob.handlers.passes import Pass, lost_nodes
from paralleljob.handlers.placement import ClusterView
from paralleljob.k8s import reads, writes
from paralleljob.manifests import labels, records
from paralleljob.manifests import progress as progress_channel


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
        known=p.nodes.known,
        watched_nodes=p.nodes.snapshot.dicts,
    )


def for_gang(p: Pass, seen: Observed, nodes: Collection[str | None]) -> Observed:
    """What supervision and the spare step judge a placed gang on (`nodes`: its node ranks, spares and pods'
    nodes), observed once for both: those NotReady or deleted (`passes.lost_nodes`: one look at a node the
    watch does not know), the watch's NotReady times and failed pulls, and the lost-peer evidence the pass
    weighed (`handlers.lost_peers.weighed`: the report and the Leases read once for the pass)."""
    peers, recheck_in = p.gang_lost if p.gang_lost is not None else ({}, None)
    return dataclasses.replace(
        seen,
        gang_nodes_lost=lost_nodes(p, nodes),
        not_ready_since=p.nodes.snapshot.not_ready_since,
        pull_failures=p.nodes.pull_failures,
        peers_lost=dict(peers),
        peers_recheck_in=recheck_in,
    )


def with_report(p: Pass, seen: Observed) -> Observed:
    """The observation with the job's progress ConfigMap (rank 0's report: progress, checkpoint, network verdict,
    in-place restarts), when the job owns it; read right before supervision decides, and only when its decision
    uses it (`steps.supervision.reads_report`)."""
    found = reads.get_config_map(p.session, p.namespace, labels.progress_config_map_name(p.name))
    return dataclasses.replace(seen, progress=found if found is not None and labels.owned_by(found, p.uid) else None)


def for_spares(p: Pass, seen: Observed, lost: Mapping[str, str] | None) -> Observed:
    """What the spare step (`steps.replacement`) decides from: the gang's lost-peer evidence as the pass weighed
    it, and between moves (`lost`: supervision's lost nodes of the gang and its spares; None while a move is
    under way, when nothing is looked up) those with the nodes whose pod vanished (`vanished_on_lost_nodes`)."""
    vanished = vanished_on_lost_nodes(p, seen, seen.pods, lost) if lost is not None else {}
    return dataclasses.replace(
        seen,
        lost_now={**(lost or {}), **vanished},
        peers_lost=dict(p.gang_lost[0]) if p.gang_lost is not None else {},
    )


def vanished_on_lost_nodes(
    p: Pass, seen: Observed, pods: Sequence[Mapping[str, Any]], known_lost: Mapping[str, str]
) -> dict[str, str]:
    """The nodes of the live gang's node ranks whose pod is gone or being deleted, looked up afresh: deleted
    ones, and NotReady ones tainted out-of-service, with why. The pod garbage collector deletes such a node's
    pods at once, and that deletion can reach a pass before the Node watch brings the taint (seen in CI):
    without this look the vanished pod broke the gang, which restarted on a stale view of the nodes."""
    live = seen.live
    assert live is not None
    # A pod being deleted counts as gone: Kubernetes' taint eviction deletes it gracefully first.
    present = {
        int(pod["metadata"]["labels"][labels.NODE_RANK_LABEL])
        for pod in pods
        if labels.NODE_RANK_LABEL in (pod["metadata"].get("labels") or {}) and not is_terminating(pod)
    }
    found: dict[str, str] = {}
    for rank, node in enumerate(live.nodes):
        if rank in present or node in known_lost:
            continue
        current = reads.get_node(p.session, node)
        if current is None:
            found[node] = "no longer exists"
        elif shut_down(current):
            found[node] = "is NotReady and tainted out-of-service"
    return found


def last_checkpoint(p: Pass, current: ResolvedJob) -> int | None:
    """The checkpoint step rank 0 last reported in the progress channel; None when it reported none."""
    found = reads.get_config_map(p.session, p.namespace, labels.progress_config_map_name(p.name))
    reported = progress_channel.status_of(found, current.spec.training.steps) if found is not None else {}
    step = reported.get("lastCheckpointStep")
    return step if isinstance(step, int) else None


def cluster_view(p: Pass, labelled: Sequence[Mapping[str, Any]]) -> ClusterView:
    """What an admission pass plans against: the watches' node records and usage totals (less this job's rank pods
    the API no longer has, `labelled` being its pods read now), and every job's reservations but this one's, read
    from the API under the admission lock (so the placement another operator wrote just before is in it), with
    those of the admission round's start that are not yet released."""
    # Every job's record of the cluster, whatever namespaces this operator manages: a job another operator
    # placed (one per team, each watching its own namespaces) holds its nodes all the same.
    found = reads.list_reserving_config_maps(p.session)
    present = {pod["metadata"]["name"] for pod in labelled}
    usage = p.nodes.usage.without(departed_pods(p.namespace, p.name, p.nodes.usage.claims, present))
    held = records.reservations_of(found, exclude=(p.namespace, p.name), bound=usage.bound)
    if p.nodes.round_held is not None:
        holder = f"{p.namespace}/{p.name}"
        earlier = sorted((r for r in p.nodes.round_held if r.holder != holder), key=lambda r: (r.node, r.holder))
        held = list(dict.fromkeys([*held, *earlier]))  # a reservation in both counts once
    return ClusterView(p.nodes.snapshot, usage.usage, held, p.nodes.builder)


def departed_pods(
    namespace: str, job: str, claims: Iterable[tuple[str, str]], present: Collection[str]
) -> list[tuple[str, str]]:
    """Of the usage index's pods, the job's rank pods (`<job>-<nodeRank>` in its namespace) not in `present`: the
    index learns of a deletion a moment after the API, and a restarting gang must not wait on its own old pods."""
    named = re.compile(rf"{re.escape(job)}-\d+")
    return [
        (their_namespace, name)
        for their_namespace, name in claims
        if their_namespace == namespace and name.startswith(job) and named.fullmatch(name) and name not in present
    ]


def for_admission(p: Pass, seen: Observed, current: ResolvedJob, view: ClusterView) -> Observed:
    """What the admission step (`steps.admission`) decides from: the job's spec as it is to be planned (`current`:
    narrowed to Kueue's admitted flavours for a queued job), the cluster view, and the job's `-config` ConfigMap
    read again under the admission lock, which the attempt's ConfigMap replaces (the previous attempt's, or a
    deleted namesake's the garbage collector has not removed yet). One another owner holds is refused here
    (`writes.NameConflict`), as the create would be."""
    name = labels.config_map_name(p.name)
    previous = reads.get_config_map(p.session, p.namespace, name)
    if previous is not None and labels.claim_of(previous, p.name, p.uid) == "foreign":
        raise writes.NameConflict("ConfigMap", name, labels.holder_of(previous))
    return dataclasses.replace(seen, spec=current, cluster=view, admission_config_map=previous)


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
