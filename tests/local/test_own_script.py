"""A user's own DeepSpeed script (examples/own-script/train.py, not the bundled trainer) under `paralleljob
run` on 2 simulated nodes (PP 2 x DP 2): it reads its layout through the contract, its loss falls, and every
rank sees exactly the rank, node, coordinates and pipeline and data groups the plan gave it."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import yaml

from paralleljob import planning
from paralleljob.api import validate_document
from paralleljob.commands.run import plan_locally
from paralleljob.local.runner import choose_shape
from paralleljob.manifests.trainer_config import contract_plan

ROOT = pathlib.Path(__file__).resolve().parents[2]
JOB = ROOT / "examples" / "own-script" / "job.yaml"

pytestmark = pytest.mark.slow


def planned_ranks() -> tuple[planning.Plan, dict[int, dict[str, object]]]:
    resolved = validate_document(yaml.safe_load(JOB.read_text())).resolved
    assert resolved is not None
    plan = plan_locally(resolved, choose_shape(resolved, None, None))
    assert isinstance(plan, planning.Plan)
    layout = contract_plan(plan.to_dict()).layout
    expected = {}
    for node in plan.nodes:
        for rank, coord in zip(node.ranks, node.coords, strict=True):
            expected[rank] = {
                "rank": rank,
                "launch_rank": rank,
                "node_rank": node.node_rank,
                "coord": coord._asdict(),
                "stage": coord.pipe,
                "pipe_group": layout.group(rank, "pipe"),
                "data_group": layout.group(rank, "data"),
            }
    return plan, expected


def test_own_deepspeed_script_trains_and_sees_the_planned_ranks_and_groups(tmp_path: pathlib.Path) -> None:
    plan, expected = planned_ranks()
    assert (plan.layout.pipeline, plan.layout.tensor, plan.layout.data, len(plan.nodes)) == (2, 1, 2, 2)
    # The example's command is `python ...`: the interpreter running the tests, as an activated venv would.
    env = {**os.environ, "PATH": f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    completed = subprocess.run(
        [sys.executable, "-m", "paralleljob", "run", str(JOB), "--output", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps_done"] == 20
    assert summary["last_loss"] < summary["first_loss"] / 4
    seen = {rank: json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in expected}
    assert seen == expected
