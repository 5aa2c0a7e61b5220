"""A pod's filesystem view, built inside its own mount (and UTS) namespace, then its container's command.

The test cluster's kubelet (testcluster/kubelet.py) runs `unshare --mount --uts --propagation private python -m
testcluster.sandbox SPEC`. Inside, this module makes a tmpfs root that mirrors the machine's top-level folders
by bind mounts, mounts each volume at its real `mountPath` (a folder of the machine is never written: a folder
that needs a new mount point is shadowed by a tmpfs that re-binds its children), sets the pod's hostname,
chroots and execs the command. Nothing done here is visible outside the pod's namespace.

SPEC is a JSON file: {"root", "hostname", "mounts": [{"source", "target", "readOnly"}], "keep", "workingDir",
"command", "env"}. `keep` names the machine's folders the command itself needs (the repository and the Python
environment it runs from): a volume mounted over one of their parents (an emptyDir at /tmp, with the checkout in
/tmp) would hide them, so they are bound back in, inside that volume.

A container whose image is in the local store (testcluster/images.py) adds {"image": {"rootfs", "upper",
"work"}, "readOnlyRoot", "user": {"uid", "gid", "groups"}}: its root is then an overlay of the pod's own on the
image's root filesystem (mount points are made in the pod's upper folder) with the machine's /dev, /proc and /sys,
remounted read-only for readOnlyRootFilesystem once the volumes are in; the command runs as that user and groups.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC = 1, 32, 4096, 16384
SKIPPED_TOP_LEVEL = {"lost+found"}
# What an image's root gets from the machine, as a runtime gives a container /dev, /proc and /sys.
FROM_THE_MACHINE = ("/dev", "/proc", "/sys")
_libc = ctypes.CDLL(None, use_errno=True)


def argv(spec_file: Path) -> list[str]:
    """The command line that runs SPEC in a sandbox of its own: what a kubelet (or a test) starts."""
    return [
        "unshare",
        "--mount",
        "--uts",
        "--propagation",
        "private",
        sys.executable,
        "-m",
        "testcluster.sandbox",
        str(spec_file),
    ]


def mount(source: str, target: str, fstype: str | None = None, flags: int = 0, data: str | None = None) -> None:
    result = _libc.mount(
        source.encode(), target.encode(), fstype.encode() if fstype else None, flags, data.encode() if data else None
    )
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"mount {source} on {target}: {os.strerror(error)}")


def mirror(host: Path, inside: Path) -> None:
    """Make `inside` show `host` (a folder, a file or a symlink), by a bind mount or a copy of the link."""
    if host.is_symlink():
        inside.symlink_to(os.readlink(host))
    elif host.is_dir():
        inside.mkdir(exist_ok=True)
        mount(str(host), str(inside), flags=MS_BIND | MS_REC)
    elif host.exists():
        inside.touch()
        mount(str(host), str(inside), flags=MS_BIND)


def make_root(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    mount("tmpfs", str(root), "tmpfs", 0, "mode=755")
    for entry in sorted(Path("/").iterdir()):
        if entry.name not in SKIPPED_TOP_LEVEL:
            mirror(entry, root / entry.name)


def make_image_root(root: Path, image: dict[str, str]) -> None:
    """The pod's root: an overlay on the image's root filesystem, its writes in the pod's own folder."""
    for folder in (root, Path(image["upper"]), Path(image["work"])):
        folder.mkdir(parents=True, exist_ok=True)
    options = f"lowerdir={image['rootfs']},upperdir={image['upper']},workdir={image['work']}"
    mount("overlay", str(root), "overlay", 0, options)
    for folder in FROM_THE_MACHINE:
        mirror(Path(folder), root / folder.lstrip("/"))


def shadow(root: Path, folder: str) -> None:
    """Let new mount points be made in `folder` (a bind of the machine's folder) without writing to the
    machine: a tmpfs over it, with each of the machine's entries bound back in."""
    inside = root / folder.lstrip("/")
    entries = sorted(Path(folder).iterdir()) if Path(folder).is_dir() else []
    mount("tmpfs", str(inside), "tmpfs", 0, "mode=755")
    for entry in entries:
        mirror(entry, inside / entry.name)


def resolve(root: Path, path: str) -> str:
    """`path` as the pod sees it, with symlinks inside the pod's root followed."""
    resolved = "/"
    for part in [p for p in path.split("/") if p]:
        candidate = os.path.join(resolved, part)
        inside = root / candidate.lstrip("/")
        if inside.is_symlink():
            target = os.readlink(inside)
            candidate = resolve(root, target if target.startswith("/") else os.path.join(resolved, target))
        resolved = os.path.normpath(candidate)
    return resolved


def mount_point(root: Path, target: str, is_dir: bool, shadowed: set[str], machine: tuple[str, ...] = ("/",)) -> Path:
    """The mount point for `target` inside the root, made without touching the machine's folders (those within
    `machine`, bound from the machine; the rest of an image's root is the pod's own)."""
    path = resolve(root, target)
    parts = [p for p in path.split("/") if p]
    current = "/"
    for index, part in enumerate(parts):
        following = os.path.join(current, part)
        inside = root / following.lstrip("/")
        if not inside.exists():
            bound = any(within(current, folder) for folder in machine)
            if current != "/" and current not in shadowed and bound:
                shadow(root, current)
                shadowed.add(current)
            last = index == len(parts) - 1
            if last and not is_dir:
                inside.touch()
            else:
                inside.mkdir()
            if current != "/":
                shadowed.add(following)  # made on a tmpfs: deeper folders need no shadow
        current = following
    return root / path.lstrip("/")


def enter(spec: dict[str, Any]) -> None:
    root, image = Path(spec["root"]), spec.get("image")
    if image:
        make_image_root(root, image)
    else:
        make_root(root)
    machine = FROM_THE_MACHINE if image else ("/",)
    shadowed: set[str] = set()
    for item in spec["mounts"]:
        source = Path(item["source"])
        target = mount_point(root, item["target"], source.is_dir(), shadowed, machine)
        mount(str(source), str(target), flags=MS_BIND | MS_REC)
        if item.get("readOnly"):
            mount(str(source), str(target), flags=MS_BIND | MS_REMOUNT | MS_RDONLY)
    working_dir = spec.get("workingDir") or "/"
    if image:
        # A working directory the image lacks is made, as runtimes do, before the root turns read-only.
        mount_point(root, working_dir, True, shadowed, machine)
        if spec.get("readOnlyRoot"):
            mount(str(root), str(root), flags=MS_BIND | MS_REMOUNT | MS_RDONLY)
    else:
        keep_visible(root, spec.get("keep") or [], spec["mounts"])
    socket.sethostname(spec["hostname"])
    os.chroot(root)
    become(spec.get("user"))
    os.chdir(working_dir)


def become(user: dict[str, Any] | None) -> None:
    """Drop to the container's user and groups (root keeps running as root)."""
    if user is None:
        return
    os.setgroups(user["groups"])
    os.setgid(user["gid"])
    os.setuid(user["uid"])


def within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def keep_visible(root: Path, keep: list[str], mounts: list[dict[str, Any]]) -> None:
    """Bind each `keep` folder back where a volume mounted over its parent hides it (a mount point made in the
    volume's own folder, which belongs to the pod)."""
    for folder in keep:
        covering = [m for m in mounts if within(folder, m["target"]) and Path(m["source"]).is_dir()]
        if not covering:
            continue
        volume = max(covering, key=lambda m: len(m["target"]))
        (Path(volume["source"]) / os.path.relpath(folder, volume["target"])).mkdir(parents=True, exist_ok=True)
        mount(folder, str(root / folder.lstrip("/")), flags=MS_BIND | MS_REC)


def main(argv: list[str]) -> None:
    spec = json.loads(Path(argv[1]).read_text())
    enter(spec)
    command = spec["command"]
    os.execvpe(command[0], command, spec["env"])


if __name__ == "__main__":
    main(sys.argv)
