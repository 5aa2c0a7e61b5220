"""The test kubelet's pod network (testcluster/podnet.py, `network_namespaces=True`): each pod in a network
namespace of its own on a bridge, with its bridge address as its podIP and in /etc/hosts, reaching the API
server through the machine's bridge address (which the serving certificate covers); a slow link put on a
node's pods with tc, those running and those started later; nothing left once the cluster is down.
The link check naming such a node on the whole product: tests/upstream/test_slow_link.py."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from testcluster import cluster as upstream_cluster
from testcluster import netns, podnet
from testcluster.api import Api
from tests.upstream.helpers import PODS, wait_for_pod

pytestmark = pytest.mark.skipif(not netns.available(), reason="needs root and iproute2 (network namespaces, tc)")


def _echo_server() -> tuple[socket.socket, int]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"echo:" + conn.recv(100))

    threading.Thread(target=serve, daemon=True).start()
    return server, int(server.getsockname()[1])


def _qdisc(network: podnet.PodNetwork, uid: str) -> str:
    outer = network.bridge.outer(network.index(uid))
    return subprocess.run(["tc", "qdisc", "show", "dev", outer], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def network() -> Iterator[podnet.PodNetwork]:
    server, port = _echo_server()
    subnet = netns.free_subnet()
    made = podnet.PodNetwork(f"t{subnet}", subnet, port)
    try:
        yield made
    finally:
        made.close()
        server.close()


def test_a_pod_has_its_own_address_and_reaches_the_machine_through_the_relay(network: podnet.PodNetwork) -> None:
    prefix = network.enter("uid-a", "gpu-0", ("default", "a"))
    port = network.relay.target[1]
    script = (
        "import socket, sys\n"
        f"s = socket.create_connection(({network.host!r}, {port}), timeout=10)\n"
        "s.sendall(b'hi'); print(s.recv(100).decode())\n"
    )
    done = subprocess.run([*prefix, sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "echo:hi"
    addresses = subprocess.run([*prefix, "ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
    assert f" {network('uid-a')}/24 " in addresses
    assert network("uid-a") != network("uid-b")
    # The machine's own loopback (where the API server listens) is not the pod's.
    reach = subprocess.run(
        [*prefix, sys.executable, "-c", f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)"],
        capture_output=True,
        timeout=30,
    )
    assert reach.returncode != 0


def test_a_slow_link_slows_the_nodes_pods_now_and_later_and_no_other(network: podnet.PodNetwork) -> None:
    network.enter("uid-a", "gpu-0", ("default", "a"))
    network.enter("uid-b", "gpu-1", ("default", "b"))
    running = [("uid-a", "gpu-0", ("default", "a")), ("uid-b", "gpu-1", ("default", "b"))]
    network.slow_link(80.0, "", ("default", "a"), running)
    assert "tbf" in _qdisc(network, "uid-a") and "80Mbit" in _qdisc(network, "uid-a")
    assert "tbf" not in _qdisc(network, "uid-b")
    network.enter("uid-c", "gpu-0", ("default", "c"))  # a later pod on the slowed node
    assert "tbf" in _qdisc(network, "uid-c")
    # A pod that does not run yet: its node is slowed once it starts there.
    network.slow_link(40.0, "", ("default", "later"), running)
    network.enter("uid-d", "gpu-2", ("default", "later"))
    assert "40Mbit" in _qdisc(network, "uid-d")
    network.leave("uid-d")
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert network.bridge.namespace(network.index("uid-d")) not in listed
    assert network.bridge.namespace(network.index("uid-a")) in listed


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[upstream_cluster.Cluster]:
    made = upstream_cluster.up(tmp_path / "cluster", nodes=1, gpus_per_node=1, network_namespaces=True)
    try:
        yield made
    finally:
        upstream_cluster.down(made.folder)


def test_a_pod_runs_on_its_bridge_address_and_reaches_the_api_server(cluster: upstream_cluster.Cluster) -> None:
    api = Api(cluster.state, cluster.state.tokens["admin"])
    script = (
        "import json, os, socket, ssl, urllib.request\n"
        "sa = '/var/run/secrets/kubernetes.io/serviceaccount'\n"
        "host = os.environ['KUBERNETES_SERVICE_HOST'] + ':' + os.environ['KUBERNETES_SERVICE_PORT']\n"
        "request = urllib.request.Request(f'https://{host}/apis/authentication.k8s.io/v1/selfsubjectreviews',\n"
        "    data=b'{}', method='POST', headers={'Authorization': 'Bearer ' + open(sa + '/token').read(),\n"
        "    'Content-Type': 'application/json'})\n"
        "context = ssl.create_default_context(cafile=sa + '/ca.crt')\n"
        "user = json.load(urllib.request.urlopen(request, context=context))['status']['userInfo']\n"
        "me = socket.gethostbyname(socket.gethostname())\n"
        "open('/dev/termination-log', 'w').write(user['username'] + ' ' + me + ' ' + os.environ['KUBERNETES_SERVICE_HOST'])\n"
    )
    container = {"name": "main", "image": "python", "command": [sys.executable, "-c", script]}
    api.create(PODS, {"metadata": {"name": "whoami"}, "spec": {"restartPolicy": "Never", "containers": [container]}})
    done = wait_for_pod(api, "whoami", lambda p: p["status"].get("phase") in ("Succeeded", "Failed"))
    terminated = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 0, (cluster.container_folders()[-1] / "container.log").read_text()
    user, resolved, api_host = terminated["message"].split()
    assert user == "system:serviceaccount:default:default"
    config = podnet.read_config(cluster.folder)
    assert config is not None
    subnet = f"{netns.SUBNET_PREFIX}.{config['subnet']}."
    assert done["status"]["podIP"].startswith(subnet)
    assert resolved == done["status"]["podIP"]  # its /etc/hosts names it by its bridge address
    assert api_host == f"{subnet}254"
    upstream_cluster.down(cluster.folder)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f"pjbr{config['tag']}" not in links
    assert f"pj{config['tag']}n" not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
