"""The informers over HTTP: a listing in pages (only bound, unfinished pods cross the wire), then the watch
keeps the usage index current and says when GPUs were released."""

from __future__ import annotations

import threading

from paralleljob.k8s import informer, session
from paralleljob.planning.usage import NodeUsage, UsageIndex
from tests.operator.helpers import Cluster, wait_for


def gpu_pod(name: str, node: str | None, gpus: int = 4) -> dict:
    spec = {
        "containers": [{"name": "c", "image": "trainer:test", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]
    }
    return {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {**spec, **({"nodeName": node} if node else {})},
    }


def test_the_usage_informer_lists_bound_pods_in_pages_then_follows_the_watch(apiserver):
    cluster = Cluster(apiserver)
    for i in range(5):
        cluster.core.create_namespaced_pod("default", gpu_pod(f"bound-{i}", f"gpu-00{i}"))
    cluster.core.create_namespaced_pod("default", gpu_pod("unbound", None))
    released = threading.Event()
    usage = UsageIndex()
    api = session.connect(str(apiserver.proxied_kubeconfig))
    watcher = informer.Informer(api, informer.BOUND_PODS, usage, released.set, page_size=2).start()
    try:
        assert watcher.synced.wait(10)
        assert len(usage) == 5 and usage.usage()["gpu-000"] == NodeUsage(4, ("bound-0",))
        lists = [c for c in apiserver.calls if c[:3] == ("list", "", "pods") and c[4].startswith("paralleljob")]
        assert len(lists) == 3  # 5 bound pods in pages of 2; the unbound one is not selected
        cluster.core.delete_namespaced_pod("bound-0", "default", grace_period_seconds=0)
        assert released.wait(10)
        wait_for(lambda: "gpu-000" not in usage.usage(), timeout=10, what="the deleted pod's GPUs released")
    finally:
        watcher.stop()
