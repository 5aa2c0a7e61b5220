"""The operator's verdict on named stragglers: the Straggler condition and when a SlowNode Event is due.

Pure. The nodes come from status.progress.stragglers (rank 0's last window of compute times, validated by
`manifests.progress.stragglers_of`); the comparison that named them is the contract's
(`paralleljob_contract.stragglers.name_stragglers`), so `paralleljob run` and the operator agree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

CONDITION = "Straggler"
NAMED = "SlowNode"
NONE_NAMED = "NoSlowNode"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The Straggler condition's status, reason and message."""

    status: str
    reason: str
    message: str


def verdict(named: Sequence[Mapping[str, Any]] | None, threshold: float) -> Verdict | None:
    """The condition for the last window's named nodes; None before any window has been reported."""
    if named is None:
        return None
    if not named:
        return Verdict("False", NONE_NAMED, f"no node computed slower than its peers by more than {threshold}x")
    return Verdict("True", NAMED, "; ".join(describe(entry) for entry in named))


def describe(entry: Mapping[str, Any]) -> str:
    """One named node, for the condition and its Event: node, factor, stage and the step window."""
    node = entry.get("node") or f"node rank {entry.get('nodeRank')}"
    first, last = (entry.get("steps") or [0, 0])[:2]
    return (
        f"{node} (node rank {entry.get('nodeRank')}, stage {entry.get('stage')}) computed "
        f"{entry.get('factor')}x its peers' median over steps {first}-{last}"
    )


def event_due(before: Mapping[str, Any] | None, now: Verdict | None) -> bool:
    """A SlowNode Event when a window names nodes and says something new (another node, factor or window)."""
    if now is None or now.status != "True":
        return False
    return before is None or before.get("status") != "True" or before.get("message") != now.message


def to_label(
    named: Sequence[Mapping[str, Any]] | None, node_labels: Mapping[str, Mapping[str, Any]], key: str
) -> list[str]:
    """The named nodes to label `key=true` for the cluster's administrators (the operator's --slow-node-label):
    those that exist (`node_labels`: each Node's labels, from the Node watch) and do not carry it yet as the watch
    shows them: written once per node unless a pass begins before the watch shows the label (the same merge patch
    again, harmless); none when `key` is empty (the chart's slowNodeLabel off)."""
    if not key or not named:
        return []
    found = [entry.get("node") for entry in named]
    return sorted(
        {node for node in found if isinstance(node, str) and node in node_labels and key not in node_labels[node]}
    )


def to_replace(
    named: Sequence[Mapping[str, Any]] | None, gang_nodes: Sequence[str], excluded: Sequence[str], action: str
) -> dict[str, str]:
    """Under `action: Replace`, the named nodes of the running gang not yet excluded, each with why (the
    wording of a lost node's reason: "node X <why>"); empty under Report or when none is named."""
    if action != "Replace" or not named:
        return {}
    found = {}
    for entry in named:
        node = entry.get("node")
        if isinstance(node, str) and node in gang_nodes and node not in excluded:
            found[node] = f"is slower than its peers ({entry.get('factor')}x, stage {entry.get('stage')})"
    return found
