"""A user's own DeepSpeed script (examples/own-script/train.py, not the bundled trainer) under `paralleljob
run` on 2 simulated nodes (PP 2 x DP 2): it reads its layout through the contract, its loss falls, and every
rank sees exactly the rank, node, coordinates and pipeline and data groups the plan gave it."""

from __future__ import annotations

import json
import pathlib

import pytest
import yaml

from paralleljob import planning
from paralleljob.api import validate_document
from paralleljob.local.shape import choose_shape, plan_locally
from paralleljob.manifests.trainer_config import contract_plan
from tests.local.terminal import run_without_the_venv

ROOT = pathlib.Path(__file__).resolve().parents[2]
JOB = ROOT / "examples" / "own-script" / "job.yaml"

pytestmark = pytest.mark.slow


def planned_ranks() -> tuple[planning.Plan, dict[int, dict[str, object]]]:
    resolved = validate_document(yaml.safe_load(JOB.read_text())).resolved
    assert resolved is not None
    plan = plan_locally(resolved, choose_shape(resolved, None, None))
    assert isinstance(plan, planning.Plan)
    layout = contract_plan(plan).layout
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
    # As the example's header says, `.venv/bin/paralleljob run` in a terminal without the venv activated: the
    # job's `python` must still be the interpreter that has DeepSpeed (`local.startup.interpreter_path`).
    completed = run_without_the_venv(JOB, tmp_path)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps_done"] == 20
    assert summary["last_loss"] < summary["first_loss"] / 4
    seen = {rank: json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in expected}
    assert seen == expected
