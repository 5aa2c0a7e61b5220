"""The GPU-usage index: what bound, unfinished pods request on each node, kept one small claim per pod.

The planner subtracts these requests from each node's allocatable. The index never keeps pod objects: each
pod becomes a `Claim` (its node, name, GPUs and its other resource requests in milli-units), and each node
keeps a `NodeUsage` total that is replaced, not recomputed, when one of its pods changes. So the operator feeds
it from a pod watch (`observe()`, one event at a time) corrected by periodic relists (`replace()`, one page
of pods at a time), and an admission pass reads a snapshot of totals instead of listing every pod of the
cluster. The CLI builds one from the pods of a file or of the live cluster, so both plan with the same numbers.

Pure: no Kubernetes client. Thread-safe: the operator's watch thread writes while passes read.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import sys
import threading
from collections.abc import Iterable, Mapping
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Any

GPU_RESOURCE = "nvidia.com/gpu"
TERMINAL_POD_PHASES = frozenset({"Succeeded", "Failed"})
PodKey = tuple[str, str]  # (namespace, name)
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?$")
_SUFFIXES = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    **{suffix: Decimal(1024**power) for power, suffix in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), start=1)},
}


@dataclasses.dataclass(frozen=True, slots=True)
class Claim:
    """What one bound, unfinished pod requests on its node: GPUs, and every other resource in milli-units
    (`cpu: 500m` is 500, `memory: 1Ki` is 1,024,000), as the scheduler sums them."""

    node: str
    pod: str
    gpus: int
    requests: tuple[tuple[str, int], ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class NodeUsage:
    """The totals of the claims on one node, and the names of the pods holding its GPUs."""

    gpus: int = 0
    holders: tuple[str, ...] = ()
    requests: tuple[tuple[str, int], ...] = ()

    def requested(self, resource: str) -> int:
        """Milli-units of `resource` requested here (GPUs in whole devices: `gpus`)."""
        return dict(self.requests).get(resource, 0)


EMPTY = NodeUsage()


def milli_quantity(value: Any) -> int | None:
    """A Kubernetes quantity ("500m", "2", "1Gi", "1e3") in milli-units, rounded up; None when unparsable."""
    match = _QUANTITY.match(str(value).strip())
    if match is None:
        return None
    number, exponent, suffix = match.groups()
    try:
        scaled = Decimal(number) * (Decimal(f"1{exponent}") if exponent else _SUFFIXES[suffix or ""]) * 1000
    except InvalidOperation:
        return None
    return int(scaled.to_integral_value(rounding=ROUND_CEILING))


def claim_of(pod: Mapping[str, Any]) -> Claim | None:
    """The claim of a bound, unfinished pod that requests anything; None for every other pod."""
    spec = pod.get("spec") or {}
    node = spec.get("nodeName")
    if not node or (pod.get("status") or {}).get("phase") in TERMINAL_POD_PHASES:
        return None
    totals = _effective_requests(spec)
    if not totals:
        return None
    gpus = totals.pop(GPU_RESOURCE, 0) // 1000
    name = str((pod.get("metadata") or {}).get("name") or "")
    requests = tuple(sorted((sys.intern(resource), amount) for resource, amount in totals.items() if amount))
    return Claim(sys.intern(str(node)), name, gpus, requests)


def _effective_requests(spec: Mapping[str, Any]) -> dict[str, int]:
    """Per resource: the containers' and sidecars' sum, or the largest plain init container if larger, plus
    the pod's overhead (the scheduler's rule). A container's limit counts where it sets no request."""
    running: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for container in spec.get("initContainers") or ():
        asked = _container_requests(container)
        if isinstance(container, Mapping) and container.get("restartPolicy") == "Always":
            _add(running, asked)  # a sidecar runs beside the containers
        else:
            for resource, amount in asked.items():
                init_peak[resource] = max(init_peak.get(resource, 0), amount + running.get(resource, 0))
    for container in spec.get("containers") or ():
        _add(running, _container_requests(container))
    totals = {r: max(running.get(r, 0), init_peak.get(r, 0)) for r in {*running, *init_peak}}
    _add(totals, _quantities(spec.get("overhead")))
    return totals


def _container_requests(container: Any) -> dict[str, int]:
    return requests_of((container.get("resources") or {}) if isinstance(container, Mapping) else {})


def requests_of(resources: Any) -> dict[str, int]:
    """A container's `resources` as what the scheduler counts, in milli-units: its requests, and its limits
    where it sets no request (the API server defaults a missing request to the limit)."""
    if not isinstance(resources, Mapping):
        return {}
    return {**_quantities(resources.get("limits")), **_quantities(resources.get("requests"))}


# Resources counted in bytes, rendered in binary units for people.
_BYTE_RESOURCES = ("memory", "ephemeral-storage", "hugepages-")


def render_quantity(resource: str, milli: int) -> str:
    """Milli-units as a person writes the quantity: `500m` or `4` CPUs, `16Gi` of memory, `2` devices."""
    if milli % 1000:
        return f"{milli}m"
    whole = milli // 1000
    if resource.startswith(_BYTE_RESOURCES) and whole:
        for suffix, size in (("Ti", 1024**4), ("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024)):
            if whole % size == 0:
                return f"{whole // size}{suffix}"
    return str(whole)


def _quantities(raw: Any) -> dict[str, int]:
    found = {}
    for resource, value in (raw or {}).items() if isinstance(raw, Mapping) else ():
        amount = milli_quantity(value)
        if amount:
            found[str(resource)] = amount
    return found


def _add(totals: dict[str, int], more: Mapping[str, int]) -> None:
    for resource, amount in more.items():
        totals[resource] = totals.get(resource, 0) + amount


def _key(pod: Mapping[str, Any]) -> PodKey:
    metadata = pod.get("metadata") or {}
    return str(metadata.get("namespace") or ""), str(metadata.get("name") or "")


class UsageIndex:
    """Claims by pod, totals by node; `observe()` a watch event, `replace()` from a full listing."""

    def __init__(self) -> None:
        self._claims: dict[PodKey, Claim] = {}
        self._by_node: dict[str, dict[PodKey, Claim]] = {}
        self._usage: dict[str, NodeUsage] = {}
        self._released = 0  # changes that released requests so far
        self._lock = threading.Lock()

    @classmethod
    def of(cls, pods: Iterable[Mapping[str, Any]]) -> UsageIndex:
        """An index of these pods (a pod listed twice, same namespace and name, counts once: the last copy)."""
        index = cls()
        index.replace(pods)
        return index

    def __len__(self) -> int:
        return len(self._claims)

    def observe(self, event_type: str, pod: Mapping[str, Any]) -> bool:
        """Apply one watch event (ADDED, MODIFIED, DELETED); True when it released requests on a node."""
        key = _key(pod)
        claim = None if event_type == "DELETED" else claim_of(pod)
        with self._lock:
            return self._set(key, claim)

    def replace(self, pods: Iterable[Mapping[str, Any]]) -> int:
        """Make the index exactly these pods (a relist); returns how many claims it corrected (its drift).

        `pods` may be a generator over pages: only the claims are kept, so a listing of 50,000 pods never
        needs to be in memory at once."""
        fresh: dict[PodKey, Claim] = {}
        for position, pod in enumerate(pods):
            claim = claim_of(pod)
            if claim is not None:
                namespace, name = _key(pod)
                fresh[(namespace, name or f"<unnamed {position}>")] = claim  # a hand-written file may omit names
        with self._lock:
            drift = 0
            for key in [k for k in self._claims if k not in fresh]:
                drift += 1
                self._set(key, None)
            for key, claim in fresh.items():
                if self._claims.get(key) != claim:
                    drift += 1
                    self._set(key, claim)
            return drift

    def snapshot(self) -> UsageSnapshot:
        """The totals and the claims of one moment (for an admission round)."""
        with self._lock:
            return UsageSnapshot(dict(self._usage), dict(self._claims), self._released)

    def usage(self) -> dict[str, NodeUsage]:
        """Totals by node name, a snapshot (nodes without claims are absent)."""
        with self._lock:
            return dict(self._usage)

    def bound(self) -> frozenset[PodKey]:
        """(namespace, name) of every pod holding GPUs."""
        with self._lock:
            return frozenset(key for key, claim in self._claims.items() if claim.gpus)

    def _set(self, key: PodKey, claim: Claim | None) -> bool:
        old = self._claims.pop(key, None)
        if old == claim:
            if old is not None:
                self._claims[key] = old
            return False
        if old is not None:
            del self._by_node[old.node][key]
            self._refresh(old.node)
        if claim is not None:
            self._claims[key] = claim
            self._by_node.setdefault(claim.node, {})[key] = claim
            self._refresh(claim.node)
        released = old is not None and (claim is None or claim.node != old.node or _shrinks(old, claim))
        self._released += released
        return released

    def _refresh(self, node: str) -> None:
        claims = self._by_node.get(node)
        if not claims:
            self._by_node.pop(node, None)
            self._usage.pop(node, None)
            return
        self._usage[node] = _total(claims.values())


@dataclasses.dataclass(frozen=True)
class UsageSnapshot:
    """The index at one moment: totals by node, and the claims they sum."""

    usage: Mapping[str, NodeUsage] = dataclasses.field(default_factory=dict)
    claims: Mapping[PodKey, Claim] = dataclasses.field(default_factory=dict)
    # How many changes had released requests by this moment: two snapshots with the same count have the same
    # room or less in the later one (an admission kept waiting need not be tried again).
    released: int = 0

    @functools.cached_property
    def bound(self) -> frozenset[PodKey]:
        """(namespace, name) of every pod holding GPUs."""
        return frozenset(key for key, claim in self.claims.items() if claim.gpus)

    def without(self, keys: Iterable[PodKey]) -> UsageSnapshot:
        """This moment less the claims of these pods: pods the API says are gone while their DELETED event has
        not reached the index yet."""
        gone = {key: self.claims[key] for key in keys if key in self.claims}
        if not gone:
            return self
        claims = {key: claim for key, claim in self.claims.items() if key not in gone}
        usage = dict(self.usage)
        for claim in gone.values():
            usage[claim.node] = _minus(usage.get(claim.node, EMPTY), claim)
        return UsageSnapshot(usage, claims, self.released)


def _minus(total: NodeUsage, claim: Claim) -> NodeUsage:
    holders = list(total.holders)
    if claim.gpus and claim.pod in holders:
        holders.remove(claim.pod)
    left = dict(total.requests)
    for resource, amount in claim.requests:
        left[resource] = left.get(resource, 0) - amount
    return NodeUsage(total.gpus - claim.gpus, tuple(holders), tuple(sorted((r, a) for r, a in left.items() if a > 0)))


def _total(claims: Iterable[Claim]) -> NodeUsage:
    found = list(claims)
    totals: dict[str, int] = {}
    for claim in found:
        _add(totals, dict(claim.requests))
    return NodeUsage(
        gpus=sum(claim.gpus for claim in found),
        holders=tuple(claim.pod for claim in found if claim.gpus),
        requests=tuple(sorted(totals.items())),
    )


def _shrinks(old: Claim, new: Claim) -> bool:
    before, after = dict(old.requests), dict(new.requests)
    return new.gpus < old.gpus or any(after.get(resource, 0) < amount for resource, amount in before.items())
