"""`kubectl paralleljob ...` works as a kubectl plugin: kubectl finds the installed `kubectl-paralleljob`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.chart.helpers import REPO, tool


def kubectl_with_plugin(*args: str) -> subprocess.CompletedProcess[str]:
    venv_bin = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([tool("kubectl"), *args], capture_output=True, text=True, env=env, timeout=60, cwd=REPO)


def test_kubectl_lists_the_plugin() -> None:
    listed = kubectl_with_plugin("plugin", "list")
    assert "kubectl-paralleljob" in listed.stdout


def test_kubectl_paralleljob_validate_runs_the_validator() -> None:
    ok = kubectl_with_plugin("paralleljob", "validate", "examples/quickstart.yaml")
    assert ok.returncode == 0 and "quickstart: valid, layout 2x2x2" in ok.stdout
    bad = kubectl_with_plugin("paralleljob", "validate", "examples/deepspeed-zero2-pipeline.yaml")
    assert bad.returncode == 1 and "incompatible with pipeline parallelism" in bad.stdout
