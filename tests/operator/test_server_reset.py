"""The reset between two operator tests (testcluster/server.py) leaves the next test's namespace alone. Tests
create their namespaces again by the same names at once, so nothing still deleting an old one by name may touch
what the new one holds. The controller-manager's namespace controller did: it takes a namespace's deletion up five
seconds after it sees it, by name, and if that finds the namespace of a later test being reset, it goes on
deleting by name while the reset finishes and the test after creates the namespace again. On a loaded CI machine
that took the operator's ServiceAccount, a test's foreign ConfigMap and a job's progress ServiceAccount mid-test.

Here the namespace of a first test is reset; the namespace of a second one is filled and its deletion begun; if
anything starts deleting what the second holds, the controller-manager is paused there, the reset finishes, a third
test fills the namespace again, and the controller-manager resumes."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

import kubernetes

from testcluster import polling
from testcluster.server import UpstreamServer

NAMESPACE = "research"


def makers(client: kubernetes.client.ApiClient) -> dict[str, tuple[Callable[..., object], Callable[..., object]]]:
    """Kind -> (create in a namespace, list a namespace), for kinds the namespace controller deletes."""
    core, rbac = kubernetes.client.CoreV1Api(client), kubernetes.client.RbacAuthorizationV1Api(client)
    return {
        "ConfigMap": (core.create_namespaced_config_map, core.list_namespaced_config_map),
        "ServiceAccount": (core.create_namespaced_service_account, core.list_namespaced_service_account),
        "Secret": (core.create_namespaced_secret, core.list_namespaced_secret),
        "Service": (core.create_namespaced_service, core.list_namespaced_service),
        "Role": (rbac.create_namespaced_role, rbac.list_namespaced_role),
        "RoleBinding": (rbac.create_namespaced_role_binding, rbac.list_namespaced_role_binding),
        "PodTemplate": (core.create_namespaced_pod_template, core.list_namespaced_pod_template),
    }


def body(kind: str, name: str) -> dict[str, object]:
    extra: dict[str, dict[str, object]] = {
        "Service": {"spec": {"clusterIP": "None"}},
        "Role": {"rules": []},
        "RoleBinding": {"roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}},
        "PodTemplate": {"template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}},
    }
    return {"metadata": {"name": name}, **extra.get(kind, {})}


def fill(client: kubernetes.client.ApiClient, name: str) -> None:
    for kind, (create, _) in makers(client).items():
        create(NAMESPACE, body(kind, name))


def holding(client: kubernetes.client.ApiClient, name: str) -> list[str]:
    """The kinds of which the namespace holds the object `name`."""
    return [
        kind
        for kind, (_, listing) in makers(client).items()
        if name in {item.metadata.name for item in listing(NAMESPACE).items}
    ]


def test_a_namespace_made_again_after_a_reset_keeps_what_is_put_in_it(apiserver: UpstreamServer) -> None:
    client, core = apiserver.client, apiserver.core
    every_kind = list(makers(client))
    controllers = apiserver.state.pids["kube-controller-manager"]
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    fill(client, "first")
    apiserver.reset()
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    fill(client, "second")
    core.delete_namespace(NAMESPACE)  # the second test's reset begins

    # The first deletion is taken up five seconds after it: watch for 8 whether anything deletes the second's.
    polling.holds_for(lambda: holding(client, "second") == every_kind, 8, interval=0.01)
    os.kill(controllers, signal.SIGSTOP)
    try:
        apiserver.reset()
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        fill(client, "third")
    finally:
        os.kill(controllers, signal.SIGCONT)
    assert polling.holds_for(lambda: holding(client, "third") == every_kind, 3, interval=0.1)


def test_a_request_held_when_a_test_ends_never_reaches_the_next_one(apiserver: UpstreamServer) -> None:
    # A test may end with requests held in the fault proxy (its operator stopped mid-request). They must not be
    # sent on once the reset lifts the hold: into the next test's cluster, with the RBAC of the last one gone
    # (a 403 then counts against the next test).
    client = kubernetes.config.new_client_from_config(str(apiserver.proxied_kubeconfig))
    proxied = kubernetes.client.CoreV1Api(client)
    apiserver.proxy.held.add(("POST", "configmaps"))
    answers: list[object] = []
    sending = threading.Thread(
        target=lambda: answers.append(
            _answer(lambda: proxied.create_namespaced_config_map("default", {"metadata": {"name": "late"}}))
        )
    )
    sending.start()
    deadline = time.monotonic() + 10
    while not apiserver.proxy.holding and time.monotonic() < deadline:
        time.sleep(0.02)
    assert apiserver.proxy.holding, "the create is held"
    apiserver.reset()
    sending.join(10)
    time.sleep(0.5)
    names = {c.metadata.name for c in apiserver.core.list_namespaced_config_map("default").items}
    assert "late" not in names, answers
    assert answers == [503], answers


def test_a_request_delayed_when_a_test_ends_is_not_recorded_in_the_next_one(apiserver: UpstreamServer) -> None:
    # A test's operator can leave a request sleeping in the proxy's latency (test_admission_queue.py delays its
    # cluster-wide ConfigMap lists by 3 s). Answered 503 after the reset, it was recorded in the next test's calls,
    # where test_invalid.py counted it as a list that test's operator made (seen running the two together).
    client = kubernetes.config.new_client_from_config(str(apiserver.proxied_kubeconfig))
    proxied = kubernetes.client.CoreV1Api(client)
    apiserver.proxy.latency[("list", "configmaps")] = 1.0
    answers: list[object] = []
    sending = threading.Thread(target=lambda: answers.append(_answer(proxied.list_config_map_for_all_namespaces)))
    sending.start()
    time.sleep(0.3)  # the list reaches the proxy and sleeps there, in its delay
    apiserver.reset()
    apiserver.begin()  # the next test
    sending.join(10)
    assert answers == [503], answers
    assert [c for c in apiserver.calls if c[2] == "configmaps"] == []


def _answer(call: Callable[[], object]) -> int:
    try:
        call()
    except kubernetes.client.ApiException as error:
        return int(error.status)
    return 200
