"""What the tests of tests/images share besides their fixtures (those stay in conftest.py): import these from here,
never from a conftest.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from pathlib import Path

import pytest

from testcluster import containers, controlplane, images
from testcluster import sandbox as sandbox_program

REPO = controlplane.REPO


VERSION = re.search(r'^version = "(.+)"$', (REPO / "pyproject.toml").read_text(), re.MULTILINE)[1]  # type: ignore[index]


OPERATOR = f"ghcr.io/paralleljob/operator:{VERSION}"


TRAINER_CPU = f"ghcr.io/paralleljob/trainer:{VERSION}-cpu"


BUILD_HINT = {OPERATOR: "make images-operator", TRAINER_CPU: "make images"}


def built(store: images.Store, reference: str) -> images.Image:
    image = store.find(reference)
    if image is None:
        pytest.fail(f"{reference} is not in {store.folder}/store: run `{BUILD_HINT[reference]}`", pytrace=False)
    return image


@dataclasses.dataclass
class InImage:
    """Runs commands in one image as the kubelet would run its container."""

    image: images.Image
    folder: Path

    def run(
        self,
        command: list[str],
        writable: tuple[str, ...] = (),
        uid: int | None = None,
        read_only_root: bool = True,
        timeout: float = 300,
    ) -> subprocess.CompletedProcess[str]:
        """`command` in a fresh root over the image; `writable` folders are empty folders of their own (emptyDirs)."""
        run = self.folder / f"run-{len(list(self.folder.glob('run-*')))}"
        run.mkdir()
        mounts = []
        for index, target in enumerate(writable):
            source = run / f"empty-{index}"
            source.mkdir(parents=True)
            source.chmod(0o1777)
            mounts.append({"source": str(source), "target": target})
        image_uid, image_gid = self.image.user_ids()
        who = containers.Identity(uid if uid is not None else image_uid or 0, image_gid or 0, (image_gid or 0,))
        spec = {
            "root": str(run / "root"),
            "hostname": "image-test",
            "image": {"rootfs": str(self.image.rootfs), "upper": str(run / "upper"), "work": str(run / "work")},
            "readOnlyRoot": read_only_root,
            "user": dataclasses.asdict(who),
            "mounts": mounts,
            "workingDir": self.image.working_dir or "/",
            "command": command,
            "env": {"PATH": containers.DEFAULT_PATH, "HOME": "/", **self.image.env},
        }
        (run / "sandbox.json").write_text(json.dumps(spec))
        return subprocess.run(
            sandbox_program.argv(run / "sandbox.json"),
            cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip

    def output(self, command: list[str], **options: object) -> str:
        done = self.run(command, **options)  # type: ignore[arg-type]
        assert done.returncode == 0, (
            f"{command} in {self.image.reference}: {done.returncode}\n{done.stdout}{done.stderr}"
        )
        return done.stdout


def locked(*locks: Path) -> dict[str, str]:
    """name -> version of every distribution pinned in the lock files, names normalised as pip freeze does."""
    pins: dict[str, str] = {}
    for lock in locks:
        for name, version in re.findall(r"^([A-Za-z0-9_.-]+)==([^\s;\\]+)", lock.read_text(), flags=re.MULTILINE):
            pins[normalise(name)] = version
    return pins


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def frozen(text: str) -> dict[str, str]:
    """`pip list --format=freeze`'s output as name -> version."""
    pairs = [line.split("==", 1) for line in text.splitlines() if "==" in line]
    return {normalise(name): version for name, version in pairs}
