"""Each fault kind of `schedule.FAULTS`, injected from outside the server and the operator: a process stopped,
killed or started (`controlplane.stop_component`, the operator's SIGKILL), an object deleted or patched as the
admin, the process kubelet's fault switch. `inject` answers the target and, for a fault that lasts, what undoes
it; it raises when the fault could not be made. Called by `run`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.soak import jobs, observe
from bench.soak.cluster import Soaked
from testcluster import controlplane

Undo = Callable[[], None]


def _pick(candidates: list[str], pick: int) -> str | None:
    return sorted(candidates)[pick % len(candidates)] if candidates else None


def _job_pods(soak: Soaked) -> list[dict[str, Any]]:
    found = []
    for namespace in jobs.NAMESPACES:
        listed = observe.listing(soak.api, f"/api/v1/namespaces/{namespace}/pods", labelSelector="paralleljob.io/job")
        if listed is None:
            raise RuntimeError("the API server did not list pods")
        found += [p for p in listed if not p["metadata"].get("deletionTimestamp")]
    return found


def _ok(response: Any) -> None:
    if not response.ok and response.status_code != 404:
        raise RuntimeError(f"{response.request.method} {response.url}: {response.status_code} {response.text[:200]}")


def pod_kill(soak: Soaked, pick: int) -> tuple[str | None, Undo | None]:
    """A real node's pod: its main process SIGKILLed (a crash, the OOM killer); a fake node's: deleted at once."""
    pods = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in _job_pods(soak)}
    target = _pick(list(pods), pick)
    if target is None:
        return None, None
    namespace, name = target.split("/")
    if pods[target]["spec"].get("nodeName") in soak.real_nodes:
        soak.cluster.fault("kill-container", namespace=namespace, pod=name)
        return f"{target} (its process)", None
    _ok(soak.api.send("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", gracePeriodSeconds="0"))
    return target, None


def node_loss(soak: Soaked, pick: int) -> tuple[str | None, Undo | None]:
    """A fake node with a job's pods on it (any fake node when none has) deleted, as a cloud provider deletes the
    Node of a VM that is gone; a new node joins in its place."""
    busy = {p["spec"].get("nodeName") for p in _job_pods(soak)} - {None, *soak.real_nodes}
    nodes = observe.listing(soak.api, "/api/v1/nodes", labelSelector="pool=fake")
    if nodes is None:
        raise RuntimeError("the API server did not list nodes")
    names = [n["metadata"]["name"] for n in nodes]
    target = _pick([n for n in names if n in busy] or names, pick)
    if target is not None:
        _ok(soak.api.send("DELETE", f"/api/v1/nodes/{target}"))
        soak.new_fake_node()
    return target, None


def node_hang(soak: Soaked, pick: int) -> tuple[str | None, Undo | None]:
    target = _pick(soak.real_nodes, pick)
    assert target is not None
    soak.cluster.fault("silence", node=target)
    return target, lambda: soak.cluster.fault("resume", node=target)


def kueue_evict(soak: Soaked, pick: int) -> tuple[str | None, Undo | None]:
    """An admitted Workload deactivated: Kueue evicts it as a preemption does (the job stops and is queued again
    once the Workload is active again)."""
    found = observe.listing(soak.api, f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{jobs.QUEUED}/workloads")
    if found is None:
        raise RuntimeError("the API server did not list Workloads")
    admitted = [
        w["metadata"]["name"]
        for w in found
        if w["spec"].get("active", True)
        and any(
            c["type"] == "Admitted" and c["status"] == "True" for c in (w.get("status") or {}).get("conditions") or []
        )
    ]
    target = _pick(admitted, pick)
    if target is None:
        return None, None
    path = f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{jobs.QUEUED}/workloads/{target}"
    _ok(soak.api.send("PATCH", path, {"spec": {"active": False}}))
    return f"{jobs.QUEUED}/{target}", lambda: _ok(soak.api.send("PATCH", path, {"spec": {"active": True}}))


def operator_kill(soak: Soaked, pick: int) -> tuple[str | None, Undo | None]:
    soak.operator.kill()
    soak.operator.start()
    return "operator", None


def component(name: str, *, kill: bool) -> Callable[[Soaked, int], tuple[str | None, Undo | None]]:
    def stop(soak: Soaked, pick: int) -> tuple[str | None, Undo | None]:
        controlplane.stop_component(soak.state, name, kill=kill)
        return name, lambda: controlplane.start_component(soak.state, name)

    return stop


INJECT: dict[str, Callable[[Soaked, int], tuple[str | None, Undo | None]]] = {
    "pod-kill": pod_kill,
    "operator-kill": operator_kill,
    "node-loss": node_loss,
    "node-hang": node_hang,
    "kueue-evict": kueue_evict,
    "etcd-stop": component("etcd", kill=False),
    "etcd-kill": component("etcd", kill=True),
    "apiserver-restart": component("kube-apiserver", kill=True),
    "controller-manager-stop": component("kube-controller-manager", kill=False),
}
