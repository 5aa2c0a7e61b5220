"""The test kubelet's pod network (`testcluster.cluster.up(..., network_namespaces=True)`): each pod gets a
network namespace of its own on one bridge, with an address there (its podIP, and what /etc/hosts names it by),
as a CNI plugin gives pods; the machine is the bridge's `.254`, where a relay passes the pods' connections on to
the API server (which serves on 127.0.0.1 only; its certificate covers that address, `controlplane.up`'s
`serving_addresses`), so KUBERNETES_SERVICE_HOST is that address. A slow link is real: `slow_link` puts a token
bucket (`tc`) on a node's pods' veths, those running and those started there later, as a NIC trained down
slows every pod of its node.

Used by testcluster/kubelet.py (one `PodNetwork` per kubelet, from the `podnet.json` that `cluster.up` writes);
`close()` deletes the namespaces and the bridge, `netns.remove_leftovers` what a killed kubelet left.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterable
from pathlib import Path

from testcluster import netns

CONFIG = "podnet.json"
MAX_PODS = 253  # addresses .1 to .253 of the bridge's /24


def write_config(folder: Path, tag: str, subnet: int) -> None:
    (folder / CONFIG).write_text(json.dumps({"tag": tag, "subnet": subnet}))


def read_config(folder: Path) -> dict[str, object] | None:
    path = folder / CONFIG
    return dict(json.loads(path.read_text())) if path.exists() else None


class Relay:
    """Accepts TCP connections on `listen` and joins each to a new connection to `target`, bytes both ways."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.target = target
        self.server = socket.create_server(listen)
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True).start()

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(1 << 16):
            sink.sendall(data)
    # The other way may still be sending: half-close, and close both once both ways are done.
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)
    with contextlib.suppress(OSError):
        source.shutdown(socket.SHUT_RD)


class PodNetwork:
    """The pods of one kubelet on one bridge: an address for each pod by uid (`network(uid)`, as
    `containers.Addresses` gives one on loopback), a namespace while its container runs, slow links by node."""

    def __init__(self, tag: str, subnet: int, api_port: int) -> None:
        self.bridge = netns.Bridge(tag, 0, subnet)
        self.relay = Relay((self.bridge.host_address, api_port), ("127.0.0.1", api_port))
        self._index: dict[str, int] = {}
        self.slowed: dict[str, float] = {}  # node -> Mbit/s
        self.pending: dict[tuple[str, str], float] = {}  # (namespace, pod) -> Mbit/s, for the pod's node
        self.lock = threading.Lock()

    @property
    def host(self) -> str:
        """The machine's address on the pod network (the API server's, as the pods reach it)."""
        return self.bridge.host_address

    def __call__(self, uid: str) -> str:
        return self.bridge.address(self.index(uid))

    def index(self, uid: str) -> int:
        with self.lock:
            if uid not in self._index:
                if len(self._index) >= MAX_PODS:
                    raise ValueError(f"the pod network has no address left ({MAX_PODS} pods)")
                self._index[uid] = len(self._index)
            return self._index[uid]

    def enter(self, uid: str, node: str, pod: tuple[str, str]) -> list[str]:
        """Make the pod's namespace (slowed where its node is, or where a slow link waits for this pod) and
        return the command prefix that runs its container there."""
        index = self.index(uid)
        self.bridge.add(index)
        if pod in self.pending:
            self.slowed[node] = self.pending.pop(pod)
        if node in self.slowed:
            self.bridge.slow(index, self.slowed[node])
        return ["nsenter", f"--net=/run/netns/{self.bridge.namespace(index)}"]

    def leave(self, uid: str) -> None:
        """The pod's container has ended: its namespace goes (its address stays its own)."""
        self.bridge.remove(self.index(uid))

    def slow_link(
        self, mbit: float, node: str, pod: tuple[str, str], running: Iterable[tuple[str, str, tuple[str, str]]]
    ) -> None:
        """Slow `node`'s link to `mbit` Mbit/s, or that of the node `pod` runs on (or next starts on); `running`:
        (uid, node, (namespace, name)) of every running pod. Every pod on the node is slowed, now and later."""
        running = list(running)
        if not node:
            node = next((n for _, n, key in running if key == pod), "")
        if not node:
            self.pending[pod] = mbit
            return
        self.slowed[node] = mbit
        for uid, on, _ in running:
            if on == node:
                self.bridge.slow(self.index(uid), mbit)

    def close(self) -> None:
        self.relay.close()
        self.bridge.close()
