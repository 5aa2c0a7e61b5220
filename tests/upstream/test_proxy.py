"""The fault proxy in front of the real API server: it forwards as it is (the server authenticates and
authorises each caller), and injects exactly the faults it is told: an outage for one user agent, a write that
takes effect with its answer lost, a stalled request, a muted watch, a skewed clock."""

from __future__ import annotations

import email.utils
import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from testcluster import controlplane
from testcluster.api import Api, Tool
from testcluster.proxy import FaultProxy


@pytest.fixture
def proxy(upstream: controlplane.State) -> Iterator[FaultProxy]:
    started = FaultProxy(upstream).start()
    try:
        yield started
    finally:
        started.stop()


class ProxiedApi(Api):
    """`Api` through the proxy, with a user agent of its own (the outage picks its victim by agent)."""

    def __init__(self, state: controlplane.State, proxy: FaultProxy, token: str, agent: str) -> None:
        super().__init__(state, token, server=f"https://127.0.0.1:{proxy.port}")
        self.session.headers["User-Agent"] = agent


def config_map(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "data": {"k": "v"}}


def test_kubectl_through_the_proxy_is_the_servers_answer_and_is_recorded(
    upstream: controlplane.State, proxy: FaultProxy, tmp_path: Any
) -> None:
    kubectl = Tool("kubectl", proxy.kubeconfig_for("admin", tmp_path))
    assert "kube-system" in kubectl("get", "namespaces", "-o", "name")
    assert any(c.resource == "namespaces" and c.method == "GET" and c.status == 200 for c in proxy.calls)
    # RBAC stays the server's: alice may do nothing.
    refused = Tool("kubectl", proxy.kubeconfig_for("alice", tmp_path)).run("get", "pods", check=False)
    assert refused.returncode == 1 and 'User "alice" cannot list resource "pods"' in refused.stderr


def test_an_outage_refuses_one_agent_and_the_last_write_takes_effect_unanswered(
    upstream: controlplane.State, proxy: FaultProxy, admin_api: Api, namespace: str
) -> None:
    victim = ProxiedApi(upstream, proxy, upstream.tokens["admin"], "paralleljob-operator/test")
    bystander = ProxiedApi(upstream, proxy, upstream.tokens["admin"], "kubectl/test")
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    proxy.outage_after, proxy.lose_last_answer = 2, True
    assert victim.send("POST", path, config_map("first")).status_code == 201
    lost = victim.send("POST", path, config_map("second"))
    assert lost.status_code == 503 and "awaiting this answer" in lost.json()["message"]
    assert victim.send("GET", f"{path}/second").status_code == 503
    # The write whose answer was lost took effect; other clients are not affected.
    assert bystander.send("GET", f"{path}/second").status_code == 200
    assert admin_api.send("GET", f"{path}/second").status_code == 200
    proxy.outage_after = None
    assert victim.send("GET", f"{path}/second").status_code == 200


def test_a_held_request_waits_until_released(upstream: controlplane.State, proxy: FaultProxy, namespace: str) -> None:
    api = ProxiedApi(upstream, proxy, upstream.tokens["admin"], "paralleljob-operator/test")
    proxy.held.add(("POST", "configmaps"))
    answers: list[int] = []
    sender = threading.Thread(
        target=lambda: answers.append(
            api.send("POST", f"/api/v1/namespaces/{namespace}/configmaps", config_map("held")).status_code
        )
    )
    sender.start()
    time.sleep(1.0)
    assert answers == [] and api.send("GET", f"/api/v1/namespaces/{namespace}/configmaps/held").status_code == 404
    proxy.held.clear()
    sender.join(10)
    assert answers == [201]


def test_a_muted_watch_stays_open_and_carries_nothing(
    upstream: controlplane.State, proxy: FaultProxy, admin_api: Api, namespace: str
) -> None:
    api = ProxiedApi(upstream, proxy, upstream.tokens["admin"], "paralleljob-operator/test")
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    version = api.ok(api.send("GET", path))["metadata"]["resourceVersion"]
    seen: list[str] = []

    def watch() -> None:
        url = f"https://127.0.0.1:{proxy.port}{path}"
        params = {"watch": "1", "resourceVersion": version, "timeoutSeconds": "6"}
        with api.session.get(url, params=params, stream=True, timeout=15, verify=str(upstream.ca)) as response:
            for line in response.iter_lines():
                seen.append(json.loads(line)["object"]["metadata"]["name"])

    proxy.muted.add("configmaps")
    watcher = threading.Thread(target=watch)
    watcher.start()
    time.sleep(0.5)
    admin_api.create(path, config_map(f"unseen-{uuid.uuid4().hex[:6]}"))
    time.sleep(1.0)
    assert [name for name in seen if name.startswith("unseen")] == []
    proxy.muted.clear()
    admin_api.create(path, config_map("seen"))
    watcher.join(15)
    assert "seen" in seen and not any(name.startswith("unseen") for name in seen)


def test_a_skewed_clock_shows_in_every_answers_date(upstream: controlplane.State, proxy: FaultProxy) -> None:
    api = ProxiedApi(upstream, proxy, upstream.tokens["admin"], "kubectl/test")
    proxy.clock_offset = -3600
    date = email.utils.parsedate_to_datetime(api.send("GET", "/api/v1/namespaces/default").headers["Date"])
    assert abs(date.timestamp() - (time.time() - 3600)) < 30
