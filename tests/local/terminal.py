"""A newcomer's terminal: `paralleljob` from the repository's venv, run without that venv activated."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
VENV_BIN = pathlib.Path(sys.executable).parent


def without_the_venv_on_path() -> dict[str, str]:
    """The environment of a terminal where the venv was never activated."""
    folders = [folder for folder in os.environ.get("PATH", os.defpath).split(os.pathsep) if folder != str(VENV_BIN)]
    env = {key: value for key, value in os.environ.items() if key != "VIRTUAL_ENV"}
    return {**env, "PATH": os.pathsep.join(folders)}


def run_without_the_venv(job: pathlib.Path, output: pathlib.Path) -> subprocess.CompletedProcess[str]:
    """`.venv/bin/paralleljob run JOB` from the repository root, in a terminal without the venv activated."""
    return subprocess.run(
        [str(VENV_BIN / "paralleljob"), "run", str(job), "--output", str(output)],
        cwd=ROOT,
        env=without_the_venv_on_path(),
        capture_output=True,
        text=True,
        timeout=300,
    )
