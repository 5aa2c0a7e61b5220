"""The local image store the test cluster's kubelet runs containers from: the buildah store that `make images`
fills (`.images/store`, scripts/build-images.sh), read with buildah as a runtime reads its own store.

`Store.find(reference)` answers None for an image that is not in the store (the kubelet then runs the container
from the repository's venv, as before) and otherwise an `Image`: its ID, its root filesystem (a read-only use of
a buildah working container's mount, made once per image and kubelet, which the pod's own overlay sits on) and
the runtime parts of its configuration (entrypoint, command, environment, working directory, user). Nothing is
ever pulled.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import threading
from pathlib import Path

from testcluster import controlplane

FOLDER = Path(os.environ.get("PARALLELJOB_IMAGES_DIR") or controlplane.REPO / ".images")
CONTAINER_PREFIX = "paralleljob-kubelet-"


class ImageError(RuntimeError):
    """The store has the image but it cannot be run; the message says why."""


@dataclasses.dataclass(frozen=True)
class Image:
    reference: str
    id: str
    rootfs: Path
    entrypoint: list[str]
    cmd: list[str]
    env: dict[str, str]
    working_dir: str
    user: str

    def passwd_entry(self, uid: int) -> tuple[int, str] | None:
        """(gid, home) of `uid` in the image's /etc/passwd."""
        passwd = self.rootfs / "etc" / "passwd"
        for line in passwd.read_text().splitlines() if passwd.exists() else []:
            fields = line.split(":")
            if len(fields) >= 6 and fields[2] == str(uid):
                return int(fields[3]), fields[5]
        return None

    def user_ids(self) -> tuple[int | None, int | None]:
        """The image's USER as (uid, gid); numeric ids as written, a name looked up in its /etc/passwd."""
        if not self.user:
            return None, None
        name, _, group = self.user.partition(":")
        uid = int(name) if name.isdigit() else self._uid_of(name)
        gid = int(group) if group.isdigit() else None
        return uid, gid

    def _uid_of(self, name: str) -> int:
        passwd = self.rootfs / "etc" / "passwd"
        for line in passwd.read_text().splitlines() if passwd.exists() else []:
            fields = line.split(":")
            if fields[0] == name:
                return int(fields[2])
        raise ImageError(f"the image's USER {name!r} is not in its /etc/passwd")


def _environment(pairs: list[str]) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in pairs if "=" in pair)


class Store:
    """The buildah store under `folder`; one working container per image, removed by `close`."""

    def __init__(self, folder: Path = FOLDER) -> None:
        self.folder = folder
        self.lock = threading.Lock()
        self.found: dict[str, Image | None] = {}
        self.containers: list[str] = []

    def buildah(self, *args: str) -> subprocess.CompletedProcess[str]:
        driver_file = self.folder / "storage-driver"
        driver = driver_file.read_text().strip() if driver_file.exists() else "overlay"
        store = ["--root", str(self.folder / "store"), "--runroot", str(self.folder / "run")]
        return subprocess.run(
            ["buildah", *store, "--storage-driver", driver, *args],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    def available(self) -> bool:
        return (self.folder / "store").is_dir() and _has_buildah()

    def find(self, reference: str) -> Image | None:
        with self.lock:
            if reference not in self.found:
                self.found[reference] = self._load(reference) if reference and self.available() else None
            return self.found[reference]

    def _load(self, reference: str) -> Image | None:
        inspected = self.buildah("inspect", "--type", "image", reference)
        if inspected.returncode != 0:
            return None  # not in the store: the kubelet's venv path
        details = json.loads(inspected.stdout)
        config = details["OCIv1"].get("config") or {}
        image_id = details["FromImageID"]
        name = f"{CONTAINER_PREFIX}{os.getpid()}-{image_id[:12]}"
        made = self.buildah("from", "--pull-never", "--name", name, image_id)
        if made.returncode != 0:
            raise ImageError(f"buildah from {reference}: {made.stderr.strip()}")
        self.containers.append(name)
        mounted = self.buildah("mount", name)
        if mounted.returncode != 0:
            raise ImageError(f"buildah mount {reference}: {mounted.stderr.strip()}")
        return Image(
            reference=reference,
            id=f"sha256:{image_id}",
            rootfs=Path(mounted.stdout.strip()),
            entrypoint=list(config.get("Entrypoint") or []),
            cmd=list(config.get("Cmd") or []),
            env=_environment(config.get("Env") or []),
            working_dir=config.get("WorkingDir") or "",
            user=config.get("User") or "",
        )

    def close(self) -> None:
        with self.lock:
            for name in self.containers:
                self.buildah("rm", name)
            self.containers.clear()


def _has_buildah() -> bool:
    return any(os.access(Path(folder) / "buildah", os.X_OK) for folder in os.environ.get("PATH", "").split(":"))
