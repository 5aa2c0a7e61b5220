"""Which nodes may hold a pod of a job, and, for those that may not, the reason in words.

Node-level filters in the order a person checks them: Ready, cordoned, GPUs at all, taints against the job's
tolerations, the job's nodeSelector, the CPU, memory and extended resources each pod requests
(`spec.template.resources`) against what bound pods leave free, then (per GPU product) GPU memory and free GPUs. Every rejected node
adds to a `Tally`, which becomes the "11 qualify: 3 cordoned, 2 have GPUs in use by pods a/b" part of an
unschedulable message. Called by the planner.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from paralleljob.planning import inventory
from paralleljob.planning.inventory import GPU_RESOURCE, NodeInfo
from paralleljob.planning.plan import Shortfall
from paralleljob.planning.usage import render_quantity

MIB = 1024**2
MAX_HOLDERS_SHOWN = 4


@dataclasses.dataclass
class Tally:
    """Rejected nodes by reason (singular and plural phrase), plus who holds the GPUs of busy nodes."""

    counts: collections.Counter[tuple[str, str]] = dataclasses.field(default_factory=collections.Counter)
    pods: list[str] = dataclasses.field(default_factory=list)
    jobs: list[str] = dataclasses.field(default_factory=list)

    def add(self, singular: str, plural: str, count: int = 1) -> None:
        self.counts[(singular, plural)] += count

    def merged(self, other: Tally) -> Tally:
        return Tally(self.counts + other.counts, self.pods + other.pods, self.jobs + other.jobs)

    def shortfalls(self) -> tuple[Shortfall, ...]:
        ordered = sorted(self.counts.items(), key=lambda item: -item[1])
        return tuple(Shortfall(count, self._with_holders(s), self._with_holders(p)) for (s, p), count in ordered)

    def _with_holders(self, phrase: str) -> str:
        if "{holders}" not in phrase:
            return phrase
        parts = [_names("pod", self.pods), _names("ParallelJob", self.jobs)]
        return phrase.replace("{holders}", " and ".join(part for part in parts if part))


def screen(
    nodes: Iterable[NodeInfo], selector: Mapping[str, str] | None, tolerations: Sequence[Mapping[str, Any]] | None
) -> tuple[list[NodeInfo], Tally]:
    """Nodes that pass the job-independent-of-GPU filters, and the tally of those that do not."""
    selected: list[NodeInfo] = []
    tally = Tally()
    wanted = list((selector or {}).items())
    tolerations = list(tolerations or ())
    for node in nodes:
        reason = _rejection(node, wanted, tolerations)
        if reason is None:
            selected.append(node)
        else:
            tally.add(*reason)
    return selected, tally


def _rejection(
    node: NodeInfo, wanted: list[tuple[str, str]], tolerations: list[Mapping[str, Any]]
) -> tuple[str, str] | None:
    if not node.ready:
        return ("is not Ready", "are not Ready")
    if node.unschedulable:
        return ("cordoned", "cordoned")
    if node.allocatable_gpus <= 0:
        return (f"has no {GPU_RESOURCE}", f"have no {GPU_RESOURCE}")
    for taint in node.taints:
        if taint.effect in inventory.BLOCKING_TAINT_EFFECTS and not inventory.tolerates(tolerations, taint):
            return (f"has taint {taint.render()} not tolerated", f"have taint {taint.render()} not tolerated")
    labels = node.labels
    for key, value in wanted:
        if labels.get(key) != value:
            return (f"lacks nodeSelector {key}={value}", f"lack nodeSelector {key}={value}")
    return None


def with_resources(nodes: Iterable[NodeInfo], requests: Mapping[str, int]) -> tuple[list[NodeInfo], Tally]:
    """Nodes with room for one pod's `requests` (milli-units, GPUs aside), as the scheduler counts them:
    allocatable less what the pods bound there request. A node that does not list cpu, memory or
    ephemeral-storage (a hand-written cluster file) is not checked for it; one that does not list an extended
    resource (a name with a `/`: rdma/..., vpc.amazonaws.com/efa) has none of it."""
    wanted = sorted((resource, amount) for resource, amount in requests.items() if amount > 0)
    if not wanted:
        return list(nodes), Tally()
    kept: list[NodeInfo] = []
    tally = Tally()
    for node in nodes:
        short = _shortage(node, wanted)
        if short is None:
            kept.append(node)
        else:
            tally.add(f"has {short}", f"have {short}")
    return kept, tally


def _shortage(node: NodeInfo, wanted: Sequence[tuple[str, int]]) -> str | None:
    for resource, amount in wanted:
        free = node.free(resource)
        if free is None and "/" not in resource:
            continue
        free = max(0, free or 0)
        if free < amount:
            shown, asked = render_quantity(resource, free), render_quantity(resource, amount)
            return f"too little {resource} ({shown} free, {asked} requested)"
    return None


def by_product(nodes: Iterable[NodeInfo], mixed: bool) -> dict[str, list[NodeInfo]]:
    """Nodes grouped by nvidia.com/gpu.product; one group "" when products may mix."""
    groups: dict[str, list[NodeInfo]] = {}
    for node in nodes:
        groups.setdefault("" if mixed else node.product, []).append(node)
    return groups


def other_products(groups: Mapping[str, list[NodeInfo]], chosen: str) -> Tally:
    tally = Tally()
    for product, members in groups.items():
        if product != chosen:
            name = product or "no gpu.product label"
            tally.add(f"has another GPU product ({name})", f"have another GPU product ({name})", len(members))
    return tally


def with_memory(nodes: Iterable[NodeInfo], needed_bytes: float, stage: str = "only") -> tuple[list[NodeInfo], Tally]:
    """Nodes whose GPUs (nvidia.com/gpu.memory, when labelled) hold the estimated bytes per GPU of `stage`."""
    kept: list[NodeInfo] = []
    tally = Tally()
    needed_mib = needed_bytes / MIB
    where = "" if stage == "only" else f" on the {stage} pipeline stage"
    for node in nodes:
        memory = node.gpu_memory_mib
        if memory is None or memory >= needed_mib:
            kept.append(node)
        else:
            detail = f"too little GPU memory ({memory} MiB < {needed_mib:.0f} MiB estimated per GPU{where})"
            tally.add(f"has {detail}", f"have {detail}")
    return kept, tally


def with_free_gpus(nodes: Iterable[NodeInfo], gpus: int) -> tuple[list[NodeInfo], Tally]:
    """Nodes with at least `gpus` free GPUs (one pod of the job per node)."""
    kept: list[NodeInfo] = []
    tally = Tally()
    for node in nodes:
        if node.free_gpus >= gpus:
            kept.append(node)
        elif node.allocatable_gpus < gpus:
            tally.add(f"has fewer than {gpus} GPUs", f"have fewer than {gpus} GPUs")
        else:
            tally.add("has GPUs in use by {holders}", "have GPUs in use by {holders}")
            tally.pods.extend(node.holders)
            tally.jobs.extend(node.reserved_by)
    return kept, tally


def _names(kind: str, names: list[str]) -> str:
    """ "pods a/b" or "pod a" (at most four names, then "and N more")."""
    unique = list(dict.fromkeys(names))
    if not unique:
        return ""
    shown = "/".join(unique[:MAX_HOLDERS_SHOWN])
    more = f" and {len(unique) - MAX_HOLDERS_SHOWN} more" if len(unique) > MAX_HOLDERS_SHOWN else ""
    return f"{kind}{'s' if len(unique) > 1 else ''} {shown}{more}"
