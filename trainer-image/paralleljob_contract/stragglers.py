"""Naming the straggler: each rank's compute time over a window of steps, compared with its peers doing
identical work.

Ranks with the same pipeline stage and the same tensor position in different data-parallel replicas run the
same layers on batches of the same shape, so their compute times (forward and backward of their layers and the
optimizer, without the time blocked in collectives or pipeline sends and receives) should agree. A rank slower
than the median of those peers by more than `threshold` makes its node a straggler; the node's factor is its
slowest rank's ratio. A rank that only waits on a slow peer does not compute longer, so it is never named, and
a gang slow all over has no rank slower than its peers, so nothing is named either. Without a second replica
(data 1), or when every replica of a group sits on one node, there are no peers on other nodes: nothing can be
named.

`name_stragglers` is one pure function, shared by the bundled trainer (rank 0 runs it over a window), the
operator and `paralleljob run` (which read its answer) and users' own scripts. The answer travels on the
progress channel under the key `stragglers` as compact JSON (`encode`, `decode`): only the nodes named, at most
MAX_REPORTED of them, so the channel stays bounded however many nodes the job has.

A node is named only after it has been slower than its peers in `windows` consecutive windows (`persisting`,
like a Prometheus alert's `for`): one window of a node busy with something else (a checkpoint write, a data
loader's refill, a neighbour on a shared CPU) is not a slow node, and `action: Replace` must not take a healthy node
out of the job for it.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from paralleljob_contract import progress
from paralleljob_contract.errors import ContractError
from paralleljob_contract.layout import Coord, Layout

# spec.failurePolicy.stragglers' defaults: a node is named when its ranks are slower than their peers' median
# by more than THRESHOLD over a window of WINDOW_STEPS steps.
DEFAULT_THRESHOLD = 1.3
DEFAULT_WINDOW_STEPS = 20
# ... in this many consecutive windows.
DEFAULT_WINDOWS = 2
# The most nodes one report names (the slowest first): the progress channel's value stays under ~2 KiB.
MAX_REPORTED = 16
# How the trainer learns the policy (the operator and `paralleljob run` set them from the spec).
THRESHOLD_ENV = "PARALLELJOB_STRAGGLER_THRESHOLD"
WINDOW_ENV = "PARALLELJOB_STRAGGLER_WINDOW"
WINDOWS_ENV = "PARALLELJOB_STRAGGLER_WINDOWS"


class Policy(NamedTuple):
    """spec.failurePolicy.stragglers as the trainer takes it."""

    threshold: float = DEFAULT_THRESHOLD
    window_steps: int = DEFAULT_WINDOW_STEPS
    windows: int = DEFAULT_WINDOWS


@dataclasses.dataclass(frozen=True)
class Straggler:
    """One node named over one window: how much slower its slowest rank computed than that rank's peers."""

    node_rank: int
    factor: float
    stage: int
    first_step: int
    last_step: int
    node: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The compact form of the progress channel, metrics.jsonl and summary.json."""
        entry: dict[str, Any] = {"nodeRank": self.node_rank, "factor": round(self.factor, 2), "stage": self.stage}
        entry["steps"] = [self.first_step, self.last_step]
        if self.node:
            entry["node"] = self.node
        return entry


def name_stragglers(
    compute_seconds: Sequence[float],
    layout: Layout,
    ranks_per_node: int,
    steps: tuple[int, int],
    threshold: float = DEFAULT_THRESHOLD,
    node_names: Sequence[str] = (),
) -> list[Straggler]:
    """The nodes whose ranks computed slower than their peers' median by more than `threshold`, slowest first.

    `compute_seconds[rank]` is that rank's compute time (the trainer: its lower-quartile step) over the window `steps` (first, last
    step). A rank's peers are the ranks of its group (same stage and tensor position, other replicas) on other nodes."""
    named = [
        Straggler(node, ratio, stage, steps[0], steps[1], _name(node_names, node))
        for node, (ratio, stage) in node_factors(compute_seconds, layout, ranks_per_node).items()
        if ratio > threshold
    ]
    return sorted(named, key=lambda s: (-s.factor, s.node_rank))[:MAX_REPORTED]


# A node rank's unbroken run of windows that found it slower than its peers: (windows, first step of the first).
Streaks = Mapping[int, tuple[int, int]]


def persisting(
    named: Sequence[Straggler], streaks: Streaks, windows: int
) -> tuple[list[Straggler], dict[int, tuple[int, int]]]:
    """Of this window's `named` nodes, those slower in `windows` consecutive windows (this one the last), each
    reported over its whole run of windows; and the streaks to carry into the next window (a node not named in
    this window starts again from nothing)."""
    carried = {}
    for slow in named:
        count, first = streaks.get(slow.node_rank, (0, slow.first_step))
        carried[slow.node_rank] = (count + 1, first)
    reported = [
        dataclasses.replace(slow, first_step=carried[slow.node_rank][1])
        for slow in named
        if carried[slow.node_rank][0] >= windows
    ]
    return reported, carried


def node_factors(compute_seconds: Sequence[float], layout: Layout, ranks_per_node: int) -> dict[int, tuple[float, int]]:
    """Each node's factor (its slowest rank over that rank's peers' median) and that rank's stage; nodes without
    peers on other nodes are left out. One pass per group with one median per node in it: about 0.1 s at 32,768
    ranks (4,096 nodes of 8), so rank 0 can afford it every window."""
    if len(compute_seconds) != layout.world_size:
        raise ContractError(f"compute_seconds has {len(compute_seconds)} ranks; the layout has {layout.world_size}")
    worst: dict[int, tuple[float, int]] = {}
    for pipe in range(layout.pipeline):
        for model in range(layout.tensor):
            group = [layout.rank(Coord(pipe, data, model)) for data in range(layout.data)]
            ordered = sorted(compute_seconds[rank] for rank in group)
            by_node: dict[int, list[int]] = {}
            for rank in group:
                by_node.setdefault(rank // ranks_per_node, []).append(rank)
            for node, own in by_node.items():
                peers = list(ordered)
                for rank in own:  # the node's own ranks are no peers of its ranks
                    peers.remove(compute_seconds[rank])
                slowest = max(compute_seconds[rank] for rank in own)
                ratio = _ratio(slowest, peers)
                if ratio is not None and ratio > worst.get(node, (0.0, 0))[0]:
                    worst[node] = (ratio, pipe)
    return worst


def _ratio(own: float, peers: Sequence[float]) -> float | None:
    """own over the peers' median; None without peers or without a positive median to compare with."""
    if not peers:
        return None
    median = statistics.median(peers)
    return own / median if median > 0 else None


def _name(node_names: Sequence[str], node_rank: int) -> str:
    return node_names[node_rank] if node_rank < len(node_names) else ""


def encode(named: Sequence[Straggler]) -> str:
    """The progress channel's `stragglers` value: a compact JSON list ("[]" when none is named)."""
    return json.dumps([s.to_dict() for s in named[:MAX_REPORTED]], separators=(",", ":"))


def decode(text: str) -> list[dict[str, Any]]:
    """A `stragglers` value read back, each entry checked; ContractError names what is wrong."""
    return progress.decode_list("stragglers", text, _checked, MAX_REPORTED)


def _checked(entry: object, index: int) -> dict[str, Any]:
    where = f"stragglers[{index}]"
    if not isinstance(entry, Mapping):
        raise ContractError(f"{where}: expected an object with nodeRank, factor, stage and steps")
    steps = entry.get("steps")
    ok = (
        _is_int(entry.get("nodeRank"))
        and isinstance(entry.get("factor"), (int, float))
        and _is_int(entry.get("stage"))
        and isinstance(steps, list)
        and len(steps) == 2
        and all(_is_int(s) for s in steps)
    )
    if not ok or not isinstance(entry.get("node", ""), str):
        raise ContractError(f"{where}: expected nodeRank, stage (integers), factor (a number), steps ([first, last])")
    return dict(entry)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def policy_from_environ(environ: Mapping[str, str]) -> Policy:
    """The policy from the pod's environment, the defaults where unset; ContractError on bad values. A window of
    0 steps turns the timing and the comparison off."""
    threshold = _number(environ, THRESHOLD_ENV, DEFAULT_THRESHOLD)
    window = _number(environ, WINDOW_ENV, DEFAULT_WINDOW_STEPS)
    windows = _number(environ, WINDOWS_ENV, DEFAULT_WINDOWS)
    if threshold <= 1.0:
        raise ContractError(f"{THRESHOLD_ENV}: must be above 1.0 (a factor over the peers' median), got {threshold}")
    if window < 0 or window != int(window):
        raise ContractError(f"{WINDOW_ENV}: must be a whole number of steps (0: off), got {window}")
    if windows < 1 or windows != int(windows):
        raise ContractError(f"{WINDOWS_ENV}: must be a whole number of windows, 1 or more, got {windows}")
    return Policy(threshold, int(window), int(windows))


def _number(environ: Mapping[str, str], key: str, default: float) -> float:
    text = environ.get(key, "").strip()
    if not text:
        return default
    try:
        return float(text)
    except ValueError:
        raise ContractError(f"{key}: expected a number, got {text!r}") from None
