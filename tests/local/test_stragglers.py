"""A slow node named by `paralleljob run`: one simulated node throttled by a real CPU cgroup quota (issue 36).

The quickstart's layout on four nodes of two ranks, so that each node has a peer doing identical work (the same
stage in the other replica) on another node. Needs root and a CPU cgroup, as CI and these machines have.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest
import yaml

from testcluster.trainer_harness import text_corpus

ROOT = pathlib.Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"

pytestmark = pytest.mark.slow


def run(tmp_path: pathlib.Path, *extra: str) -> dict:
    """The quickstart at 40 steps (two windows of 20) on 4 nodes x 2 slots; its summary.json."""
    doc = yaml.safe_load(QUICKSTART.read_text())
    doc["spec"]["training"]["steps"] = 40
    doc["spec"]["training"]["data"]["path"] = str(text_corpus())
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    output = tmp_path / "out"
    command = [sys.executable, "-m", "paralleljob", "run", str(job), "--gpus-per-node", "2", "--output", str(output)]
    proc = subprocess.run([*command, *extra], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {"stdout": proc.stdout, **json.loads((output / "summary.json").read_text())}


def test_a_throttled_node_and_only_it_is_named(tmp_path: pathlib.Path) -> None:
    summary = run(tmp_path, "--throttle-node", "1")
    assert [(s["nodeRank"], s["node"], s["stage"]) for s in summary["stragglers"]] == [(1, "local-1", 0)]
    assert summary["stragglers"][0]["factor"] > 1.3
    # Named once it was slow in two windows in a row (spec.failurePolicy.stragglers.windows), over both of them.
    assert summary["stragglers"][0]["steps"] == [1, 40]
    assert "straggler   local-1 (node rank 1, stage 0)" in summary["stdout"]


def test_an_unthrottled_run_names_nobody(tmp_path: pathlib.Path) -> None:
    summary = run(tmp_path)
    assert summary["stragglers"] == []
    assert "straggler" not in summary["stdout"]
