"""What a kubelet makes of a pod to run its container as local processes, for the test cluster's kubelet
(testcluster/kubelet.py) and the image tests' commands (tests/images/conftest.py): the pod's loopback
address and /etc/hosts, the downward API's field values, the container's environment, its volume mounts list,
its security context (user, groups, read-only root, fsGroup on its volumes), its conditions, and the signals a
runtime sends a container."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import stat
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import psutil

from paralleljob.manifests import timestamps


class Addresses:
    """A loopback address of its own for each pod, by uid: 127.0.1.2, 127.0.1.3, ..."""

    def __init__(self) -> None:
        self._by_uid: dict[str, str] = {}

    def __call__(self, uid: str) -> str:
        if uid not in self._by_uid:
            n = len(self._by_uid)
            self._by_uid[uid] = f"127.0.{1 + n // 250}.{2 + n % 250}"
        return self._by_uid[uid]


def hosts(namespace: str, pods: Iterable[Mapping[str, Any]], address: Callable[[str], str]) -> str:
    """/etc/hosts of a pod in `namespace`: every pod's `<hostname>.<subdomain>` names, as cluster DNS has them."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    for pod in pods:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        if meta.get("namespace") != namespace:
            continue
        hostname = spec.get("hostname") or meta["name"]
        names = [hostname]
        if spec.get("subdomain"):
            sub = f"{hostname}.{spec['subdomain']}"
            names = [f"{sub}.{namespace}.svc.cluster.local", f"{sub}.{namespace}.svc", sub, hostname]
        lines.append(f"{address(meta['uid'])}\t{' '.join(names)}")
    return "\n".join(lines) + "\n"


def rewrite_in_place(path: Path, text: str) -> None:
    """Replace a file's text keeping its inode: a pod's bind mount of it sees the change."""
    if path.read_text() != text:
        with path.open("r+") as out:
            out.seek(0)
            out.write(text)
            out.truncate()


def field_values(pod: Mapping[str, Any], address: str) -> dict[str, str]:
    """The downward API's fieldRef values of a pod."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    fields = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta.get("namespace") or "",
        "metadata.uid": meta["uid"],
        "spec.nodeName": spec.get("nodeName") or "",
        "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
        "status.podIP": address,
        "status.hostIP": "127.0.0.1",
    }
    for kind in ("labels", "annotations"):
        for name, value in (meta.get(kind) or {}).items():
            fields[f"metadata.{kind}['{name}']"] = value
    return fields


DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def environment(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    address: str,
    api_port: int,
    image_env: Mapping[str, str] | None = None,
    home: str = "/root",
    api_host: str = "127.0.0.1",
) -> dict[str, str]:
    """The container's environment: the image's own (`image_env`, with the runtime's PATH and `home` where it sets
    none), or without an image the project's venv first on PATH; the API server's address (`api_host`, where the
    pod reaches it) as the `kubernetes` Service's; then the container's own values and fieldRefs."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    fields = field_values(pod, address)
    base = (
        {"PATH": DEFAULT_PATH, "HOME": home, **image_env}
        if image_env is not None
        else {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": home, **_checkout_path()}
    )
    env = {
        **base,
        "HOSTNAME": spec.get("hostname") or meta["name"],
        "KUBERNETES_SERVICE_HOST": api_host,
        "KUBERNETES_SERVICE_PORT": str(api_port),
    }
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = str(item["value"])
        elif ref := ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath"):
            env[item["name"]] = fields.get(ref, "")
    return env


def _checkout_path() -> dict[str, str]:
    """The test's PYTHONPATH, where it sets one: a worktree's checkout first, ahead of the venv's editable install
    of another checkout, so that venv-run pods run the code under test (docs: running tests from a worktree)."""
    found = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": found} if found else {}


def volume_mounts(container: Mapping[str, Any], volumes: Mapping[str, Path]) -> list[dict[str, Any]]:
    """The container's volumeMounts as the sandbox takes them, from each volume's folder."""
    return [
        {
            "source": str(volumes[m["name"]] / m.get("subPath", "")),
            "target": m["mountPath"],
            "readOnly": bool(m.get("readOnly")),
        }
        for m in container.get("volumeMounts") or []
    ]


@dataclasses.dataclass(frozen=True)
class Identity:
    """Who a container's process runs as: its uid, gid and supplementary groups (fsGroup among them)."""

    uid: int
    gid: int
    groups: tuple[int, ...]


def security_setting(pod: Mapping[str, Any], container: Mapping[str, Any], name: str) -> Any:
    """A securityContext field: the container's, else the pod's (for the fields both have)."""
    own = (container.get("securityContext") or {}).get(name)
    return own if own is not None else ((pod.get("spec") or {}).get("securityContext") or {}).get(name)


def identity(
    pod: Mapping[str, Any], container: Mapping[str, Any], image_uid: int | None, image_gid: int | None
) -> Identity:
    """runAsUser and runAsGroup over the image's USER (root where it names none), with fsGroup and
    supplementalGroups as supplementary groups. Raises ValueError, as the kubelet refuses to start the container,
    when runAsNonRoot is set and the process would run as root."""
    uid = security_setting(pod, container, "runAsUser")
    uid = int(uid if uid is not None else image_uid or 0)
    gid = security_setting(pod, container, "runAsGroup")
    gid = int(gid if gid is not None else image_gid or 0)
    if security_setting(pod, container, "runAsNonRoot") and uid == 0:
        raise ValueError("container has runAsNonRoot and image will run as root")
    pod_context = (pod.get("spec") or {}).get("securityContext") or {}
    extra = [pod_context["fsGroup"]] if pod_context.get("fsGroup") is not None else []
    extra += pod_context.get("supplementalGroups") or []
    return Identity(uid, gid, tuple(dict.fromkeys(int(g) for g in [gid, *extra])))


def apply_fs_group(folder: Path, group: int, writable: bool) -> None:
    """What the kubelet does to a volume for a pod's fsGroup: the group owns every file, may read them (and
    write them, for a writable volume), and new files inherit the group (setgid folders)."""
    for path in [folder, *folder.rglob("*")]:
        if path.is_symlink():
            continue
        os.chown(path, -1, group)
        mode = path.stat().st_mode
        extra = stat.S_IRGRP | (stat.S_IWGRP if writable else 0)
        if path.is_dir():
            extra |= stat.S_IXGRP | stat.S_ISGID
        os.chmod(path, mode | extra)


def conditions(pod: Mapping[str, Any], ready: bool, now: str | None = None) -> list[dict[str, Any]]:
    """The pod's conditions; one whose status is unchanged keeps its lastTransitionTime (PodScheduled's is the
    binding's), as the real kubelet's do."""
    now, value = now or timestamps.now(), "True" if ready else "False"
    before = {c.get("type"): c for c in (pod.get("status") or {}).get("conditions") or []}
    wanted = {"PodScheduled": "True", "Initialized": "True", "ContainersReady": value, "Ready": value}
    return [
        {"type": kind, "status": status, "lastTransitionTime": now}
        if (before.get(kind) or {}).get("status") != status or not before[kind].get("lastTransitionTime")
        else {"type": kind, "status": status, "lastTransitionTime": before[kind]["lastTransitionTime"]}
        for kind, status in wanted.items()
    ]


def container_status(
    container: Mapping[str, Any], state: dict[str, Any], *, ready: bool, image_id: str = ""
) -> dict[str, Any]:
    return {
        "name": container.get("name", ""),
        "image": container.get("image", ""),
        "imageID": image_id,
        "ready": ready,
        "started": "running" in state,
        "restartCount": 0,
        "state": state,
    }


def process_family(pid: int) -> list[int]:
    """The container's process and every process it started, however deep (torchrun's ranks included)."""
    try:
        return [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


def send_signal(pid: int, signum: int) -> None:
    """SIGTERM to the container's process group (torchrun passes it on to its ranks); SIGKILL to every process
    the container started, as a runtime kills a container's cgroup (torchrun starts each rank in a session of
    its own, out of the group's reach)."""
    family = []
    if signum == signal.SIGKILL:
        with contextlib.suppress(psutil.NoSuchProcess):
            family = psutil.Process(pid).children(recursive=True)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signum)
    for process in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


def shared_volume_folder(root: Path, namespace: str, volume: Mapping[str, Any], own: Path) -> Path:
    """The folder a pod's volume lives in: a claim's and a host path's under `root`, shared by the pods that
    name them; any other (emptyDir) the pod's `own` folder. Made if missing."""
    if "persistentVolumeClaim" in volume:
        own = root / "pvc" / namespace / volume["persistentVolumeClaim"]["claimName"]
    elif "hostPath" in volume:
        own = root / "host" / volume["hostPath"]["path"].lstrip("/")
    own.mkdir(parents=True, exist_ok=True)
    return own


def terminated(code: int, started_at: str | None) -> dict[str, Any]:
    """A container's `terminated` state for a process that ended with `code` (negative: killed by a signal)."""
    exit_code = 128 - code if code < 0 else code  # killed by a signal: 128 + its number
    return {
        "exitCode": exit_code,
        "reason": "Completed" if exit_code == 0 else "Error",
        "startedAt": started_at,
        "finishedAt": timestamps.now(),
    }


def grace_seconds(pod: Mapping[str, Any], cap: float) -> float:
    """How long a deleted pod's processes get between SIGTERM and SIGKILL: its grace period, at most `cap`."""
    return min(float(pod["metadata"].get("deletionGracePeriodSeconds") or 30), cap)


def add_shm(mounts: list[dict[str, Any]], folder: Path) -> None:
    """Give the container a writable /dev/shm of its own (`folder`/shm, mode 1777) unless a volume is mounted
    there."""
    if not any(mount["target"] == "/dev/shm" for mount in mounts):
        (folder / "shm").mkdir(exist_ok=True)
        (folder / "shm").chmod(0o1777)
        mounts.append({"source": str(folder / "shm"), "target": "/dev/shm"})
