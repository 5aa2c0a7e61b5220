"""What the status says of the live attempt, from its record and ConfigMap alone: its layout and sizes, the node
of each node rank (`placement`), its spares and NCCL environment.

The decisions that change these write the record first and the status after it (`k8s.apply`: the record is what
the next pass acts on): the admission (its ConfigMap), a spare's move, dropping a lost spare, holding more. An
operator killed between the two writes leaves a record its status does not report, and the next pass carries
the decision on from the record without writing that status again: a job Succeeded with its placement naming the
node it had lost, a shrunk one reported at its full layout to the end (issue 39, found by
tests/operator/test_kill_loop_nodes.py). So every supervision pass over a live attempt writes these fields
again where they differ (`decide`); one that finds them as the record says writes nothing. Pure, as the steps are:
`k8s.apply` writes the Decision.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from paralleljob.api import ResolvedJob
from paralleljob.handlers.observed import Observed, status_patch
from paralleljob.manifests import configmap, labels, records
from paralleljob.manifests.decisions import Decision
from paralleljob_contract import jobfile
from paralleljob_contract.layout import node_ranks


def decide(seen: Observed, pinned: ResolvedJob) -> Decision | None:
    """The live attempt's fields where the status differs from its record; None when they agree, and while a
    spare's move is under way (it reports the new node once the rank's pod is made again there)."""
    live = seen.live
    if live is None or live.replacing or seen.config_map is None:
        return None
    found = fields(seen.name, live, seen.config_map, pinned)
    written = status_patch(seen, found) if found is not None else None
    return Decision("reported", status=written) if written is not None else None


def fields(
    job: str, record: records.AttemptRecord, config_map: Mapping[str, Any], pinned: ResolvedJob
) -> dict[str, Any] | None:
    """The status fields of the attempt `record` holds, as its admission wrote them and its moves changed them;
    None when the ConfigMap is not this attempt's (the pass that finds it so plans again)."""
    if (config_map["metadata"].get("labels") or {}).get(labels.ATTEMPT_LABEL) != str(record.attempt):
        return None
    plan = configmap.plan_of(config_map)
    if plan.nodes != len(record.nodes):
        return None
    return {
        "layout": pinned.layout,
        "worldSize": pinned.world_size,
        "nodes": len(record.nodes),
        "gpusPerNode": record.gpus_per_node,
        "axisOrder": ",".join(plan.axis_order),
        "placement": placement(job, plan, record.nodes),
        "spareNodes": list(record.spare_nodes) or None,
        "ncclEnv": dict(configmap.network_of(config_map).get("ncclEnv") or {}),
    }


def placement(job: str, plan: jobfile.Plan, nodes: Sequence[str]) -> list[dict[str, Any]]:
    """status.placement: per node rank, its node, ranks, pipeline stages and pod (as `steps.admission` writes
    it from the planner's plan)."""
    entries = []
    for node_rank, node in enumerate(nodes):
        ranks = node_ranks(node_rank, plan.ranks_per_node)
        first, last = ranks[0], ranks[-1]
        entries.append(
            {
                "nodeRank": node_rank,
                "node": node,
                "ranks": str(first) if first == last else f"{first}-{last}",
                "stages": sorted({plan.layout.coord(rank).pipe for rank in ranks}),
                "pod": labels.pod_name(job, node_rank),
            }
        )
    return entries
