"""A lost peer, as the gang sees it: which nodes stopped answering node rank 0's coordinator, and how that is
reported to the operator.

Every supervisor talks to the coordinator (`paralleljob_contract.coordinator`) at least every MAX_WAIT_SECONDS
(its long polls are held that long at most), and after a rank fails every node reports ready for the next
generation within seconds. So a node is not answering when it has been silent for SILENT_SECONDS, or when the
generation moved on LATE_SECONDS ago and it alone has not reported ready for it (its ranks died with it, and the
survivors' collectives failed on it). `not_answering` decides this, pure. Node rank 0's supervisor reports the
nodes it names through the job's progress channel under the key `lostPeers` (`encode`, `decode`): a compact
JSON list of node rank, node name and seconds silent, "[]" once every node answers again. The operator acts on
it only together with the Node's own Lease (docs/operator.md, "A lost node, noticed by its gang"), so a gang's
word alone never replaces a node. Standard library only, like the rest of the contract.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

from paralleljob_contract import progress
from paralleljob_contract.errors import ContractError

# Longer than the longest long poll (coordinator.MAX_WAIT_SECONDS, 10 s) with a margin: a node that has sent
# nothing for this long is not waiting on the coordinator.
SILENT_SECONDS = 15.0
# How long after the generation moved on a node may take to stop its ranks and report ready for the next one.
LATE_SECONDS = 5.0
# The most nodes a report names: the channel stays small however large the gang.
MAX_REPORTED = 16


def not_answering(
    nodes: int,
    last_seen: Mapping[int, float],
    ready: Collection[int],
    finished: Collection[int],
    generation: int,
    generation_since: float,
    now: float,
) -> dict[int, float]:
    """The node ranks not answering the coordinator at `now`, each with the seconds since it was last heard.

    `last_seen`: when each node rank last sent a request (a rank never heard from is not named: it may still be
    starting); `ready`: the node ranks ready for `generation`, which began at `generation_since`; `finished`:
    node ranks whose ranks all finished (they stop talking by design). Node rank 0 is the coordinator itself."""
    late = generation > 0 and now - generation_since >= LATE_SECONDS and len(ready) > 0
    found: dict[int, float] = {}
    for node in range(1, nodes):
        if node in finished or node not in last_seen:
            continue
        quiet = now - last_seen[node]
        if quiet >= SILENT_SECONDS or (late and node not in ready and quiet >= LATE_SECONDS):
            found[node] = quiet
    return found


def encode(quiet: Mapping[int, float], names: Mapping[int, str]) -> str:
    """The progress channel's `lostPeers` value: [{"nodeRank", "node", "silentSeconds"}], "[]" when none."""
    entries = [
        {"nodeRank": rank, "node": names.get(rank, ""), "silentSeconds": round(seconds, 1)}
        for rank, seconds in sorted(quiet.items())[:MAX_REPORTED]
    ]
    return json.dumps(entries, separators=(",", ":"))


def decode(text: str) -> list[dict[str, Any]]:
    """A `lostPeers` value read back, each entry checked; ContractError names what is wrong."""
    return progress.decode_list("lostPeers", text, _checked, MAX_REPORTED)


def _checked(entry: object, index: int) -> dict[str, Any]:
    ok = (
        isinstance(entry, Mapping)
        and isinstance(entry.get("nodeRank"), int)
        and not isinstance(entry.get("nodeRank"), bool)
        and isinstance(entry.get("node"), str)
        and isinstance(entry.get("silentSeconds"), (int, float))
        and not isinstance(entry.get("silentSeconds"), bool)
    )
    if not ok:
        raise ContractError(f"lostPeers[{index}]: expected nodeRank (an integer), node (a name), silentSeconds")
    assert isinstance(entry, Mapping)
    return dict(entry)
