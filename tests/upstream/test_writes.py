"""`writes.create_all` on the real API server, counted through the fault proxy: every child created once, in
slow-start batches that stop at the first refusal, so a quota that refuses them all costs a few requests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from paralleljob.k8s import session as k8s_session
from paralleljob.k8s import writes
from testcluster import controlplane, polling
from testcluster.api import Api
from testcluster.proxy import FaultProxy
from tests.api.jobs import job


@pytest.fixture
def proxied(
    upstream: controlplane.State, chart: str, tmp_path: Path
) -> Iterator[tuple[FaultProxy, k8s_session.Session]]:
    proxy = FaultProxy(upstream).start()
    try:
        yield proxy, k8s_session.connect(str(proxy.kubeconfig_for("admin", tmp_path)))
    finally:
        proxy.stop()


def children(admin: Api, namespace: str, count: int) -> list[dict[str, Any]]:
    """ConfigMaps a ParallelJob controls, as the operator builds its children."""
    owner = admin.create(f"/apis/paralleljob.io/v1alpha1/namespaces/{namespace}/paralleljobs", job())
    reference = {
        "apiVersion": "paralleljob.io/v1alpha1",
        "kind": "ParallelJob",
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"child-{i}", "namespace": namespace, "ownerReferences": [reference]},
            "data": {"rank": str(i)},
        }
        for i in range(count)
    ]


def posts(proxy: FaultProxy, namespace: str) -> int:
    return sum(1 for c in proxy.calls if c.method == "POST" and c.resource == "configmaps" and c.namespace == namespace)


def test_every_child_is_created_once_and_again_is_a_no_op(
    proxied: tuple[FaultProxy, k8s_session.Session], admin_api: Api, namespace: str
) -> None:
    proxy, session = proxied
    bodies = children(admin_api, namespace, 37)
    assert writes.create_all(session, bodies) == 37
    assert posts(proxy, namespace) == 37
    names = {
        c["metadata"]["name"]
        for c in admin_api.ok(admin_api.send("GET", f"/api/v1/namespaces/{namespace}/configmaps"))["items"]
    }
    assert {f"child-{i}" for i in range(37)} <= names
    assert writes.create_all(session, bodies) == 0  # the job's own copies exist: nothing new


def test_a_quota_that_refuses_them_all_stops_the_batches(
    proxied: tuple[FaultProxy, k8s_session.Session], admin_api: Api, namespace: str
) -> None:
    proxy, session = proxied
    bodies = children(admin_api, namespace, 64)
    # The namespace holds kube-root-ca.crt: room for one child more.
    quota = {"metadata": {"name": "configmaps"}, "spec": {"hard": {"configmaps": "2"}}}
    admin_api.create(f"/api/v1/namespaces/{namespace}/resourcequotas", quota)
    wait_for_quota(admin_api, namespace)
    with pytest.raises(writes.Rejected, match="exceeded quota"):
        writes.create_all(session, bodies)
    # A batch of 1 (created), then a batch of 2 (both refused), and no more.
    assert posts(proxy, namespace) == 3


def wait_for_quota(admin: Api, namespace: str) -> None:
    """The quota controller fills `status.hard` before the quota admission enforces it."""

    def filled() -> Any:
        quota = admin.ok(admin.send("GET", f"/api/v1/namespaces/{namespace}/resourcequotas/configmaps"))
        return (quota.get("status") or {}).get("hard")

    polling.wait_for(filled, 30, "the quota's status.hard", interval=0.1)
