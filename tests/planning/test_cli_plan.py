"""`paralleljob plan` and `paralleljob cluster synth` from the command line: outputs and exit codes."""

from __future__ import annotations

import json
import pathlib

import pytest
import yaml

from paralleljob import cli, planning

EXAMPLES = pathlib.Path(__file__).parents[2] / "examples"
JOB_175B = str(EXAMPLES / "gpt-175b-64xa100.yaml")
CLUSTER_8X8 = str(EXAMPLES / "cluster-8x8-a100.yaml")


def test_plan_prints_a_table_with_one_row_per_node_and_the_estimates(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", JOB_175B, "--cluster", CLUSTER_8X8]) == 0
    out = capsys.readouterr().out
    assert "8x4x2 (PP x TP x DP), 64 GPUs on 8 nodes x 8" in out
    assert "memory per GPU (model, first pipeline stage, the fuller end): 64.1 GiB of 80 GiB" in out
    assert "naive (free nodes in name order)" in out


def test_plan_json_is_the_documented_schema_and_reads_back(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", JOB_175B, "--cluster", CLUSTER_8X8, "-o", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["layout"] == {"pipeline": 8, "tensor": 4, "data": 2}
    assert (plan["worldSize"], plan["ranksPerNode"], plan["axisOrder"]) == (64, 8, ["pipe", "data", "model"])
    assert set(plan["nodes"][0]) == {"nodeRank", "node", "gpus", "ranks", "coords", "stages", "domains"}
    assert set(plan["cost"]) >= {"planned", "naive"}
    assert planning.Plan.from_dict(plan).to_dict() == plan


def test_plan_svg_draws_every_node_of_the_job(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "plan.svg"
    assert cli.main(["plan", JOB_175B, "--cluster", CLUSTER_8X8, "-o", "svg", "--out", str(out)]) == 0
    svg = out.read_text()
    assert svg.startswith("<svg") and svg.count(">ranks ") == 8


def test_an_unschedulable_job_exits_1_with_the_reason(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small = tmp_path / "small.yaml"
    assert cli.main(["cluster", "synth", "--nodes", "4", "--gpus-per-node", "8"]) == 0
    small.write_text(capsys.readouterr().out)
    assert cli.main(["plan", JOB_175B, "--cluster", str(small)]) == 1
    assert "spec: unschedulable: needs 8 nodes with 8 free nvidia.com/gpu" in capsys.readouterr().out


def test_an_invalid_job_exits_1_like_validate(capsys: pytest.CaptureFixture[str]) -> None:
    job = str(EXAMPLES / "deepspeed-zero2-pipeline.yaml")
    assert cli.main(["plan", job, "--cluster", CLUSTER_8X8]) == 1
    assert "ZeRO" in capsys.readouterr().out


def test_bad_usage_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", JOB_175B, "--cluster", CLUSTER_8X8, "--bandwidth", "warp=9"]) == 2
    assert "level must be one of" in capsys.readouterr().err


def test_cluster_synth_with_busy_prints_nodes_then_bound_pods(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "cluster",
        "synth",
        "--nodes",
        "20",
        "--gpus-per-node",
        "8",
        "--leaves",
        "4",
        "--busy",
        "0.5",
        "--seed",
        "3",
    ]
    assert cli.main(args) == 0
    node_list, pods = yaml.safe_load_all(capsys.readouterr().out)
    assert node_list["kind"] == "NodeList" and len(node_list["items"]) == 20
    assert pods["kind"] == "List" and all(p["spec"]["nodeName"] for p in pods["items"])
