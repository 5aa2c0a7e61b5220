"""scripts/install-k8s-tools.sh, the step of `make test` that installs helm and kubectl, with stand-in binaries.

The stand-ins are installed where the script looks (TOOLS_DIR/bin) so that it finds the tools present and only
checks and prints their versions: the part that runs on every CI machine.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "install-k8s-tools.sh"

FAKE_HELM = """#!/bin/sh
case "$*" in
  *--template*) printf 'v4.1.4' ;;
  *) echo 'v4.1.4+gfake' ;;
esac
"""

# A real kubectl prints its client version and then more lines (Kustomize); this one prints far more than a pipe
# holds, so a reader that stops after the first line makes it die of SIGPIPE, as kubectl did on CI.
FAKE_KUBECTL = """#!/bin/sh
echo 'Client Version: v1.34.5'
seq 1 200000
"""


def install_fake_tools(tools_dir: pathlib.Path) -> None:
    bin_dir = tools_dir / "bin"
    bin_dir.mkdir(parents=True)
    for name, text in (("helm", FAKE_HELM), ("kubectl", FAKE_KUBECTL)):
        path = bin_dir / name
        path.write_text(text)
        path.chmod(0o755)


def test_present_tools_pass_however_much_kubectl_prints(tmp_path: pathlib.Path) -> None:
    install_fake_tools(tmp_path)
    done = subprocess.run(
        ["bash", str(SCRIPT)],
        env={"TOOLS_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["v4.1.4+gfake", "Client Version: v1.34.5"]
    assert "already installed" in done.stderr


def test_a_helm_of_another_version_is_not_taken_as_installed(tmp_path: pathlib.Path) -> None:
    install_fake_tools(tmp_path)
    (tmp_path / "bin" / "helm").write_text("#!/bin/sh\nprintf 'v3.0.0'\n")
    # On a PATH that holds only what the script runs before installing (dirname), the reinstall stops at once for
    # want of npm, which shows that the version check refused the tool.
    only_dirname = tmp_path / "path"
    only_dirname.mkdir()
    os.symlink(shutil.which("dirname") or "/usr/bin/dirname", only_dirname / "dirname")
    done = subprocess.run(
        [shutil.which("bash") or "/bin/bash", str(SCRIPT)],
        env={"TOOLS_DIR": str(tmp_path), "PATH": str(only_dirname)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "npm is required" in done.stderr
