"""The upstream Kubernetes control plane as local processes: etcd, kube-apiserver, kube-scheduler and
kube-controller-manager, from the binaries `make tools` builds (tools/README.md): the pinned release, or the newest
one with PARALLELJOB_KUBERNETES=next (`release`).

It is what envtest starts, plus the scheduler and the controller-manager (as Kubernetes' own
`hack/local-up-cluster.sh` runs them), so that pods are bound, garbage is collected, nodes that stop heartbeating
go NotReady and are tainted, and every namespace gets its ServiceAccount and root CA, as on a real cluster:
- etcd on private loopback ports and its own data folder (`--unsafe-no-fsync`: a test cluster's data is
  throwaway, and fsync is most of etcd's write latency);
- kube-apiserver on a free loopback port with a generated CA and serving certificate, ServiceAccount signing
  keys, static bearer tokens for the test users (`Users`), `--authorization-mode=Node,RBAC` and the default
  admission plugins (ValidatingAdmissionPolicy and PodSecurity among them);
- kube-scheduler and kube-controller-manager as the admin, without leader election.

Everything lives under one folder: keys, tokens, kubeconfigs, each process's log, etcd's data and `state.json`
with the ports and process ids, so `down(folder)` stops what `up` started, even from another process
(`scripts/local_cluster.py`). Nodes and the pods on them are the kubelet's business (`testcluster.kubelet`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import secrets
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from testcluster import pki, polling

REPO = Path(__file__).resolve().parents[1]
BIN = REPO / ".tools" / "bin"
# Which Kubernetes release the servers run (kube-apiserver, kube-scheduler, kube-controller-manager): the pinned
# one (tools/kube, built into .tools/bin) unless PARALLELJOB_KUBERNETES=next: the newest release the Go module proxy
# serves (tools/kube-next, built into .tools/kubernetes/next/bin). Both come from `make tools`, and `make test` runs
# the CRD, policy, Kueue and whole-product tests on each. kubectl and etcd stay the pinned ones: kubectl is within
# one minor of either server (Kubernetes' version skew policy); v1.37 ships with etcd 3.7.0, but its servers pass
# every test here on the pinned etcd 3.6.
RELEASE_VARIABLE = "PARALLELJOB_KUBERNETES"
RELEASES = {"pinned": BIN, "next": REPO / ".tools" / "kubernetes" / "next" / "bin"}
MODULES = {"pinned": REPO / "tools" / "kube", "next": REPO / "tools" / "kube-next"}
SERVERS = ("kube-apiserver", "kube-scheduler", "kube-controller-manager")
SERVICE_RANGE = "10.0.0.0/24"
ISSUER = "https://kubernetes.default.svc.cluster.local"
# How fast a node that stops heartbeating is marked NotReady: the node-lifecycle controller's period and grace.
# A real cluster waits 50 s; the test cluster's kubelet renews its Leases every HEARTBEAT_SECONDS.
NODE_MONITOR_PERIOD, NODE_MONITOR_GRACE = "1s", "8s"
HEARTBEAT_SECONDS = 2.0
READY_TIMEOUT = 120.0


class ControlPlaneError(RuntimeError):
    """A component did not start; the message names it and quotes the end of its log."""


@dataclasses.dataclass(frozen=True)
class User:
    name: str
    token: str
    groups: tuple[str, ...]


# Users the tests authenticate as: the admin (system:masters, as kubeadm's admin.conf), the kubelet of the test
# nodes, and two plain users with no rights until a test grants them some.
USERS = {
    "admin": ("kubernetes-admin", ("system:masters",)),
    "kubelet": ("paralleljob-test-kubelet", ("system:masters",)),
    "alice": ("alice", ()),
    "bob": ("bob", ()),
}


@dataclasses.dataclass
class State:
    """What `up` started, saved as `state.json`."""

    folder: Path
    apiserver_port: int
    etcd_port: int
    pids: dict[str, int]
    tokens: dict[str, str]
    # Each component's command line, so that a test can stop one and start it again as it was
    # (`stop_component`, `start_component`): etcd keeps its data folder, the API server its port.
    commands: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def kubeconfig(self) -> Path:
        return self.folder / "kubeconfig"

    @property
    def ca(self) -> Path:
        return pki.Keys(self.folder / "pki").ca

    def kubeconfig_for(self, user: str) -> Path:
        return self.folder / f"kubeconfig-{user}" if user != "admin" else self.kubeconfig

    def save(self) -> None:
        data = dataclasses.asdict(self) | {"folder": str(self.folder)}
        (self.folder / "state.json").write_text(json.dumps(data, indent=2))

    @classmethod
    def load(cls, folder: Path) -> State:
        data = json.loads((folder / "state.json").read_text())
        return cls(**(data | {"folder": Path(data["folder"])}))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def release() -> str:
    """The release the servers run, as PARALLELJOB_KUBERNETES names it (`pinned` when unset)."""
    name = os.environ.get(RELEASE_VARIABLE) or "pinned"
    if name not in RELEASES:
        raise ControlPlaneError(
            f"{RELEASE_VARIABLE}={name!r}: the releases are {', '.join(RELEASES)} (tools/README.md)"
        )
    return name


def version(name: str) -> str:
    """The Kubernetes version a release is built at, as its module's go.mod requires it (`v1.36.3`)."""
    found = re.search(r"^\s*k8s\.io/kubernetes (v\S+)", (MODULES[name] / "go.mod").read_text(), re.MULTILINE)
    if found is None:
        raise ControlPlaneError(f"{MODULES[name] / 'go.mod'} requires no k8s.io/kubernetes")
    return found.group(1)


def binary(name: str) -> Path:
    path = (RELEASES[release()] if name in SERVERS else BIN) / name
    if not os.access(path, os.X_OK):
        raise ControlPlaneError(f"{path} is missing: run `make tools` to build the control plane (needs Go)")
    return path


def kubeconfig_document(server: str, ca: Path, user: str, token: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "paralleljob-test", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": "paralleljob-test", "user": user}}],
        "current-context": user,
    }


def _write_credentials(folder: Path, server: str, ca: Path) -> dict[str, str]:
    tokens = {key: secrets.token_hex(16) for key in USERS}
    # The static token file: token,user,uid,"group1,group2".
    lines = [f'{tokens[key]},{name},{name},"{",".join(groups)}"' for key, (name, groups) in USERS.items()]
    (folder / "tokens.csv").write_text("\n".join(lines) + "\n")
    for key, (name, _) in USERS.items():
        path = folder / ("kubeconfig" if key == "admin" else f"kubeconfig-{key}")
        path.write_text(yaml.safe_dump(kubeconfig_document(server, ca, name, tokens[key])))
    return tokens


def _launch(state: State, name: str, args: list[str]) -> None:
    state.commands[name] = args
    state.pids[name] = _start(state.folder, name, args)
    state.save()


def _start(folder: Path, name: str, args: list[str]) -> int:
    log = (folder / "logs" / f"{name}.log").open("ab")
    # A session of its own, so that a test's Ctrl-C (sent to the foreground process group) does not kill the
    # cluster before the test's own teardown stops it in order.
    process = subprocess.Popen(
        args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )
    log.close()
    return process.pid


def _etcd_args(folder: Path, port: int, peer_port: int) -> list[str]:
    client, peer = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{peer_port}"
    return [
        str(binary("etcd")),
        "--name=default",
        f"--data-dir={folder / 'etcd'}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=default={peer}",
        "--unsafe-no-fsync",
        # 50,000 pods and 10,000 nodes (bench/) need more than the 2 GiB default.
        "--quota-backend-bytes=8589934592",
        "--log-level=warn",
    ]


def _apiserver_args(folder: Path, keys: pki.Keys, port: int, etcd_port: int) -> list[str]:
    return [
        str(binary("kube-apiserver")),
        f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        # Since v1.37 the endpoint reconciler refuses a loopback advertise address ("cannot use public IP
        # 127.0.0.1 with endpoint reconciler"). Nothing here reads the `kubernetes` Service's endpoints: pods reach
        # the API server at KUBERNETES_SERVICE_HOST, the address the pod network relays (testcluster.podnet).
        "--endpoint-reconciler-type=none",
        f"--secure-port={port}",
        f"--cert-dir={folder / 'apiserver'}",
        f"--tls-cert-file={keys.serving_certificate}",
        f"--tls-private-key-file={keys.serving_key}",
        f"--client-ca-file={keys.ca}",
        f"--token-auth-file={folder / 'tokens.csv'}",
        f"--service-account-issuer={ISSUER}",
        f"--api-audiences={ISSUER}",
        f"--service-account-key-file={keys.service_account_public_key}",
        f"--service-account-signing-key-file={keys.service_account_key}",
        f"--service-cluster-ip-range={SERVICE_RANGE}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        "--allow-privileged=true",
        "--profiling=false",
        # The tests create and delete thousands of objects; a real cluster's default of 400 in flight is fine,
        # but priority and fairness's per-user queues would throttle one admin writing 50,000 pods.
        "--max-requests-inflight=2000",
        "--max-mutating-requests-inflight=1000",
        "--enable-priority-and-fairness=false",
    ]


def _scheduler_args(folder: Path, state: State, port: int) -> list[str]:
    config = folder / "scheduler.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "clientConnection": {"kubeconfig": str(state.kubeconfig), "qps": 500, "burst": 1000},
                "leaderElection": {"leaderElect": False},
            }
        )
    )
    return [
        str(binary("kube-scheduler")),
        f"--config={config}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--authentication-kubeconfig={state.kubeconfig}",
        f"--authorization-kubeconfig={state.kubeconfig}",
    ]


def _controller_manager_args(state: State, keys: pki.Keys, port: int, controllers: str, node_grace: str) -> list[str]:
    return [
        str(binary("kube-controller-manager")),
        f"--kubeconfig={state.kubeconfig}",
        f"--authentication-kubeconfig={state.kubeconfig}",
        f"--authorization-kubeconfig={state.kubeconfig}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--controllers={controllers}",
        f"--root-ca-file={keys.ca}",
        f"--service-account-private-key-file={keys.service_account_key}",
        f"--cluster-signing-cert-file={keys.ca}",
        f"--cluster-signing-key-file={keys.ca_key}",
        "--use-service-account-credentials=false",
        f"--service-cluster-ip-range={SERVICE_RANGE}",
        f"--node-monitor-period={NODE_MONITOR_PERIOD}",
        f"--node-monitor-grace-period={node_grace}",
        "--kube-api-qps=500",
        "--kube-api-burst=1000",
    ]


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def _alive(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        waited = 0  # not our child (started by another process): ask the kernel instead
    if waited == pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/status").read_text().find("State:\tZ") < 0


def get(state: State, path: str, token: str | None = None, timeout: float = 5.0) -> tuple[int, bytes]:
    context = ssl.create_default_context(cafile=str(state.ca))
    request = urllib.request.Request(state.server + path)
    request.add_header("Authorization", f"Bearer {token or state.tokens['admin']}")
    try:
        with urllib.request.urlopen(request, context=context, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def wait_until(state: State, component: str, ready: Any, timeout: float = READY_TIMEOUT) -> None:
    """Return once `ready()` (an OSError counting as not yet); ControlPlaneError with the component's log when it
    exits or is not ready within `timeout`."""

    def up() -> Any:
        if not _alive(state.pids[component]):
            raise ControlPlaneError(f"{component} exited:\n{_tail(state.folder / 'logs' / f'{component}.log')}")
        return ready()

    try:
        polling.wait_for(up, timeout, component, interval=0.2, tolerate=(OSError,))
    except TimeoutError:
        raise ControlPlaneError(
            f"{component} not ready after {timeout:.0f} s:\n{_tail(state.folder / 'logs' / f'{component}.log')}"
        ) from None


def post(state: State, path: str, body: Any) -> dict[str, Any]:
    """Create an object as the admin; an object that exists already is fine (a restarted `up`)."""
    context = ssl.create_default_context(cafile=str(state.ca))
    request = urllib.request.Request(state.server + path, data=json.dumps(body).encode(), method="POST")
    request.add_header("Authorization", f"Bearer {state.tokens['admin']}")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return dict(json.loads(response.read()))
    except urllib.error.HTTPError as error:
        if error.code != 409:
            raise ControlPlaneError(f"POST {path}: {error.code} {error.read().decode(errors='replace')}") from error
        return {}


def _etcd_ready(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
        return b'"health":"true"' in response.read()


def up(
    folder: Path,
    controllers: str = "*",
    *,
    scheduler: bool = True,
    before_controllers: Callable[[State], None] | None = None,
    node_grace: str = NODE_MONITOR_GRACE,
    serving_addresses: tuple[str, ...] = (),
) -> State:
    """Start etcd, the API server, the scheduler and the controller-manager; return once the API server is ready
    and the controller-manager has published the root CA to the default namespace (its controllers run).

    `controllers` is the controller-manager's `--controllers`: a benchmark whose nodes are written once, with no
    kubelet to renew them, turns off `node-lifecycle-controller` so that they stay Ready. Without `scheduler`
    no kube-scheduler runs: tests that play the scheduler bind pods themselves (pods/binding).
    `before_controllers` runs once the API server is ready and before the scheduler and controller-manager start:
    a CRD installed there is watched by the garbage collector from its start, where one installed later is
    only found by its discovery resync, every 30 s (until then the dependents of a deleted custom object stay:
    40 s measured for a ParallelJob's ConfigMap on a control plane just started).
    `node_grace` is how long a node may miss its heartbeats before it is marked NotReady: the tests' kubelet
    renews every HEARTBEAT_SECONDS, kwok (bench/kwok.py) every quarter of its Lease, as a real kubelet does.
    `serving_addresses`: more addresses the API server's certificate covers (where the kubelet's pod network
    relays it, testcluster/podnet.py)."""
    folder = folder.resolve()
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    keys = pki.make_keys(folder / "pki", serving_addresses)
    apiserver_port, etcd_port = free_port(), free_port()
    server = f"https://127.0.0.1:{apiserver_port}"
    tokens = _write_credentials(folder, server, keys.ca)
    state = State(folder, apiserver_port, etcd_port, {}, tokens)
    try:
        _launch(state, "etcd", _etcd_args(folder, etcd_port, free_port()))
        _wait_ready(state, "etcd")
        _launch(state, "kube-apiserver", _apiserver_args(folder, keys, apiserver_port, etcd_port))
        _wait_ready(state, "kube-apiserver")
        if before_controllers is not None:
            before_controllers(state)
        if scheduler:
            _launch(state, "kube-scheduler", _scheduler_args(folder, state, free_port()))
        _launch(
            state,
            "kube-controller-manager",
            _controller_manager_args(state, keys, free_port(), controllers, node_grace),
        )
        wait_until(
            state,
            "kube-controller-manager",
            lambda: get(state, "/api/v1/namespaces/default/configmaps/kube-root-ca.crt")[0] == 200,
        )
    except BaseException:
        down(folder)
        raise
    return state


def _wait_ready(state: State, name: str) -> None:
    """Wait until etcd or the API server answers as ready (the other components have no probe here)."""
    if name == "etcd":
        wait_until(state, name, lambda: _etcd_ready(state.etcd_port))
    elif name == "kube-apiserver":
        wait_until(state, name, lambda: get(state, "/readyz")[0] == 200)


def stop_component(state: State, name: str, *, kill: bool = True) -> None:
    """Stop one component, as a crash (SIGKILL) or a rollout (SIGTERM) would; `start_component` brings it back."""
    pid = state.pids.pop(name)
    state.save()
    if kill:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    stop_process(pid)


def start_component(state: State, name: str) -> None:
    """Start a stopped component again with its own command line (etcd on its data, the API server on its
    port), and wait until it answers."""
    _launch(state, name, state.commands[name])
    _wait_ready(state, name)


def down(folder: Path, grace: float = 10.0) -> None:
    """Stop what `up` started, newest first (SIGTERM, then SIGKILL after `grace`); a stopped cluster is a no-op."""
    try:
        state = State.load(folder.resolve())
    except FileNotFoundError:
        return
    for name, pid in reversed(list(state.pids.items())):
        stop_process(pid, grace)
        del state.pids[name]
        state.save()


def stop_process(pid: int, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def start_scheduler(state: State) -> int:
    """A kube-scheduler for a cluster started without one; its process id (stop it with `stop_process`)."""
    return _start(state.folder, "kube-scheduler", _scheduler_args(state.folder, state, free_port()))
