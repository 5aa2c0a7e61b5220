"""The process kubelet of the upstream test cluster: what a kubelet does that the control plane relies on, for a
few fake GPU nodes, with each pod's container run as local processes.

The only simulated part of the cluster. It talks to the real API server as a client, as a kubelet does:
- registers its Nodes (capacity, allocatable, labels, Ready) and renews their Leases in `kube-node-lease` and
  their Ready condition every `HEARTBEAT_SECONDS`; a silenced node (a fault) stops both, so the
  controller-manager's node-lifecycle controller marks it NotReady and taints it, as on a real cluster;
- watches the pods bound to its nodes and runs each one's first container in its own mount and UTS namespace
  (`testcluster.sandbox`). A container whose image is in the local store (`make images`, `testcluster.images`)
  runs in that image's root filesystem: its entrypoint, command, environment, working directory and user, each
  overridden by the pod spec as Kubernetes does; runAsUser, runAsGroup, runAsNonRoot, fsGroup (on its volumes)
  and readOnlyRootFilesystem honoured. Any other container runs on the machine's root with the project's venv
  first on PATH: the container's command and args, or the image's entrypoint and command as its Dockerfile
  declares them (`IMAGES`). Either way: the pod's environment (values, the
  downward API's fieldRefs) and `KUBERNETES_SERVICE_HOST`/`_PORT` pointing at the API server; volumes at their
  mount paths: ConfigMaps, emptyDirs, PersistentVolumeClaims (a folder per claim, shared by the pods that mount
  it), hostPath (a folder under the kubelet's root), and projected volumes with ServiceAccount tokens asked of
  the TokenRequest API and bound to the pod, ConfigMaps and the downward API (the API server's ServiceAccount
  admission adds one to every pod, with the token, the cluster's CA and the namespace);
- reports phase, conditions (PodScheduled kept as the scheduler wrote it), container statuses and the
  termination message (`terminationMessagePath`), and honours graceful deletion: SIGTERM, the grace period,
  SIGKILL, then the pod object is deleted with grace 0 as the kubelet confirms it.
- with a pod network (`testcluster.podnet`, `cluster.up(..., network_namespaces=True)`), runs each pod in a
  network namespace of its own on a bridge, whose address is its podIP and its /etc/hosts entry, and slows a
  node's links for real (`slow-link`, tc); without one, pods share the machine's network, each with a loopback
  address of its own;
- runs httpGet liveness probes (`livenessProbe`) against the pod's address, logs each answer in the pod's folder
  (`probes.log`) and stops a container that fails `failureThreshold` in a row, as the kubelet kills it.
Pods run with restartPolicy Never semantics; readiness and startup probes are not run. Images are not pulled.

It runs as a process of its own (`python -m testcluster.kubelet FOLDER`, started by `testcluster.cluster`)
and takes faults on a loopback HTTP port (`Faults`), so tests and `scripts/local_cluster.py` drive it alike.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.server
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import requests

from paralleljob.local import throttle as throttle_cgroup
from paralleljob.manifests import timestamps
from testcluster import containers, controlplane, images, podnet
from testcluster import sandbox as sandbox_program

HEARTBEAT_SECONDS = controlplane.HEARTBEAT_SECONDS
LEASE_SECONDS = 40
GRACE_CAP_SECONDS = 10.0
SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
TERMINATION_MESSAGE_LIMIT = 4096  # bytes, as the kubelet caps it
# A pod's deletion that the API server did not take is tried again this often, this many times (about two minutes).
CONFIRM_RETRY_SECONDS = 4.0
CONFIRM_TRIES = 30


def _dockerfile_config(path: Path) -> dict[str, list[str]]:
    """ENTRYPOINT and CMD of a Dockerfile's final stage (exec form), as the image's config would hold them."""
    config: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if match := re.match(r"^(ENTRYPOINT|CMD)\s+(\[.*\])\s*$", line):
            config[match.group(1)] = json.loads(match.group(2))
        elif line.startswith("FROM "):
            config = {}
    return config


# The project's own images: what they run when a pod names no command, read from their Dockerfiles (the images
# themselves are not built here).
IMAGES = {
    "ghcr.io/paralleljob/operator": _dockerfile_config(controlplane.REPO / "Dockerfile"),
    "ghcr.io/paralleljob/trainer": _dockerfile_config(controlplane.REPO / "trainer-image" / "Dockerfile"),
}


def image_config(image: str) -> dict[str, list[str]]:
    repository = image.split("@", 1)[0].rsplit(":", 1)[0] if "/" in image else image
    return IMAGES.get(repository, {})


def container_command(container: dict[str, Any], image: images.Image | None = None) -> list[str]:
    """Kubernetes' rule: `command` replaces the entrypoint (and drops the image's CMD), `args` replaces CMD."""
    config = (
        {"ENTRYPOINT": image.entrypoint, "CMD": image.cmd}
        if image is not None
        else image_config(container.get("image") or "")
    )
    if container.get("command"):
        return [*container["command"], *(container.get("args") or [])]
    return [*config.get("ENTRYPOINT", []), *(container.get("args") or config.get("CMD", []))]


@dataclasses.dataclass
class Running:
    namespace: str
    name: str
    uid: str
    node: str
    process: subprocess.Popen[bytes]
    folder: Path
    container: dict[str, Any]
    started_at: str
    image_id: str = ""
    stopping: bool = False
    # The CPU cgroup a `throttle` fault put the container's processes in, removed when the container ends.
    throttle: throttle_cgroup.Throttle | None = None


class Kubelet:
    def __init__(
        self,
        state: controlplane.State,
        nodes: list[dict[str, Any]],
        root: Path,
        network: podnet.PodNetwork | None = None,
    ) -> None:
        self.state, self.nodes, self.root = state, {n["metadata"]["name"]: n for n in nodes}, root
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {state.tokens['kubelet']}"
        self.lock = threading.RLock()
        self.running: dict[str, Running] = {}
        self.finished: set[str] = set()
        self.network = network
        self.address: containers.Addresses | podnet.PodNetwork = network or containers.Addresses()
        self.api_host = network.host if network else "127.0.0.1"
        # Containers that ended and whose end is not yet on the API server (their node was silent, or the write
        # failed), by uid: reported when the node resumes or the pod is seen again, as a kubelet does on return.
        self.ended: dict[str, tuple[Running, int]] = {}
        self.pods: dict[str, dict[str, Any]] = {}  # every pod bound to one of our nodes, by uid
        self.silent: set[str] = set()
        self.stopped = threading.Event()
        self.images = images.Store()

    # -- the API ------------------------------------------------------------------------------------------

    def api(self, method: str, path: str, body: Any = None, patch: bool = False, **params: Any) -> requests.Response:
        headers = {"Content-Type": "application/merge-patch+json"} if patch else {}
        # `verify` per request: a session's own is overridden by $REQUESTS_CA_BUNDLE where it is set.
        return self.session.request(
            method,
            self.state.server + path,
            data=None if body is None else json.dumps(body),
            params=params,
            headers=headers,
            timeout=30,
            verify=str(self.state.ca),
        )

    # -- nodes --------------------------------------------------------------------------------------------

    def register(self) -> None:
        for name, node in self.nodes.items():
            body = {"apiVersion": "v1", "kind": "Node", "metadata": node["metadata"], "spec": node.get("spec") or {}}
            response = self.api("POST", "/api/v1/nodes", body)
            if response.status_code not in (201, 409):
                raise RuntimeError(f"registering node {name}: {response.status_code} {response.text}")
            self.heartbeat(name)

    def node_status(self, name: str) -> dict[str, Any]:
        now = timestamps.now()
        status = dict(self.nodes[name].get("status") or {})
        status.setdefault("capacity", status.get("allocatable", {}))
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "process kubelet is posting ready status",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        status["conditions"] = [ready]
        status["addresses"] = [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}]
        status["nodeInfo"] = {
            **status.get("nodeInfo", {}),
            "kubeletVersion": "v1.36.3",
            "operatingSystem": "linux",
            "architecture": "amd64",
        }
        return status

    def heartbeat(self, name: str) -> None:
        """Renew the node's Lease and post its Ready condition (the node-lifecycle controller reads either)."""
        now = _micro_now()
        lease = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
        renewed = self.api("PATCH", lease, {"spec": {"renewTime": now, "holderIdentity": name}}, patch=True)
        if renewed.status_code == 404:
            body = {
                "metadata": {"name": name},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": now},
            }
            self.api("POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", body)
        current = self.api("GET", f"/api/v1/nodes/{name}")
        status = self.node_status(name)
        if current.ok:
            before = next(
                (c for c in current.json().get("status", {}).get("conditions") or [] if c["type"] == "Ready"), None
            )
            if before and before.get("status") == "True":
                status["conditions"][0]["lastTransitionTime"] = before["lastTransitionTime"]
        self.api("PATCH", f"/api/v1/nodes/{name}/status", {"status": status}, patch=True)

    def heartbeats(self) -> None:
        while not self.stopped.wait(HEARTBEAT_SECONDS):
            for name in list(self.nodes):
                if name not in self.silent:
                    with contextlib.suppress(requests.RequestException):
                        self.heartbeat(name)

    # -- pods ---------------------------------------------------------------------------------------------

    def watch_pods(self) -> None:
        """List, then watch from the list's resourceVersion; a watch that ends or expires lists again."""
        while not self.stopped.is_set():
            try:
                listed = self.api("GET", "/api/v1/pods")
                listed.raise_for_status()
                body = listed.json()
                seen = {p["metadata"]["uid"]: p for p in body["items"]}
                with self.lock:
                    for uid in [u for u in self.pods if u not in seen]:
                        self.gone(self.pods.pop(uid))
                for pod in seen.values():
                    self.sync(pod)
                self.stream(body["metadata"]["resourceVersion"])
            except (requests.RequestException, ValueError):
                time.sleep(0.5)

    def stream(self, version: str) -> None:
        response = self.session.get(
            self.state.server + "/api/v1/pods",
            params={"watch": "1", "resourceVersion": version, "allowWatchBookmarks": "true", "timeoutSeconds": "300"},
            stream=True,
            timeout=(10, 330),
            verify=str(self.state.ca),
        )
        with response:
            for line in response.iter_lines():
                if self.stopped.is_set():
                    return
                event = json.loads(line)
                if event["type"] == "ERROR":
                    return  # 410 Expired: list again
                if event["type"] == "BOOKMARK":
                    continue
                pod = event["object"]
                if event["type"] == "DELETED":
                    with self.lock:
                        if (known := self.pods.pop(pod["metadata"]["uid"], None)) is not None:
                            self.gone(known)
                else:
                    self.sync(pod)

    def sync(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        if spec.get("nodeName") not in self.nodes:
            return
        uid = meta["uid"]
        with self.lock:
            self.pods[uid] = pod
            running = self.running.get(uid)
            if spec["nodeName"] in self.silent:
                return
            if running is None and uid in self.ended:
                self.report_end(uid)  # and confirms the deletion if one was asked for
                return
            if meta.get("deletionTimestamp"):
                if running is None:
                    self.confirm_deletion(pod)
                elif not running.stopping:
                    self.terminate(running, pod)
                return
            if running is None and uid not in self.finished:
                self.start(pod)
        self.write_hosts_files()

    def gone(self, pod: dict[str, Any]) -> None:
        """A pod object deleted outright (grace 0, or its node deleted): its processes are killed."""
        self.ended.pop(pod["metadata"]["uid"], None)
        running = self.running.get(pod["metadata"]["uid"])
        if running is not None:
            self.signal(running, signal.SIGKILL)

    def confirm_deletion(self, pod: dict[str, Any], tries: int = CONFIRM_TRIES) -> None:
        """Remove a deleted pod whose containers have ended. An API server that does not answer (etcd stopped,
        kube-apiserver restarting) is tried again every few seconds: a pod left Terminating would be an orphan."""
        meta = pod["metadata"]
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        try:
            failed = (
                self.api("DELETE", path, {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}).status_code
                >= 500
            )
        except requests.RequestException:
            failed = True
        if failed and tries > 1 and not self.stopped.is_set():
            retry = threading.Timer(CONFIRM_RETRY_SECONDS, self.confirm_deletion, (pod, tries - 1))
            retry.daemon = True
            retry.start()

    # -- starting -----------------------------------------------------------------------------------------

    def hosts(self, namespace: str) -> str:
        return containers.hosts(namespace, self.pods.values(), self.address)

    def write_hosts_files(self) -> None:
        with self.lock:
            for running in self.running.values():
                containers.rewrite_in_place(running.folder / "hosts", self.hosts(running.namespace))

    def field_values(self, pod: dict[str, Any]) -> dict[str, str]:
        return containers.field_values(pod, self.address(pod["metadata"]["uid"]))

    def env(self, pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
        address = self.address(pod["metadata"]["uid"])
        return containers.environment(pod, container, address, self.state.apiserver_port, api_host=self.api_host)

    def config_map(self, namespace: str, name: str) -> dict[str, str] | None:
        response = self.api("GET", f"/api/v1/namespaces/{namespace}/configmaps/{name}")
        return dict(response.json().get("data") or {}) if response.ok else None

    def token(self, pod: dict[str, Any], source: dict[str, Any]) -> str:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        account = spec.get("serviceAccountName") or "default"
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [source["audience"]] if source.get("audience") else None,
                "expirationSeconds": int(source.get("expirationSeconds") or 3607),
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]},
            },
        }
        path = f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{account}/token"
        response = self.api("POST", path, request)
        response.raise_for_status()
        return str(response.json()["status"]["token"])

    def write_items(self, folder: Path, data: dict[str, str], items: list[dict[str, Any]] | None) -> None:
        for item in items or [{"key": key, "path": key} for key in data]:
            target = folder / item["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(data.get(item["key"], ""))

    def projected(self, pod: dict[str, Any], folder: Path, volume: dict[str, Any]) -> bool:
        namespace = pod["metadata"]["namespace"]
        for source in volume["projected"].get("sources") or []:
            if "serviceAccountToken" in source:
                (folder / source["serviceAccountToken"]["path"]).write_text(
                    self.token(pod, source["serviceAccountToken"])
                )
            elif "configMap" in source:
                data = self.config_map(namespace, source["configMap"]["name"])
                if data is None:
                    return False
                self.write_items(folder, data, source["configMap"].get("items"))
            elif "downwardAPI" in source:
                fields = self.field_values(pod)
                for item in source["downwardAPI"].get("items") or []:
                    (folder / item["path"]).write_text(fields.get(item["fieldRef"]["fieldPath"], ""))
        return True

    def volume_folder(
        self, pod: dict[str, Any], folder: Path, volume: dict[str, Any], fs_group: int | None = None
    ) -> Path | None:
        made = self.make_volume_folder(pod, folder, volume)
        if made is not None and fs_group is not None and "hostPath" not in volume:
            writable = "emptyDir" in volume or "persistentVolumeClaim" in volume
            containers.apply_fs_group(made, fs_group, writable)
        return made

    def make_volume_folder(self, pod: dict[str, Any], folder: Path, volume: dict[str, Any]) -> Path | None:
        namespace = pod["metadata"]["namespace"]
        path = folder / "volumes" / volume["name"]
        if "configMap" in volume:
            data = self.config_map(namespace, volume["configMap"]["name"])
            if data is None:
                return None
            path.mkdir(parents=True, exist_ok=True)
            self.write_items(path, data, volume["configMap"].get("items"))
            return path
        if "projected" in volume:
            path.mkdir(parents=True, exist_ok=True)
            return path if self.projected(pod, path, volume) else None
        return containers.shared_volume_folder(self.root, namespace, volume, path)

    def mounts(
        self, pod: dict[str, Any], container: dict[str, Any], folder: Path, fs_group: int | None = None
    ) -> list[dict[str, Any]] | None:
        volumes = {}
        for volume in (pod.get("spec") or {}).get("volumes") or []:
            made = self.volume_folder(pod, folder, volume, fs_group)
            if made is None:
                return None
            volumes[volume["name"]] = made
        mounts = containers.volume_mounts(container, volumes)
        containers.add_shm(mounts, folder)
        termination = container.get("terminationMessagePath") or "/dev/termination-log"
        (folder / "termination-log").touch()
        (folder / "termination-log").chmod(0o666)  # the container's user writes it
        mounts.append({"source": str(folder / "termination-log"), "target": termination})
        mounts.append({"source": str(folder / "hosts"), "target": "/etc/hosts"})
        return mounts

    def start(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        container = (spec.get("containers") or [{}])[0]
        folder = self.root / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "hosts").write_text(self.hosts(meta["namespace"]))
        try:
            image = self.images.find(container.get("image") or "")
            sandbox = self.sandbox_of_image(pod, container, folder, image) if image else self.sandbox(pod, container)
            fs_group = ((spec.get("securityContext") or {}).get("fsGroup")) if image else None
            mounts = self.mounts(pod, container, folder, fs_group)
        except requests.RequestException as error:
            mounts, why = None, str(error)
        except (ValueError, images.ImageError) as error:
            self.report_waiting(pod, container, "CreateContainerConfigError", str(error))
            return
        else:
            why = "a ConfigMap that a volume names is missing"
        if mounts is None:
            self.report_waiting(pod, container, "CreateContainerConfigError", why)
            return
        sandbox |= {"root": str(folder / "root"), "hostname": spec.get("hostname") or meta["name"], "mounts": mounts}
        (folder / "sandbox.json").write_text(json.dumps(sandbox, indent=1))
        in_network = []
        if self.network is not None:
            try:
                in_network = self.network.enter(meta["uid"], spec["nodeName"], (meta["namespace"], meta["name"]))
            except (subprocess.CalledProcessError, ValueError) as error:
                self.report_waiting(pod, container, "CreatePodSandboxError", f"pod network: {error}")
                return
        with (folder / "container.log").open("ab") as log:
            process = subprocess.Popen(
                [*in_network, *sandbox_program.argv(folder / "sandbox.json")],
                cwd=controlplane.REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        (folder / "pid").write_text(f"{process.pid}\n")  # its process group, for a person who wants to kill it
        running = Running(
            meta["namespace"], meta["name"], meta["uid"], spec["nodeName"], process, folder, container, timestamps.now()
        )
        running.image_id = image.id if image else ""
        self.running[meta["uid"]] = running
        threading.Thread(target=self.wait, args=(running,), daemon=True).start()
        if (container.get("livenessProbe") or {}).get("httpGet"):
            threading.Thread(target=self.probe_liveness, args=(running,), daemon=True).start()
        self.report_running(pod, running)

    def sandbox(self, pod: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
        """A container of an image that is not in the store: the machine's root, the project's venv."""
        return {
            "keep": sorted({str(controlplane.REPO), sys.prefix, sys.base_prefix}),
            "workingDir": container.get("workingDir") or "/",
            "command": container_command(container),
            "env": self.env(pod, container),
        }

    def sandbox_of_image(
        self, pod: dict[str, Any], container: dict[str, Any], folder: Path, image: images.Image
    ) -> dict[str, Any]:
        """A container run from its image's root filesystem, as its image and the pod spec say."""
        who = containers.identity(pod, container, *image.user_ids())
        home = (image.passwd_entry(who.uid) or (0, "/"))[1]
        env = containers.environment(
            pod, container, self.address(pod["metadata"]["uid"]), self.state.apiserver_port, image.env, home,
            self.api_host,
        )  # fmt: skip
        read_only = bool((container.get("securityContext") or {}).get("readOnlyRootFilesystem"))
        return {
            "image": {"rootfs": str(image.rootfs), "upper": str(folder / "upper"), "work": str(folder / "work")},
            "readOnlyRoot": read_only,
            "user": dataclasses.asdict(who),
            "workingDir": container.get("workingDir") or image.working_dir or "/",
            "command": container_command(container, image),
            "env": env,
        }

    # -- probes -------------------------------------------------------------------------------------------

    def probe_liveness(self, running: Running) -> None:
        """httpGet liveness probes at the pod's address: after initialDelaySeconds, every periodSeconds; after
        failureThreshold failures in a row the container is stopped (SIGTERM, then SIGKILL after its grace)."""
        probe = running.container["livenessProbe"]
        get = probe["httpGet"]
        port = get["port"]
        if not str(port).isdigit():
            named = {p.get("name"): p["containerPort"] for p in running.container.get("ports") or []}
            port = named.get(port, port)
        url = f"{get.get('scheme', 'HTTP').lower()}://{self.address(running.uid)}:{port}{get.get('path', '/')}"
        failures = 0
        if self.stopped.wait(float(probe.get("initialDelaySeconds") or 0)):
            return
        while running.process.poll() is None and not running.stopping:
            answer = _http_get(url, float(probe.get("timeoutSeconds") or 1))
            healthy = answer.isdigit() and 200 <= int(answer) < 400
            failures = 0 if healthy else failures + 1
            with (running.folder / "probes.log").open("a") as log:
                log.write(f"{timestamps.now()} liveness {url}: {answer}\n")
            if failures >= int(probe.get("failureThreshold") or 3):
                with self.lock:
                    if (pod := self.pods.get(running.uid)) is not None and not running.stopping:
                        self.terminate(running, pod)
                return
            if self.stopped.wait(float(probe.get("periodSeconds") or 10)):
                return

    # -- reporting ----------------------------------------------------------------------------------------

    def write_status(self, pod: dict[str, Any], status: dict[str, Any]) -> bool:
        """Whether the API server took the report (a 4xx, the pod gone or replaced, is final too)."""
        meta = pod["metadata"]
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status"
        try:
            # The uid precondition keeps a report about a deleted pod off its namesake.
            response = self.api("PATCH", path, {"metadata": {"uid": meta["uid"]}, "status": status}, patch=True)
        except requests.RequestException:
            return False
        return response.status_code < 500

    def report_running(self, pod: dict[str, Any], running: Running) -> None:
        state = {"running": {"startedAt": running.started_at}}
        status = {
            "phase": "Running",
            "podIP": self.address(running.uid),
            "podIPs": [{"ip": self.address(running.uid)}],
            "hostIP": "127.0.0.1",
            "startTime": running.started_at,
            "conditions": containers.conditions(pod, True),
            "containerStatuses": [
                containers.container_status(running.container, state, ready=True, image_id=running.image_id)
            ],
        }
        self.write_status(pod, status)

    def report_waiting(self, pod: dict[str, Any], container: dict[str, Any], reason: str, message: str) -> None:
        state = {"waiting": {"reason": reason, "message": message}}
        status = {
            "phase": "Pending",
            "conditions": containers.conditions(pod, False),
            "containerStatuses": [containers.container_status(container, state, ready=False)],
        }
        self.write_status(pod, status)

    def wait(self, running: Running) -> None:
        code = running.process.wait()
        if self.network is not None:
            self.network.leave(running.uid)
        if running.throttle is not None:
            threading.Thread(target=running.throttle.remove, daemon=True).start()
        with self.lock:
            self.running.pop(running.uid, None)
            self.finished.add(running.uid)
            self.ended[running.uid] = (running, code)
            if running.node not in self.silent:  # a silent node reports it when it resumes
                self.report_end(running.uid)

    def report_end(self, uid: str) -> None:
        """Report an ended container's exit, and confirm its pod's deletion if one was asked for."""
        running, code = self.ended[uid]
        pod = self.pods.get(uid)
        if pod is None:
            self.ended.pop(uid)
            return
        terminated = containers.terminated(code, running.started_at)
        message = (running.folder / "termination-log").read_bytes()[:TERMINATION_MESSAGE_LIMIT]
        if message:
            terminated["message"] = message.decode(errors="replace")
        status = {
            "phase": "Succeeded" if terminated["exitCode"] == 0 else "Failed",
            "conditions": containers.conditions(pod, False),
            "containerStatuses": [
                containers.container_status(
                    running.container, {"terminated": terminated}, ready=False, image_id=running.image_id
                )
            ],
        }
        if self.write_status(pod, status):
            self.ended.pop(uid)  # else the next sight of the pod (a relist) reports it again
        if pod["metadata"].get("deletionTimestamp"):
            self.confirm_deletion(pod)

    # -- stopping -----------------------------------------------------------------------------------------

    def signal(self, running: Running, signum: int) -> None:
        containers.send_signal(running.process.pid, signum)

    def terminate(self, running: Running, pod: dict[str, Any]) -> None:
        """Graceful deletion: SIGTERM now, SIGKILL when the grace period (at most GRACE_CAP_SECONDS) has passed."""
        running.stopping = True
        self.signal(running, signal.SIGTERM)
        grace = containers.grace_seconds(pod, GRACE_CAP_SECONDS)
        timer = threading.Timer(grace, self.signal, (running, signal.SIGKILL))
        timer.daemon = True
        timer.start()

    def stop(self) -> None:
        self.stopped.set()
        with self.lock:
            for running in list(self.running.values()):
                self.signal(running, signal.SIGKILL)
        self.images.close()
        if self.network is not None:
            self.network.close()

    # -- faults -------------------------------------------------------------------------------------------

    def fault(
        self, kind: str, node: str = "", namespace: str = "", pod: str = "", cores: str = "", mbit: str = ""
    ) -> None:
        with self.lock:
            if kind == "silence":  # the node's kubelet stops: no heartbeats, no reports
                self.silent.add(node)
            elif kind == "resume":  # the kubelet is back: what happened to its pods meanwhile is acted on
                self.silent.discard(node)
                for pod in [p for p in self.pods.values() if (p.get("spec") or {}).get("nodeName") == node]:
                    self.sync(pod)
            elif kind == "kill-node":  # the machine is gone: its processes die, and it reports nothing
                self.silent.add(node)
                for running in list(self.running.values()):
                    if running.node == node:
                        self.signal(running, signal.SIGKILL)
            elif kind == "kill-container":  # what the OOM killer or a crash does to a pod's main process
                for running in list(self.running.values()):
                    if (running.namespace, running.name) == (namespace, pod):
                        self.signal(running, signal.SIGKILL)
            elif kind == "throttle":  # a slow device: the pod's processes held to `cores` CPUs by a cgroup quota
                self.throttle(namespace, pod, float(cores or "0.1"))
            elif kind == "slow-link":  # a slow NIC: the node's (or `pod`'s node's) pods' links held to `mbit` Mbit/s
                if self.network is None:
                    raise ValueError("slow-link: this kubelet has no pod network (network_namespaces=True)")
                pods = [(r.uid, r.node, (r.namespace, r.name)) for r in self.running.values()]
                self.network.slow_link(float(mbit), node, (namespace, pod), pods)
            else:
                raise ValueError(f"unknown fault {kind!r}")

    def throttle(self, namespace: str, pod: str, cores: float) -> None:
        """Move the container's processes (the rank processes torchrun starts in sessions of their own included)
        into a CPU cgroup of `cores` CPUs, the one `paralleljob run --throttle-node` makes (a 10 ms quota
        period, so every step is slow). Processes forked later inherit it; two passes catch one forked between."""
        running = next((r for r in self.running.values() if (r.namespace, r.name) == (namespace, pod)), None)
        if running is None:
            raise ValueError(f"throttle: no running container of pod {namespace}/{pod}")
        try:
            made = throttle_cgroup.make(0, cores / (os.cpu_count() or 1), 1, f"kubelet-{running.uid[:8]}")
        except throttle_cgroup.ThrottleError as error:
            raise ValueError(f"throttle: {error}") from None
        for _ in range(2):
            for pid in containers.process_family(running.process.pid):
                with contextlib.suppress(OSError):
                    (made.path / "cgroup.procs").write_text(f"{pid}\n")
        running.throttle = made


def _http_get(url: str, timeout: float) -> str:
    """The status code of a GET, or why there was none."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return str(response.status)
    except urllib.error.HTTPError as error:
        return str(error.code)
    except (OSError, ValueError) as error:
        return f"no answer ({error})"


def _micro_now() -> str:
    """A MicroTime, as Leases hold their renewTime."""
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"


class Faults(http.server.ThreadingHTTPServer):
    """POST /faults/<kind>?node=&namespace=&pod= on loopback: the kubelet's fault switch for tests."""

    def __init__(self, kubelet: Kubelet) -> None:
        self.kubelet = kubelet
        super().__init__(("127.0.0.1", 0), FaultHandler)


class FaultHandler(http.server.BaseHTTPRequestHandler):
    server: Faults

    def do_POST(self) -> None:
        url = urllib.parse.urlparse(self.path)
        params = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
        try:
            self.server.kubelet.fault(url.path.removeprefix("/faults/"), **params)
        except (ValueError, TypeError) as error:
            self.send_response(400)
            self.end_headers()
            self.wfile.write(str(error).encode())
            return
        self.send_response(204)
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        return None


def main(folder: Path) -> None:
    state = controlplane.State.load(folder)
    nodes = json.loads((folder / "nodes.json").read_text())
    config = podnet.read_config(folder)
    network = (
        podnet.PodNetwork(str(config["tag"]), int(str(config["subnet"])), state.apiserver_port) if config else None
    )
    kubelet = Kubelet(state, nodes, folder / "kubelet", network)
    kubelet.register()
    faults = Faults(kubelet)
    (folder / "kubelet-faults-port").write_text(str(faults.server_address[1]))
    signal.signal(signal.SIGTERM, lambda *_: (kubelet.stop(), os._exit(0)))
    threading.Thread(target=faults.serve_forever, daemon=True).start()
    threading.Thread(target=kubelet.heartbeats, daemon=True).start()
    kubelet.watch_pods()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
