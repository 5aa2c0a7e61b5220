"""Kubelets for the strict cluster.

The phase-only kubelet is the API server's own: tests set pod phases themselves, and a deleted pod on a node goes
after `termination_seconds` (see `apiserver`). The fast tests use it.

`ProcessKubelet`, opt-in per test (`components=[functools.partial(ProcessKubelet, root=tmp_path)]`), runs every
pod bound to a node as local processes, the way a kubelet runs containers:
- the container's command and args, with the project's venv first on PATH (the image name is ignored) and the
  pod's environment (values and the downward API's fieldRefs), `KUBERNETES_SERVICE_HOST`/`_PORT` pointing at
  the API server;
- in its own mount and UTS namespace (`tests.cluster.sandbox`): ConfigMap volumes as files, emptyDir and
  /dev/shm as private folders, a folder per PersistentVolumeClaim shared by the pods that mount it, hostPath
  as a folder under the kubelet's root, the ServiceAccount token, CA and namespace where the Kubernetes client
  looks for them, and an /etc/hosts mapping every pod's `<hostname>.<subdomain>` to its own loopback address;
- it reports phase, containerStatuses (exit codes and reasons) and Ready, honours graceful deletion (SIGTERM,
  the grace period, SIGKILL, then the pod object goes), and simulates faults (see `faults`).
Pods use restartPolicy Never semantics: a container that exits ends the pod.
"""

from __future__ import annotations

import asyncio
import copy
import json
import signal
import sys
from pathlib import Path
from typing import Any

from paralleljob.k8s import timestamps
from tests.cluster import apiserver, containers
from tests.cluster import sandbox as sandbox_program

SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
# The longest a test waits for a pod's processes to exit after SIGTERM (its own grace period may be longer).
GRACE_CAP_SECONDS = 10.0


class PodProcess:
    """One pod's running container (its first), and what the kubelet knows about it."""

    def __init__(self, key: Any, uid: str, node: str, process: asyncio.subprocess.Process, folder: Path) -> None:
        self.key, self.uid, self.node, self.process, self.folder = key, uid, node, process, folder
        self.started_at = timestamps.now()
        self.stopping = False
        self.waiter: asyncio.Task[None] | None = None


class ProcessKubelet(apiserver.Controller):
    plurals = frozenset({"pods", "configmaps"})

    def __init__(self, server: apiserver.APIServer, *, root: Path, grace_cap: float = GRACE_CAP_SECONDS) -> None:
        super().__init__(server)
        self.root, self.grace_cap = root, grace_cap
        self.running: dict[str, PodProcess] = {}  # by pod uid
        self.finished: set[str] = set()
        # Pods that cannot start, by uid: why (an image pull error stays; a missing ConfigMap is retried).
        self.blocked: dict[str, str] = {}
        self.address = containers.Addresses()
        # Faults: images that fail to pull, nodes whose kubelet stopped or whose machine is gone.
        self.pull_errors: set[str] = set()
        # Seconds between tries of a failing pull, doubled each time up to `pull_backoff_cap`, as the
        # kubelet's image backoff does (10 s up to 300 s; shorter here): ErrImagePull, ImagePullBackOff, again.
        self.pull_backoff, self.pull_backoff_cap = 0.2, 2.0
        self._pull_tries: dict[str, int] = {}
        self.silent_nodes: set[str] = set()
        server.kubelet_confirms_deletion = True

    def _changed(self, plural: str) -> None:
        if plural == "configmaps":
            for uid in [u for u, reason in self.blocked.items() if reason == "CreateContainerConfigError"]:
                del self.blocked[uid]
        super()._changed(plural)

    def stop(self) -> None:
        super().stop()
        for pod in self.running.values():
            self._signal(pod, signal.SIGKILL)

    # -- the sync loop -----------------------------------------------------------------------------------

    async def sync(self) -> None:
        pods = {p["metadata"]["uid"]: p for p in self.server.live_objects("pods")}
        for uid, pod in list(self.running.items()):
            if uid not in pods:
                self._signal(pod, signal.SIGKILL)  # force-deleted: the object went first
            elif pods[uid]["metadata"].get("deletionTimestamp") and not pod.stopping:
                self._terminate(pod, pods[uid])
        self._write_hosts_files(pods.values())
        for uid, pod in pods.items():
            node = (pod.get("spec") or {}).get("nodeName")
            if not node or node in self.silent_nodes or uid in self.running:
                continue
            if pod["metadata"].get("deletionTimestamp"):
                # Its containers have exited (or never started): the kubelet confirms the deletion at once.
                await self.server.finish_termination(self._key(pod), locked=True)
                continue
            if uid in self.finished or uid in self.blocked:
                continue
            await self._start(pod)

    def _key(self, pod: dict[str, Any]) -> Any:
        return self.server.key_of("pods", pod["metadata"].get("namespace") or "", pod["metadata"]["name"])

    # -- starting --------------------------------------------------------------------------------------------

    def _write_hosts_files(self, pods: Any) -> None:
        pods = list(pods)
        for running in self.running.values():
            text = containers.hosts(running.key[1] or "", pods, self.address)
            containers.rewrite_in_place(running.folder / "hosts", text)

    def _env(self, pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
        return containers.environment(pod, container, self.address(pod["metadata"]["uid"]), self.server_port)

    @property
    def server_port(self) -> int:
        return int(self.server.port)

    def _volume_folder(self, pod: dict[str, Any], folder: Path, volume: dict[str, Any]) -> Path | None:
        namespace = pod["metadata"].get("namespace") or ""
        path = folder / "volumes" / volume["name"]
        if "configMap" in volume:
            source = self.server.lookup("configmaps", namespace, volume["configMap"]["name"])
            if source is None:
                return None
            path.mkdir(parents=True, exist_ok=True)
            items = volume["configMap"].get("items") or [{"key": k, "path": k} for k in source.get("data") or {}]
            for item in items:
                (path / item["path"]).write_text((source.get("data") or {}).get(item["key"], ""))
            return path
        return containers.shared_volume_folder(self.root, namespace, volume, path)

    def _service_account_folder(self, pod: dict[str, Any], folder: Path) -> Path:
        namespace = pod["metadata"].get("namespace") or ""
        account = (pod.get("spec") or {}).get("serviceAccountName") or "default"
        path = folder / "serviceaccount"
        path.mkdir(parents=True, exist_ok=True)
        (path / "token").write_text(self.server.tokens.mint(namespace, account))
        (path / "namespace").write_text(namespace)
        (path / "ca.crt").write_bytes(self.server_ca.read_bytes())
        return path

    @property
    def server_ca(self) -> Path:
        from tests.cluster import certificates

        return certificates.serving_certificates().ca

    def _mounts(self, pod: dict[str, Any], container: dict[str, Any], folder: Path) -> list[dict[str, Any]] | None:
        spec = pod.get("spec") or {}
        volumes = {}
        for volume in spec.get("volumes") or []:
            made = self._volume_folder(pod, folder, volume)
            if made is None:
                return None
            volumes[volume["name"]] = made
        mounts = containers.volume_mounts(container, volumes)
        containers.add_shm(mounts, folder)
        if spec.get("automountServiceAccountToken", True):
            mounts.append(
                {
                    "source": str(self._service_account_folder(pod, folder)),
                    "target": SERVICE_ACCOUNT_MOUNT,
                    "readOnly": True,
                }
            )
        mounts.append({"source": str(folder / "hosts"), "target": "/etc/hosts"})
        return mounts

    async def _start(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        container = (spec.get("containers") or [{}])[0]
        key = self._key(pod)
        if container.get("image") in self.pull_errors:
            await self._pull_failed(key, pod, container)
            return
        folder = self.root / "pods" / f"{meta.get('namespace')}_{meta['name']}_{meta['uid'][:8]}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "hosts").write_text(
            containers.hosts(meta.get("namespace") or "", self.server.live_objects("pods"), self.address)
        )
        mounts = self._mounts(pod, container, folder)
        if mounts is None:
            await self._waiting(
                key, pod, container, "CreateContainerConfigError", "a ConfigMap volume's ConfigMap is missing"
            )
            return
        command = [*(container.get("command") or []), *(container.get("args") or [])]
        sandbox = {
            "root": str(folder / "root"),
            "hostname": spec.get("hostname") or meta["name"],
            "mounts": mounts,
            "keep": sorted({str(apiserver.REPO), sys.prefix, sys.base_prefix}),
            "workingDir": container.get("workingDir") or "/",
            "command": command,
            "env": self._env(pod, container),
        }
        (folder / "sandbox.json").write_text(json.dumps(sandbox, indent=1))
        log = (folder / "container.log").open("ab")
        process = await asyncio.create_subprocess_exec(
            *sandbox_program.argv(folder / "sandbox.json"),
            cwd=apiserver.REPO, stdout=log, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        log.close()
        (folder / "pid").write_text(f"{process.pid}\n")  # its process group, for a person who wants to kill it
        running = PodProcess(key, meta["uid"], spec["nodeName"], process, folder)
        self.running[meta["uid"]] = running
        running.waiter = asyncio.create_task(self._wait(running, container))
        await self._report_running(key, pod, container, running)

    # -- reporting ---------------------------------------------------------------------------------------

    def _conditions(self, pod: dict[str, Any], ready: bool) -> list[dict[str, Any]]:
        return containers.conditions(pod, ready, self.server.now())

    async def _write_status(self, key: Any, pod: dict[str, Any], status: dict[str, Any]) -> None:
        current = self.server.lookup("pods", key[1] or "", key[2])
        if current is None or current["metadata"]["uid"] != pod["metadata"]["uid"]:
            return
        updated = copy.deepcopy(current)
        updated["status"] = {**(current.get("status") or {}), **status}
        await self.server.replace_stored(key, updated)

    async def _report_running(
        self, key: Any, pod: dict[str, Any], container: dict[str, Any], running: PodProcess
    ) -> None:
        state = {"running": {"startedAt": running.started_at}}
        status = {
            "phase": "Running",
            "podIP": self.address(pod["metadata"]["uid"]),
            "hostIP": "127.0.0.1",
            "startTime": running.started_at,
            "conditions": self._conditions(pod, True),
            "containerStatuses": [self._container_status(container, state, ready=True)],
        }
        await self._write_status(key, pod, status)

    def _container_status(self, container: dict[str, Any], state: dict[str, Any], *, ready: bool) -> dict[str, Any]:
        return containers.container_status(container, state, ready=ready)

    async def _pull_failed(self, key: Any, pod: dict[str, Any], container: dict[str, Any]) -> None:
        """ErrImagePull now, ImagePullBackOff while waiting out the backoff, then another try."""
        uid = pod["metadata"]["uid"]
        tries = self._pull_tries[uid] = self._pull_tries.get(uid, 0) + 1
        image = container["image"]
        await self._waiting(key, pod, container, "ErrImagePull", f'Failed to pull image "{image}": not found')
        wait = min(self.pull_backoff * 2 ** (tries - 1), self.pull_backoff_cap)
        loop = asyncio.get_running_loop()

        async def back_off() -> None:
            async with self.server._lock:
                current = self.server.lookup("pods", key[1] or "", key[2])
                if current is None or current["metadata"]["uid"] != uid:
                    return
                said = f'Back-off pulling image "{image}"'
                await self._waiting(key, current, container, "ImagePullBackOff", said)
            loop.call_later(wait, retry)

        def retry() -> None:
            self.blocked.pop(uid, None)  # the next sync tries the pull again
            self._wake.set()

        loop.call_later(wait / 2, lambda: loop.create_task(back_off()))

    async def _waiting(
        self, key: Any, pod: dict[str, Any], container: dict[str, Any], reason: str, message: str
    ) -> None:
        self.blocked[pod["metadata"]["uid"]] = reason
        state = {"waiting": {"reason": reason, "message": message}}
        status = {
            "phase": "Pending",
            "conditions": self._conditions(pod, False),
            "containerStatuses": [self._container_status(container, state, ready=False)],
        }
        await self._write_status(key, pod, status)

    async def _wait(self, running: PodProcess, container: dict[str, Any]) -> None:
        code = await running.process.wait()
        async with self.server._lock:
            self.running.pop(running.uid, None)
            self.finished.add(running.uid)
            if running.node in self.silent_nodes:
                return  # a lost node reports nothing
            pod = self.server.lookup("pods", running.key[1] or "", running.key[2])
            if pod is None or pod["metadata"]["uid"] != running.uid:
                return
            terminated = containers.terminated(code, running.started_at)
            exit_code = terminated["exitCode"]
            status = {
                "phase": "Succeeded" if exit_code == 0 else "Failed",
                "conditions": self._conditions(pod, False),
                "containerStatuses": [self._container_status(container, {"terminated": terminated}, ready=False)],
            }
            await self._write_status(running.key, pod, status)
            if pod["metadata"].get("deletionTimestamp"):
                await self.server.finish_termination(running.key, locked=True)

    # -- stopping ----------------------------------------------------------------------------------------

    def _signal(self, pod: PodProcess, signum: int) -> None:
        containers.send_signal(pod.process.pid, signum)

    def _terminate(self, running: PodProcess, pod: dict[str, Any]) -> None:
        """Graceful deletion: SIGTERM now, SIGKILL when the grace period (at most `grace_cap`) has passed."""
        running.stopping = True
        self._signal(running, signal.SIGTERM)
        grace = containers.grace_seconds(pod, self.grace_cap)
        asyncio.get_running_loop().call_later(grace, self._signal, running, signal.SIGKILL)

    # -- faults ------------------------------------------------------------------------------------------

    def kill_processes_of(self, node: str) -> None:
        for running in list(self.running.values()):
            if running.node == node:
                self._signal(running, signal.SIGKILL)

    def kill_container(self, namespace: str, pod: str) -> None:
        """What the OOM killer or a crash does to a pod's main process: SIGKILL, then it is reported Failed."""
        for running in self.running.values():
            if running.key[1:] == (namespace, pod):
                self._signal(running, signal.SIGKILL)
