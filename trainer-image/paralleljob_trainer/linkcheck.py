"""The network check shaped like the layout: every link the training step uses, timed once at the start.

`run_check()` is called by `training.run` on every rank after the process groups exist and before step 1
(spec.network.preflight, `PARALLELJOB_NETWORK_PREFLIGHT`: off | report | fail). It times, one class at a time:

- the all-reduce of every tensor-parallel group (all groups at once, as in a step);
- send and receive between every pair of neighbouring pipeline stages (two phases, so that each rank is in
  one pair at a time: stages 0-1, 2-3, ... then 1-2, 3-4, ...);
- the all-reduce of every data-parallel group.

Each rank times its own part (best of a few repetitions, so one scheduling hiccup does not name a link); one
all-gather of a few floats per rank gives every rank every figure, and every rank judges them the same way
(`judge()`, pure), so under `fail` all ranks stop together with the same reason. A link is slow when its
bandwidth is below its class's median divided by `SLOW_FACTOR`; the planner's bandwidth for the class
(`PARALLELJOB_PLANNED_GBPS`) is reported beside the measured one. A node is named when every link between
nodes it takes part in is slow (the slow node slows all its links; its peers have fast links elsewhere).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from paralleljob_contract import environment
from paralleljob_contract.layout import Coord, Layout
from paralleljob_contract.network import SLOW_LINK, slow_link_message
from paralleljob_trainer.preflight import NetworkNotReady

KINDS = ("tensor", "pipeline", "data")
# A link this many times slower than the median of its class is slow: a link trained down to a quarter of its
# speed (issue 36) is caught; on a shared CPU machine, loopback noise between equal links stays under 2x.
SLOW_FACTOR = 2.0
REPEATS = 3
DEFAULT_BYTES_CPU = 4 << 20
DEFAULT_BYTES_GPU = 64 << 20


@dataclasses.dataclass(frozen=True)
class Link:
    """One group of ranks the step communicates over: its kind, global ranks and the nodes they sit on."""

    kind: str
    ranks: tuple[int, ...]
    nodes: tuple[int, ...]

    @property
    def between_nodes(self) -> bool:
        return len(set(self.nodes)) > 1


@dataclasses.dataclass(frozen=True)
class Measured:
    """A link's time for `nbytes` and its bandwidth in GB/s (bus bandwidth for an all-reduce)."""

    link: Link
    seconds: float
    gbps: float


@dataclasses.dataclass(frozen=True)
class Result:
    """The check's verdict: measured links, the slow ones, the nodes named, and what the check cost."""

    measured: tuple[Measured, ...]
    slow: tuple[Measured, ...]
    named: tuple[int, ...]
    planned_gbps: Mapping[str, float]
    cost_seconds: float = 0.0

    def class_summary(self) -> dict[str, dict[str, float]]:
        """Per kind: how many links, the median and slowest GB/s, and the planner's GB/s where known."""
        summary: dict[str, dict[str, float]] = {}
        for kind in KINDS:
            figures = [m.gbps for m in self.measured if m.link.kind == kind]
            if figures:
                summary[kind] = {"links": len(figures), "medianGBps": statistics.median(figures)}
                summary[kind]["slowestGBps"] = min(figures)
                if kind in self.planned_gbps:
                    summary[kind]["plannedGBps"] = self.planned_gbps[kind]
        return summary


def links_of(layout: Layout, ranks_per_node: int) -> list[Link]:
    """Every tensor group, neighbouring pipeline pair and data group of the layout, in a fixed order."""
    p, t, d = layout.pipeline, layout.tensor, layout.data
    rank = layout.rank
    groups: list[tuple[str, list[int]]] = []
    if t > 1:
        groups += [("tensor", [rank(Coord(s, r, m)) for m in range(t)]) for s in range(p) for r in range(d)]
    groups += [
        ("pipeline", [rank(Coord(s, r, m)), rank(Coord(s + 1, r, m))])
        for s in range(p - 1)
        for r in range(d)
        for m in range(t)
    ]
    if d > 1:
        groups += [("data", [rank(Coord(s, r, m)) for r in range(d)]) for s in range(p) for m in range(t)]
    return [Link(kind, tuple(ranks), tuple(r // ranks_per_node for r in ranks)) for kind, ranks in groups]


def judge(timed: Sequence[tuple[Link, float]], nbytes: int, planned_gbps: Mapping[str, float] | None = None) -> Result:
    """Bandwidths from seconds, the slow links (below their class's median / SLOW_FACTOR) and the nodes named."""
    measured = tuple(Measured(link, seconds, _gbps(link, nbytes, seconds)) for link, seconds in timed)
    slow: list[Measured] = []
    for kind in KINDS:
        figures = [m for m in measured if m.link.kind == kind]
        if len(figures) > 1:
            median = statistics.median(m.gbps for m in figures)
            slow += [m for m in figures if m.gbps * SLOW_FACTOR < median]
    return Result(measured, tuple(slow), named_nodes(measured, slow), dict(planned_gbps or {}))


def _gbps(link: Link, nbytes: int, seconds: float) -> float:
    n = len(link.ranks)
    moved = nbytes if link.kind == "pipeline" else 2 * (n - 1) / n * nbytes
    return moved / max(seconds, 1e-9) / 1e9


def named_nodes(measured: Sequence[Measured], slow: Sequence[Measured]) -> tuple[int, ...]:
    """Nodes all of whose links between nodes are slow, and nodes of slow links inside one node. When no node
    is named so (slow links with no common node), the nodes of the slowest link: a pair is named, not no one."""
    if not slow:
        return ()
    slow_links = {m.link for m in slow}
    named = {m.link.nodes[0] for m in slow if not m.link.between_nodes}
    crossing: dict[int, list[bool]] = {}
    for m in measured:
        if m.link.between_nodes:
            for node in set(m.link.nodes):
                crossing.setdefault(node, []).append(m.link in slow_links)
    named |= {node for node, flags in crossing.items() if all(flags)}
    if not named:
        named = set(min(slow, key=lambda m: m.gbps).link.nodes)
    return tuple(sorted(named))


def _timed(operation: Any) -> float:
    """Best of REPEATS runs of `operation` after one warm-up (which also connects lazily made channels)."""
    operation()
    best = float("inf")
    for _ in range(REPEATS):
        started = time.perf_counter()
        operation()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - started)
    return best


def _all_reduce(buffer: torch.Tensor, group: Any) -> Any:
    return lambda: dist.all_reduce(buffer, group=group)


def _exchange(buffer: torch.Tensor, inbox: torch.Tensor, peer: int) -> Any:
    def run() -> None:
        requests = [dist.isend(buffer, peer), dist.irecv(inbox, peer)]
        for request in requests:
            if request is not None:  # None only for a rank outside the group, never here
                request.wait()

    return run


def measure_rank(
    layout: Layout, rank: int, nbytes: int, tensor_group: Any, data_group: Any, device: str
) -> list[float]:
    """This rank's seconds for [tensor all-reduce, pipeline phase 0, pipeline phase 1, data all-reduce]; 0 where
    the rank has no such link. Every rank must call it: the classes are separated by barriers."""
    coord = layout.coord(rank)
    buffer = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    inbox = torch.empty_like(buffer)
    seconds = [0.0, 0.0, 0.0, 0.0]
    if layout.tensor > 1:
        seconds[0] = _timed(_all_reduce(buffer, tensor_group))
    dist.barrier()
    for phase in (0, 1):
        peer = _pipeline_peer(layout, coord, phase)
        if peer is not None:
            seconds[1 + phase] = _timed(_exchange(buffer, inbox, peer))
        dist.barrier()
    if layout.data > 1:
        seconds[3] = _timed(_all_reduce(buffer, data_group))
    return seconds


def _pipeline_peer(layout: Layout, coord: Coord, phase: int) -> int | None:
    """The rank this one exchanges with in a phase: phase 0 pairs stages (0,1), (2,3)...; phase 1 (1,2), (3,4)..."""
    stage = coord.pipe
    partner = stage + 1 if (stage - phase) % 2 == 0 else stage - 1
    if partner < 0 or partner >= layout.pipeline or min(stage, partner) % 2 != phase:
        return None
    return layout.rank(Coord(partner, coord.data, coord.model))


def link_seconds(layout: Layout, links: Sequence[Link], per_rank: Sequence[Sequence[float]]) -> list[float]:
    """A link's time is its slowest member's (a collective ends for all when the last one is done)."""
    timed = []
    for link in links:
        if link.kind == "pipeline":
            phase = min(layout.coord(r).pipe for r in link.ranks) % 2
            timed.append(max(per_rank[r][1 + phase] for r in link.ranks))
        else:
            column = 0 if link.kind == "tensor" else 3
            timed.append(max(per_rank[r][column] for r in link.ranks))
    return timed


def planned_from_env(env: Mapping[str, str]) -> dict[str, float]:
    """PARALLELJOB_PLANNED_GBPS, e.g. `tensor=900,pipeline=50,data=50`: the planner's GB/s per class."""
    planned: dict[str, float] = {}
    for item in (env.get(environment.PLANNED_GBPS) or "").split(","):
        kind, _, value = item.partition("=")
        try:
            if kind.strip() in KINDS:
                planned[kind.strip()] = float(value)
        except ValueError:
            continue
    return planned


def run_check(layout: Layout, ranks_per_node: int, tensor_group: Any, data_group: Any) -> Result:
    """Time every link of the layout on this rank, gather every rank's figures, and judge them (same on all)."""
    started = time.perf_counter()
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    nbytes = int(os.environ.get(environment.NETWORK_CHECK_BYTES) or (DEFAULT_BYTES_GPU if gpu else DEFAULT_BYTES_CPU))
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = torch.tensor(measure_rank(layout, rank, nbytes, tensor_group, data_group, device), device=device)
    gathered = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    per_rank = [row.tolist() for row in gathered]
    links = links_of(layout, ranks_per_node)
    result = judge(
        list(zip(links, link_seconds(layout, links, per_rank), strict=True)), nbytes, planned_from_env(os.environ)
    )
    return dataclasses.replace(result, cost_seconds=time.perf_counter() - started)


def node_names(nodes: int) -> dict[int, str]:
    """The Kubernetes (or simulated) node name of every node rank; every rank must call it (one all-gather,
    made only when a link is slow, so a healthy start does not pay it)."""
    own = (int(os.environ.get(environment.NODE_RANK) or 0), os.environ.get(environment.NODE_NAME) or "")
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, own)
    names = {node: name for node, name in everyone if name}
    return {node: names.get(node, f"node-rank-{node}") for node in range(nodes)}


def verdict(result: Result, names: Mapping[int, str]) -> dict[str, Any]:
    """The record the metrics file and the progress channel carry: NetworkVerified's status, reason, message,
    the slowest links by node pair, each class's figures and the check's cost."""
    summary = result.class_summary()
    costs = f"check took {result.cost_seconds:.2f} s"
    if not result.slow:
        figures = "; ".join(f"{kind} {f['slowestGBps']:.3g}-{f['medianGBps']:.3g} GB/s" for kind, f in summary.items())
        message = f"{len(result.measured)} links within {SLOW_FACTOR:g}x of their class ({figures}); {costs}"
        return _record("True", "LinksMeasured", message, result, names)
    slowest = sorted(result.slow, key=lambda m: m.gbps)
    described = [_describe(m, summary, names) for m in slowest[:3]]
    message = slow_link_message([names[n] for n in result.named], f"{'; '.join(described)}; {costs}")
    return _record("False", SLOW_LINK, message, result, names)


def _describe(m: Measured, summary: Mapping[str, Mapping[str, float]], names: Mapping[int, str]) -> str:
    pair = "-".join(names.get(n, f"node-rank-{n}") for n in dict.fromkeys(m.link.nodes))
    figures = summary[m.link.kind]
    planned = f", planned {figures['plannedGBps']:g}" if "plannedGBps" in figures else ""
    return f"{m.link.kind} {pair} {m.gbps:.3g} GB/s (class median {figures['medianGBps']:.3g}{planned})"


def _record(status: str, reason: str, message: str, result: Result, names: Mapping[int, str]) -> dict[str, Any]:
    return {
        "verified": status,
        "reason": reason,
        "message": message,
        "slowNodes": [names[n] for n in result.named],
        "classes": result.class_summary(),
        "costSeconds": round(result.cost_seconds, 3),
    }


def check_at_start(
    layout: Layout, ranks_per_node: int, grid: Any, earlier: dict[str, Any] | None
) -> dict[str, Any] | None:
    """spec.network.preflight on every rank, once the engine's groups exist and before step 1: the verdict to
    report (NCCL's own False verdict, `earlier`, stays the job's), or None when the check is off. Under `fail` a
    slow link stops every rank with NetworkNotReady (condition NetworkVerified, reason SlowLink), naming the node."""
    mode = os.environ.get(environment.NETWORK_PREFLIGHT, "off")
    if mode == "off" or dist.get_world_size() < 2:
        return earlier
    result = run_check(layout, ranks_per_node, grid.slice_proc_group, grid.dp_proc_group)
    names = node_names(layout.world_size // ranks_per_node) if result.slow else {}
    record = verdict(result, names)
    if result.slow and mode == "fail":
        raise NetworkNotReady(SLOW_LINK, record["message"], condition="NetworkVerified")
    if earlier is not None and earlier.get("verified") == "False":
        return {**earlier, "links": record}
    return record
