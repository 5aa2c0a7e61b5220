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

Pure decisions (`decide`, `top_up`, `grow_when_fits`) on an `Observed`, written by `k8s.apply`: the record
before the status, so that a pass killed between the two leaves a record the next pass carries on from
(`handlers.reported` writes the status it missed). What they read beyond the pass's first look is observed by
`handlers.observe` before they decide: the gang's lost nodes with the nodes whose pod vanished, looked up
afresh (`observe.for_spares`), and rank 0's last checkpoint step, read only once the full size fits
(`observe.last_checkpoint`). The admission lock's fence before holding more spares is the pass's
(`handlers.reconcile`), as is turning a decision that holds nothing into the job's place in the admission queue.
Their Events are asked for with each move whether or not its status patch changes anything (a move is news even
when a killed pass had already reported it).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Mapping, Sequence
from typing import Any

from paralleljob import planning
from paralleljob.api import ResolvedJob
from paralleljob.handlers import gang, stragglers
from paralleljob.handlers.observed import Observed, deleting_for, is_terminating, pod_name, status_patch
from paralleljob.handlers.settings import Settings
from paralleljob.manifests import children as child_objects
from paralleljob.manifests import configmap, labels, records
from paralleljob.manifests.decisions import Decision, Event
from paralleljob.planning import spares
from paralleljob.planning.inventory import Cluster
from paralleljob.planning.plan import Plan, SpareNode

# How soon to look again while the lost rank's old pod object is still there.
OLD_POD_RECHECK_SECONDS = 0.5
# How often a job short of spares is offered to the admission queue again without a change in the cluster.
SPARE_RECHECK_SECONDS = 60.0
# The decisions that end the pass: a move started or under way. Any other (a lost spare dropped, stragglers
# excluded without a move) is written and supervision judges the gang in the same pass, from the record as read.
MOVING = frozenset({"replacing-node", "replaced-node"})


def applies(live: records.AttemptRecord | None) -> bool:
    """Whether the spare step looks at this attempt: a live one holding spares or moving a node rank."""
    return live is not None and bool(live.spare_nodes or live.replacing)


def decide(seen: Observed, settings: Settings, now: datetime.datetime) -> Decision | None:
    """The spare step of a placed gang (`seen.pinned` its spec): a move under way goes on (`replace_pods`);
    else the slow nodes to replace are excluded (`exclude_slow_nodes`) and every lost node rank moves to a
    spare, or a lost spare is dropped (`take_spares`), as one decision. None when nothing here applies."""
    live = seen.live
    if live is None or not applies(live):
        return None
    if live.replacing:
        return replace_pods(seen, settings, now)
    excluded, slow = exclude_slow_nodes(seen)
    after = seen if excluded is None else dataclasses.replace(seen.with_status(excluded.status), record=excluded.record)
    taken = take_spares(after, {**seen.lost_now, **slow})
    if excluded is None or taken is None:
        return excluded or taken
    return excluded.then(taken)


def take_spares(seen: Observed, lost: Mapping[str, str]) -> Decision | None:
    """Move every lost node rank to a spare and start replacing their pods; drop lost spares. None when this
    does not apply (no lost node, or a lost node rank without a spare): supervision goes on as before."""
    live = seen.live
    assert live is not None
    lost_spares = [node for node in live.spare_nodes if node in lost]
    lost_ranks = [rank for rank, node in enumerate(live.nodes) if node in lost and rank not in live.replacing]
    if not lost_ranks:
        return _drop_spares(seen, live, lost_spares, lost) if lost_spares else None
    plan = current_plan(seen, live)
    if plan is None:
        return None
    usable = [spare for spare in plan.spares if spare.node not in lost and spare.node not in seen.not_ready]
    taken = choose(plan, lost_ranks, usable)
    if taken is None:
        return None
    record = live.with_spares_taken({rank: spare.node for rank, spare in taken.items()}, lost_spares)
    moves = ", ".join(
        f"node rank {rank} from {live.nodes[rank]} ({lost[live.nodes[rank]]}) to spare {spare.node}"
        for rank, spare in taken.items()
    )
    message = f"moving {moves}; the pods on healthy nodes stay"
    return Decision(
        "replacing-node",
        record=record,
        status=status_patch(seen, {"message": message, "spareNodes": list(record.spare_nodes) or None}),
        events=(Event("Warning", "SpareTaken", message),),
        requeue_after=0.0,
    )


def exclude_slow_nodes(seen: Observed) -> tuple[Decision | None, dict[str, str]]:
    """Under stragglers.action Replace, while the gang holds a spare: the named nodes of the gang, added to the
    job's excluded nodes (record and status) before a spare takes their node rank like a lost node's, with
    why; the move that follows builds on this decision's record, so that its own record keeps them."""
    live = seen.live
    assert live is not None and seen.pinned is not None
    named = (seen.status.get("progress") or {}).get("stragglers")
    action = seen.pinned.spec.failure_policy.stragglers.action
    slow = stragglers.to_replace(named, live.nodes, live.excluded_nodes, action)
    if not slow or not live.spare_nodes:
        return None, {}
    excluded = [*live.excluded_nodes, *slow]
    suspect = [*live.suspect_nodes, *(node for node in slow if node not in live.suspect_nodes)]
    record = dataclasses.replace(live, excluded_nodes=tuple(excluded), suspect_nodes=tuple(suspect))
    return Decision("excluding-slow-nodes", record=record, status=status_patch(seen, {"excludedNodes": excluded})), slow


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


def current_plan(seen: Observed, live: records.AttemptRecord) -> Plan | None:
    """The attempt's plan (its ConfigMap's plan.json, which leaves the nodes out) with the record's nodes and
    spares, their domains from the Node watch; None without this attempt's plan."""
    raw = _plan_json(seen)
    if raw is None:
        return None
    keys = [*(raw.get("levels") or ()), *([raw["nvlinkDomainLabel"]] if raw.get("nvlinkDomainLabel") else [])]
    nodes = [
        {"nodeRank": rank, "node": node, "gpus": live.gpus_per_node, "ranks": [], "coords": [],
         "domains": _domains(seen, node, keys)}
        for rank, node in enumerate(live.nodes)
    ]  # fmt: skip
    held = [
        {"node": node, "gpus": live.gpus_per_node, "domains": _domains(seen, node, keys)} for node in live.spare_nodes
    ]
    return Plan.from_dict({**raw, "nodes": nodes, "spares": held})


def _plan_json(seen: Observed) -> dict[str, Any] | None:
    """This attempt's plan.json, from its ConfigMap as the pass read it; None without one."""
    found = _own_config_map(seen)
    if found is None:
        return None
    raw = json.loads((found.get("data") or {}).get(configmap.PLAN_FILE) or "{}")
    return raw if isinstance(raw, dict) and "layout" in raw and "estimates" in raw else None


def _own_config_map(seen: Observed) -> Mapping[str, Any] | None:
    """The job's `-config` ConfigMap when it holds this attempt (ours, of the record's attempt); else None."""
    found = seen.config_map
    if found is None or not labels.owned_by(found, seen.uid) or configmap.attempt_of(found) != seen.attempt:
        return None
    return found


def _domains(seen: Observed, node: str, keys: Sequence[str]) -> dict[str, str]:
    """The node's value of each network level and NVLink label, from the Node watch ({} for a deleted node: the
    price of a move does not depend on the node that leaves)."""
    found = ((seen.watched_nodes.get(node) or {}).get("metadata") or {}).get("labels") or {}
    return {key: str(found[key]) for key in keys if found.get(key)}


def _drop_spares(seen: Observed, live: records.AttemptRecord, gone: Sequence[str], lost: Mapping[str, str]) -> Decision:
    record = live.with_spares_taken({}, gone)
    message = "; ".join(f"spare {node} {lost[node]}" for node in gone)
    return Decision(
        "spare-lost",
        record=record,
        status=status_patch(seen, {"spareNodes": list(record.spare_nodes) or None}),
        events=(
            Event("Warning", "SpareLost", f"{message}: it is no longer held; another is held once a node is free"),
        ),
    )


def replace_pods(seen: Observed, settings: Settings, now: datetime.datetime) -> Decision:
    """The record's `replacing` node ranks: wait until each old pod object is gone (deleting it), then create
    its pod on the spare and clear `replacing`; the pods are created before the record says so."""
    live = seen.live
    assert live is not None
    pods = seen.pods
    old = [pod for pod in pods if _rank(pod) in live.replacing and gang.node_of(pod) != live.nodes[_rank(pod)]]
    if old:
        return _remove_old_pods(seen, old, settings, now)
    found = _own_config_map(seen)
    if found is None:
        # The attempt's plan is gone: the move ends here, and supervision restarts the gang short of a pod.
        return Decision("replacing-node", record=live.with_replaced(), requeue_after=0.0)
    assert seen.pinned is not None
    built = child_objects.build_children(
        seen.job, seen.pinned, found, list(live.nodes), image=live.image, pod_security=settings.pod_security
    )
    present = {pod_name(pod) for pod in pods}
    names = {labels.pod_name(seen.name, rank) for rank in live.replacing}
    moved = ", ".join(f"{rank}->{live.nodes[rank]}" for rank in live.replacing)
    message = f"recreated the pods of node ranks on their spares ({moved}); the gang re-forms in place"
    return Decision(
        "replaced-node",
        creates=tuple(pod for pod in built.pods if pod["metadata"]["name"] in names - present),
        record=live.with_replaced(),
        status=status_patch(seen, {"message": message, "placement": _placement(seen, live)}),
        events=(Event("Normal", "SpareReplaced", message),),
        requeue_after=0.0,
    )


def _remove_old_pods(
    seen: Observed, old: Sequence[Mapping[str, Any]], settings: Settings, now: datetime.datetime
) -> Decision:
    """Delete the old pods of replaced node ranks; a pod whose node is deleted or out of service goes at once
    (no kubelet will confirm it), and so does one whose node its gang reports lost with its Lease unrenewed
    (`seen.peers_lost`: its kubelet has stopped, and its peers no longer reach its processes); one on a NotReady
    node once overdue, as draining does."""
    recheck = OLD_POD_RECHECK_SECONDS
    deletes: list[str] = []
    forced: list[str] = []
    for pod in old:
        name, node = pod_name(pod), gang.node_of(pod)
        gone_for_good = node not in seen.known or node in seen.out_of_service or node in seen.peers_lost
        if gone_for_good:
            forced.append(name)
            continue
        if not is_terminating(pod):
            deletes.append(name)
            continue
        # On a NotReady node the kubelet cannot confirm the deletion: force it once overdue, as draining does.
        overdue = deleting_for(pod, now) - settings.force_delete_after_seconds
        if overdue >= 0:
            forced.append(name)
        else:
            recheck = max(recheck, min(-overdue + 0.5, settings.resync_seconds))
    return Decision("replacing-node", deletes=tuple(deletes), force_deletes=tuple(forced), requeue_after=recheck)


def _placement(seen: Observed, live: records.AttemptRecord) -> list[dict[str, Any]]:
    """status.placement with the record's nodes (the ranks and stages of each node rank do not change)."""
    entries = [dict(entry) for entry in seen.status.get("placement") or ()]
    for entry in entries:
        rank = int(entry.get("nodeRank", -1))
        if 0 <= rank < len(live.nodes):
            entry["node"] = live.nodes[rank]
    return entries


def _rank(pod: Mapping[str, Any]) -> int:
    return int(pod["metadata"]["labels"][labels.NODE_RANK_LABEL])


def spares_short(seen: Observed, resolved: ResolvedJob) -> bool:
    """Whether the live attempt holds fewer spares than its spec asks (one was used or lost), between moves."""
    live = seen.live
    return live is not None and not live.replacing and len(live.spare_nodes) < resolved.spec.failure_policy.spare_nodes


def top_up(seen: Observed, resolved: ResolvedJob, cluster: Cluster) -> Decision:
    """An admission pass over a placed job short of spares: hold as many more as the cluster allows, chosen as at
    planning (`planning.spares_for`); a job that gets none (a decision that writes nothing) keeps its place in the
    admission queue and is tried again when the cluster changes."""
    live, raw = seen.live, _plan_json(seen)
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
            taken=(*live.spare_nodes, *live.excluded_nodes),  # excluded nodes (a replaced straggler) are no spares
        )
        if raw is not None
        else ()
    )
    if not found:
        return Decision("spares-short", requeue_after=SPARE_RECHECK_SECONDS)
    record = live.with_spares_added([spare.node for spare in found])
    message = (
        f"holding {', '.join(s.node for s in found)} as hot spare; "
        f"{len(record.spare_nodes)} of {resolved.spec.failure_policy.spare_nodes} held"
    )
    return Decision(
        "spares-added",
        record=record,
        status=status_patch(seen, {"spareNodes": list(record.spare_nodes)}),
        events=(Event("Normal", "SpareAdded", message),),
    )


def shrunk(seen: Observed, pinned: ResolvedJob, current: ResolvedJob | None) -> bool:
    """Whether the live attempt runs smaller than the spec asks, at a smaller DP (allowDataShrink) or on fewer
    GPUs at another layout (allowRelayout), and has not yet seen its full size fit again."""
    live = seen.live
    if live is None or current is None or live.grow_after is not None:
        return False
    policy = current.spec.failure_policy
    smaller_dp = policy.allow_data_shrink and pinned.data < current.data
    fewer_gpus = policy.allow_relayout and pinned.world_size < current.world_size
    return smaller_dp or fewer_gpus


def grow_when_fits(seen: Observed, pinned: ResolvedJob, current: ResolvedJob, fits: bool) -> Decision:
    """An admission pass over a shrunk job: when the full size fits again (its own GPUs counted free), the record
    notes the checkpoint step rank 0 last reported (`seen.checkpoint_step`), and supervision restarts the gang
    into the full size after a newer one; otherwise (a decision that writes nothing) the job keeps its place in
    the admission queue until the cluster changes."""
    live = seen.live
    assert live is not None
    if not fits:
        return Decision("shrunk", requeue_after=SPARE_RECHECK_SECONDS)
    after = seen.checkpoint_step if seen.checkpoint_step is not None else -1
    since = f"step {after}" if after >= 0 else "the start of this attempt"
    message = (
        f"{current.layout} fits again: the gang grows back from {pinned.layout} after its next checkpoint "
        f"(newer than {since})"
    )
    return Decision("grow-back-due", record=live.with_grow_after(after), events=(Event("Normal", "GrowBack", message),))
