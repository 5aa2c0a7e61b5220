"""A scheduler for the strict cluster: binds pending pods to nodes in FIFO order, as default-scheduler's filters
would: `spec.nodeName`, `unschedulable`, taints and tolerations (a NotReady node carries the not-ready taint),
`nodeSelector` and required node affinity, and resource requests (CPU, memory, GPUs and any extended resource
such as RDMA or EFA devices) against allocatable minus what the pods bound there request. A pod that fits
nowhere gets `PodScheduled=False`, reason `Unschedulable`, with the real message form
(`0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) didn't match Pod's node affinity/selector.
preemption: ...`).

Opt-in: a test passes `components=[Scheduler]` to its ClusterThread; the fast tests bind pods themselves.
"""

from __future__ import annotations

import collections
import decimal
from collections.abc import Mapping
from typing import Any

from kubernetes.utils import parse_quantity

from tests.cluster import apiserver

SELECTOR_MISMATCH = "node(s) didn't match Pod's node affinity/selector"
UNSCHEDULABLE_NODE = "node(s) were unschedulable"
NOT_HELPFUL = "Preemption is not helpful for scheduling"
NO_VICTIMS = "No preemption victims found for incoming pod"
NOT_READY_TAINT = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
FINISHED = ("Succeeded", "Failed")


def pod_requests(pod: Mapping[str, Any]) -> dict[str, decimal.Decimal]:
    """What a pod requests: its containers' requests (limits where a request is absent, as the API defaults
    them), or the largest init container's where that is more, and one `pods` slot."""
    spec = pod.get("spec") or {}

    def of(container: Mapping[str, Any]) -> dict[str, decimal.Decimal]:
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        return {name: parse_quantity(value) for name, value in merged.items()}

    total: collections.Counter[str] = collections.Counter()
    for container in spec.get("containers") or []:
        total.update(of(container))
    for container in spec.get("initContainers") or []:
        for name, value in of(container).items():
            total[name] = max(total[name], value)
    total["pods"] = decimal.Decimal(1)
    return dict(total)


def _tolerates(tolerations: list[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    for toleration in tolerations:
        if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
            continue
        if toleration.get("operator") == "Exists":
            if not toleration.get("key") or toleration["key"] == taint.get("key"):
                return True
        elif toleration.get("key") == taint.get("key") and (toleration.get("value") or "") == (
            taint.get("value") or ""
        ):
            return True
    return False


def _expression_matches(labels: Mapping[str, str], expression: Mapping[str, Any]) -> bool:
    key, operator, values = expression.get("key"), expression.get("operator"), expression.get("values") or []
    present = key in labels
    if operator == "In":
        return present and labels[key] in values
    if operator == "NotIn":
        return not present or labels[key] not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present:
        number, bound = int(labels[key]), int(values[0])
        return number > bound if operator == "Gt" else number < bound
    return False


def _term_matches(node: Mapping[str, Any], term: Mapping[str, Any]) -> bool:
    labels = (node.get("metadata") or {}).get("labels") or {}
    fields = {"metadata.name": node["metadata"]["name"]}
    return all(_expression_matches(labels, e) for e in term.get("matchExpressions") or []) and all(
        _expression_matches(fields, e) for e in term.get("matchFields") or []
    )


def matches_affinity(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    return not terms or any(_term_matches(node, term) for term in terms)


def _ready(node: Mapping[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def taints_of(node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    taints = list((node.get("spec") or {}).get("taints") or [])
    return taints if _ready(node) else [*taints, NOT_READY_TAINT]


def allocatable(node: Mapping[str, Any]) -> dict[str, decimal.Decimal]:
    values = {name: parse_quantity(v) for name, v in ((node.get("status") or {}).get("allocatable") or {}).items()}
    values.setdefault("pods", decimal.Decimal(110))
    return values


def why_not(
    pod: Mapping[str, Any], node: Mapping[str, Any], used: Mapping[str, decimal.Decimal]
) -> tuple[list[str], bool]:
    """The reasons a node cannot take the pod (empty when it can), and whether preemption could ever help."""
    if (node.get("spec") or {}).get("unschedulable"):
        return [UNSCHEDULABLE_NODE], False
    tolerations = list((pod.get("spec") or {}).get("tolerations") or [])
    for taint in taints_of(node):
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(tolerations, taint):
            return [f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value') or ''}}}"], False
    if not matches_affinity(pod, node):
        return [SELECTOR_MISMATCH], False
    free = allocatable(node)
    short = [
        "Too many pods" if name == "pods" else f"Insufficient {name}"
        for name, wanted in sorted(pod_requests(pod).items())
        if wanted > 0 and free.get(name, decimal.Decimal(0)) - used.get(name, decimal.Decimal(0)) < wanted
    ]
    return short, True


def unschedulable_message(reasons: Mapping[str, int], preemption: Mapping[str, int], nodes: int) -> str:
    listed = ", ".join(sorted(f"{count} {reason}" for reason, count in reasons.items()))
    after = ", ".join(sorted(f"{count} {reason}" for reason, count in preemption.items()))
    return f"0/{nodes} nodes are available: {listed}. preemption: 0/{nodes} nodes are available: {after}."


class Scheduler(apiserver.Controller):
    """Binds pending pods whenever pods or nodes change."""

    plurals = frozenset({"pods", "nodes"})

    async def sync(self) -> None:
        await self.schedule_pending()

    def _used(self) -> dict[str, collections.Counter[str]]:
        used: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        for pod in self.server.live_objects("pods"):
            node = (pod.get("spec") or {}).get("nodeName")
            if node and (pod.get("status") or {}).get("phase") not in FINISHED:
                used[node].update(pod_requests(pod))
        return used

    async def schedule_pending(self) -> None:
        nodes = sorted(self.server.live_objects("nodes"), key=lambda n: n["metadata"]["name"])
        used = self._used()
        pending = [
            p
            for p in self.server.live_objects("pods")
            if not (p.get("spec") or {}).get("nodeName")
            and not p["metadata"].get("deletionTimestamp")
            and (p.get("spec") or {}).get("schedulerName", "default-scheduler") == "default-scheduler"
        ]
        for pod in sorted(pending, key=lambda p: self.server.created_order.get(p["metadata"]["uid"], 0)):
            await self._schedule(pod, nodes, used)

    async def _schedule(self, pod: dict[str, Any], nodes: list[dict[str, Any]], used: dict[str, Any]) -> None:
        reasons: collections.Counter[str] = collections.Counter()
        preemption: collections.Counter[str] = collections.Counter()
        key = self.server.key_of("pods", pod["metadata"].get("namespace") or "", pod["metadata"]["name"])
        for node in nodes:
            name = node["metadata"]["name"]
            failures, could_preempt = why_not(pod, node, used[name])
            if not failures:
                used[name].update(pod_requests(pod))
                await self.server.bind(key, pod, name)
                return
            reasons.update(failures)
            preemption[NO_VICTIMS if could_preempt else NOT_HELPFUL] += 1
        message = (
            unschedulable_message(reasons, preemption, len(nodes)) if nodes else "no nodes available to schedule pods"
        )
        await self._mark_unschedulable(key, pod, message)

    async def _mark_unschedulable(self, key: Any, pod: dict[str, Any], message: str) -> None:
        status = pod.setdefault("status", {})
        conditions = status.get("conditions") or []
        current = next((c for c in conditions if c.get("type") == "PodScheduled"), None)
        if current and (current.get("status"), current.get("message")) == ("False", message):
            return
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastTransitionTime": self.server.now(),
        }
        status["phase"] = "Pending"
        status["conditions"] = [*(c for c in conditions if c.get("type") != "PodScheduled"), condition]
        await self.server.replace_stored(key, pod)
