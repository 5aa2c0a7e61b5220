"""Hot spares in supervision (spec.failurePolicy.spareNodes): a lost node rank moves to the spare that costs least.

When a node of a placed gang is lost (deleted, or NotReady past the grace period) and the attempt holds a spare
that may take its place (`planning.spares.cheapest_replacement`), the record is written first: the node rank's
node is the spare, the spare is used up, and the rank is `replacing`. Then only that rank's pod is deleted
(force-deleted at once when its node is deleted or tainted out-of-service, else once overdue as
`steps.draining` does), and once the old pod object is gone it is created again on the spare, with the same
name, node rank and environment (the attempt's ConfigMap is unchanged). The pods on healthy nodes are never
touched: the survivors re-form the gang with the new pod through the in-pod restart of the launcher. A spare
that is lost itself is dropped from the record. A running job short of spares (used or lost) asks for an
admission pass, which holds more where the cluster allows (`top_up`). Without a spare for every lost rank,
nothing here applies and supervision restarts the gang as before.

The DP shrink's way back lives here too: a running shrunk attempt (spec.failurePolicy.allowDataShrink) asks for
an admission pass, which notes in the record, once the full size fits again, the checkpoint step after which
supervision restarts the gang into the full size (`grow_when_fits`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from paralleljob import planning
from paralleljob.api import ResolvedJob
from paralleljob.handlers import gang, lost_peers, stragglers
from paralleljob.handlers.nodes import shut_down
from paralleljob.handlers.observed import is_terminating
from paralleljob.handlers.passes import Outcome, Pass, deleting_for, write_record, write_status
from paralleljob.k8s import reads, writes
from paralleljob.manifests import children as child_objects
from paralleljob.manifests import configmap, labels, records
from paralleljob.manifests import progress as progress_channel
from paralleljob.planning import spares
from paralleljob.planning.inventory import Cluster, Reservation
from paralleljob.planning.plan import Plan, SpareNode

# How soon to look again while the lost rank's old pod object is still there.
OLD_POD_RECHECK_SECONDS = 0.5
# How often a job short of spares is offered to the admission queue again without a change in the cluster.
SPARE_RECHECK_SECONDS = 60.0


def take_spares(p: Pass, lost: Mapping[str, str]) -> Outcome | None:
    """Move every lost node rank to a spare and start replacing their pods; drop lost spares. None when this
    does not apply (no lost node, or a lost node rank without a spare): supervision goes on as before."""
    live = p.live
    assert live is not None
    lost_spares = [node for node in live.spare_nodes if node in lost]
    lost_ranks = [rank for rank, node in enumerate(live.nodes) if node in lost and rank not in live.replacing]
    if not lost_ranks:
        if lost_spares:
            _drop_spares(p, live, lost_spares, lost)
        return None
    plan = current_plan(p, live)
    if plan is None:
        return None
    usable = [spare for spare in plan.spares if spare.node not in lost and spare.node not in p.nodes.not_ready]
    taken = choose(plan, lost_ranks, usable)
    if taken is None:
        return None
    record = live.with_spares_taken({rank: spare.node for rank, spare in taken.items()}, lost_spares)
    write_record(p, record)
    moves = ", ".join(
        f"node rank {rank} from {live.nodes[rank]} ({lost[live.nodes[rank]]}) to spare {spare.node}"
        for rank, spare in taken.items()
    )
    message = f"moving {moves}; the pods on healthy nodes stay"
    write_status(p, {"message": message, "spareNodes": list(record.spare_nodes) or None})
    p.event("Warning", "SpareTaken", message)
    return Outcome("replacing-node", requeue_after=0.0)


def exclude_slow_nodes(p: Pass, resolved: ResolvedJob) -> tuple[Pass, dict[str, str]]:
    """Under stragglers.action Replace, while the gang holds a spare: the named nodes of the gang, added to the
    job's excluded nodes (record and status) before a spare takes their node rank like a lost node's; the pass
    with the record as written, so that the move's own record keeps them."""
    live = p.live
    assert live is not None
    named = (p.status.get("progress") or {}).get("stragglers")
    action = resolved.spec.failure_policy.stragglers.action
    slow = stragglers.to_replace(named, live.nodes, p.excluded, action)
    if not slow or not live.spare_nodes:
        return p, {}
    excluded = [*p.excluded, *slow]
    record = dataclasses.replace(live, excluded_nodes=tuple(excluded))
    write_record(p, record)
    write_status(p, {"excludedNodes": excluded})
    return dataclasses.replace(p, record=record), slow


def choose(plan: Plan, ranks: Sequence[int], usable: Sequence[SpareNode]) -> dict[int, SpareNode] | None:
    """A spare for each of `ranks`, each the cheapest left for it in rank order; None when one has none."""
    left = list(usable)
    taken: dict[int, SpareNode] = {}
    for rank in ranks:
        spare = spares.cheapest_replacement(plan, rank, left)
        if spare is None:
            return None
        taken[rank] = spare
        left = [other for other in left if other.node != spare.node]
    return taken


def current_plan(p: Pass, live: records.AttemptRecord) -> Plan | None:
    """The attempt's plan (its ConfigMap's plan.json, which leaves the nodes out) with the record's nodes and
    spares, their domains from the Node watch; None without this attempt's plan."""
    raw = _plan_json(p)
    if raw is None:
        return None
    keys = [*(raw.get("levels") or ()), *([raw["nvlinkDomainLabel"]] if raw.get("nvlinkDomainLabel") else [])]
    nodes = [
        {"nodeRank": rank, "node": node, "gpus": live.gpus_per_node, "ranks": [], "coords": [],
         "domains": _domains(p, node, keys)}
        for rank, node in enumerate(live.nodes)
    ]  # fmt: skip
    held = [{"node": node, "gpus": live.gpus_per_node, "domains": _domains(p, node, keys)} for node in live.spare_nodes]
    return Plan.from_dict({**raw, "nodes": nodes, "spares": held})


def _plan_json(p: Pass) -> dict[str, Any] | None:
    """This attempt's plan.json, from its ConfigMap; None without one."""
    found = reads.get_config_map(p.session, p.namespace, labels.config_map_name(p.name))
    if found is None or not labels.owned_by(found, p.uid) or configmap.attempt_of(found) != p.attempt:
        return None
    raw = json.loads((found.get("data") or {}).get(configmap.PLAN_FILE) or "{}")
    return raw if isinstance(raw, dict) and "layout" in raw and "estimates" in raw else None


def _domains(p: Pass, node: str, keys: Sequence[str]) -> dict[str, str]:
    """The node's value of each network level and NVLink label, from the Node watch ({} for a deleted node: the
    price of a move does not depend on the node that leaves)."""
    found = ((p.nodes.snapshot.dicts.get(node) or {}).get("metadata") or {}).get("labels") or {}
    return {key: str(found[key]) for key in keys if found.get(key)}


def _drop_spares(p: Pass, live: records.AttemptRecord, gone: Sequence[str], lost: Mapping[str, str]) -> None:
    record = live.with_spares_taken({}, gone)
    write_record(p, record)
    message = "; ".join(f"spare {node} {lost[node]}" for node in gone)
    write_status(p, {"spareNodes": list(record.spare_nodes) or None})
    p.event("Warning", "SpareLost", f"{message}: it is no longer held; another is held once a node is free")


def replace_pods(p: Pass, resolved: ResolvedJob, pods: Sequence[Mapping[str, Any]]) -> Outcome:
    """The record's `replacing` node ranks: wait until each old pod object is gone (deleting it), then create
    its pod on the spare and clear `replacing`."""
    live = p.live
    assert live is not None
    old = [pod for pod in pods if _rank(pod) in live.replacing and gang.node_of(pod) != live.nodes[_rank(pod)]]
    if old:
        return _remove_old_pods(p, old)
    present = {pod["metadata"]["name"] for pod in pods}
    found = reads.get_config_map(p.session, p.namespace, labels.config_map_name(p.name))
    if found is None or not labels.owned_by(found, p.uid) or configmap.attempt_of(found) != p.attempt:
        # The attempt's plan is gone: the move ends here, and supervision restarts the gang short of a pod.
        write_record(p, live.with_replaced())
        return Outcome("replacing-node", requeue_after=0.0)
    built = child_objects.build_children(
        p.job, resolved, found, list(live.nodes), image=live.image, pod_security=p.settings.pod_security
    )
    names = {labels.pod_name(p.name, rank) for rank in live.replacing}
    writes.create_all(p.session, [pod for pod in built.pods if pod["metadata"]["name"] in names - present])
    write_record(p, live.with_replaced())
    moved = ", ".join(f"{rank}->{live.nodes[rank]}" for rank in live.replacing)
    message = f"recreated the pods of node ranks on their spares ({moved}); the gang re-forms in place"
    write_status(p, {"message": message, "placement": _placement(p, live)})
    p.event("Normal", "SpareReplaced", message)
    return Outcome("replaced-node", requeue_after=0.0)


def vanished_on_lost_nodes(p: Pass, pods: Sequence[Mapping[str, Any]], known_lost: Mapping[str, str]) -> dict[str, str]:
    """The nodes of the live gang's node ranks whose pod is gone or being deleted, looked up afresh: deleted
    ones, and NotReady ones tainted out-of-service, with why. The pod garbage collector deletes such a node's
    pods at once, and that deletion can reach a pass before the Node watch brings the taint (seen in CI):
    without this look the vanished pod broke the gang, which restarted on a stale view of the nodes."""
    live = p.live
    assert live is not None
    # A pod being deleted counts as gone: Kubernetes' taint eviction deletes it gracefully first.
    present = {
        _rank(pod)
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


def _remove_old_pods(p: Pass, old: Sequence[Mapping[str, Any]]) -> Outcome:
    """Delete the old pods of replaced node ranks; a pod whose node is deleted or out of service goes at once
    (no kubelet will confirm it), and so does one whose node its gang reports lost with its Lease unrenewed
    (`lost_peers`: its kubelet has stopped, and its peers no longer reach its processes); one on a NotReady
    node once overdue, as draining does."""
    recheck = OLD_POD_RECHECK_SECONDS
    silent = lost_peers.observe(p, [gang.node_of(pod) for pod in old]).lost
    for pod in old:
        name, node = pod["metadata"]["name"], gang.node_of(pod)
        gone_for_good = node not in p.nodes.known or node in p.nodes.snapshot.out_of_service or node in silent
        if gone_for_good:
            writes.delete_pod(p.session, p.namespace, name, force=True)
            continue
        if not is_terminating(pod):
            writes.delete_pod(p.session, p.namespace, name)
            continue
        # On a NotReady node the kubelet cannot confirm the deletion: force it once overdue, as draining does.
        overdue = deleting_for(p, pod) - p.settings.force_delete_after_seconds
        if overdue >= 0:
            writes.delete_pod(p.session, p.namespace, name, force=True)
        else:
            recheck = max(recheck, min(-overdue + 0.5, p.settings.resync_seconds))
    return Outcome("replacing-node", requeue_after=recheck)


def _placement(p: Pass, live: records.AttemptRecord) -> list[dict[str, Any]]:
    """status.placement with the record's nodes (the ranks and stages of each node rank do not change)."""
    entries = [dict(entry) for entry in p.status.get("placement") or ()]
    for entry in entries:
        rank = int(entry.get("nodeRank", -1))
        if 0 <= rank < len(live.nodes):
            entry["node"] = live.nodes[rank]
    return entries


def _rank(pod: Mapping[str, Any]) -> int:
    return int(pod["metadata"]["labels"][labels.NODE_RANK_LABEL])


def spares_short(p: Pass, resolved: ResolvedJob) -> bool:
    """Whether the live attempt holds fewer spares than its spec asks (one was used or lost), between moves."""
    live = p.live
    return live is not None and not live.replacing and len(live.spare_nodes) < resolved.spec.failure_policy.spare_nodes


def top_up(p: Pass, resolved: ResolvedJob, cluster: Cluster, held: Sequence[Reservation]) -> Outcome:
    """An admission pass over a placed job short of spares: hold as many more as the cluster allows, chosen as at
    planning (`planning.spares_for`); a job that gets none keeps its place in the admission queue and is tried
    again when the cluster changes."""
    live, raw = p.live, _plan_json(p)
    assert live is not None
    wanted = resolved.spec.failure_policy.spare_nodes - len(live.spare_nodes)
    order = tuple(raw.get("axisOrder") or ("pipe", "data", "model")) if raw is not None else ()
    found = (
        planning.spares_for(
            resolved,
            cluster,
            live.nodes,
            live.gpus_per_node,
            order,
            wanted,
            taken=(*live.spare_nodes, *p.excluded),  # excluded nodes (a replaced straggler) are no spares
        )
        if raw is not None
        else ()
    )
    if not found:
        return Outcome("spares-short", requeue_after=SPARE_RECHECK_SECONDS, held=tuple(held))
    if p.fence is not None:
        p.fence()  # the reservations read for this pass are still the cluster's
    record = live.with_spares_added([spare.node for spare in found])
    write_record(p, record)
    write_status(p, {"spareNodes": list(record.spare_nodes)})
    p.event(
        "Normal",
        "SpareAdded",
        f"holding {', '.join(s.node for s in found)} as hot spare; "
        f"{len(record.spare_nodes)} of {resolved.spec.failure_policy.spare_nodes} held",
    )
    return Outcome("spares-added", wake_others=False)


def shrunk(p: Pass, pinned: ResolvedJob, current: ResolvedJob | None) -> bool:
    """Whether the live attempt runs smaller than the spec asks, at a smaller DP (allowDataShrink) or on fewer
    GPUs at another layout (allowRelayout), and has not yet seen its full size fit again."""
    live = p.live
    if live is None or current is None or live.grow_after is not None:
        return False
    policy = current.spec.failure_policy
    smaller_dp = policy.allow_data_shrink and pinned.data < current.data
    fewer_gpus = policy.allow_relayout and pinned.world_size < current.world_size
    return smaller_dp or fewer_gpus


def grow_when_fits(
    p: Pass, pinned: ResolvedJob, current: ResolvedJob, fits: bool, held: Sequence[Reservation]
) -> Outcome:
    """An admission pass over a shrunk job: when the full size fits again (its own GPUs counted free), the record
    notes the checkpoint step rank 0 last reported, and supervision restarts the gang into the full size after
    a newer one; otherwise the job keeps its place in the admission queue until the cluster changes."""
    live = p.live
    assert live is not None
    if not fits:
        return Outcome("shrunk", requeue_after=SPARE_RECHECK_SECONDS, held=tuple(held))
    found = reads.get_config_map(p.session, p.namespace, labels.progress_config_map_name(p.name))
    reported = progress_channel.status_of(found, current.spec.training.steps) if found is not None else {}
    step = reported.get("lastCheckpointStep")
    after = step if isinstance(step, int) else -1
    write_record(p, live.with_grow_after(after))
    since = f"step {after}" if after >= 0 else "the start of this attempt"
    p.event(
        "Normal",
        "GrowBack",
        f"{current.layout} fits again: the gang grows back from {pinned.layout} after its next checkpoint "
        f"(newer than {since})",
    )
    return Outcome("grow-back-due")
