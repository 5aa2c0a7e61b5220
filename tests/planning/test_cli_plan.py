"""`paralleljob plan` and `paralleljob cluster synth` from the command line: outputs and exit codes."""

from __future__ import annotations

import json
import pathlib

import pytest
import yaml

from paralleljob import cli, planning
from tests.planning import clusters

EXAMPLES = pathlib.Path(__file__).parents[2] / "examples"
JOB_175B = str(EXAMPLES / "gpt-175b-64xa100.yaml")
CLUSTER_8X8 = str(EXAMPLES / "cluster-8x8-a100.yaml")


def test_plan_prints_a_table_with_one_row_per_node_and_the_estimates(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", JOB_175B, "--cluster", CLUSTER_8X8]) == 0
    out = capsys.readouterr().out
    assert "8x4x2 (PP x TP x DP), 64 GPUs on 8 nodes x 8" in out
    assert "memory per GPU (model, first pipeline stage, the fuller end): 59.2 GiB of 80 GiB" in out
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


def write_yaml(path: pathlib.Path, *documents: object) -> str:
    path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    return str(path)


def node_list(*names: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "NodeList", "items": [clusters.node(name) for name in names]}


def placed_job(name: str, node: str, pod_name: str) -> dict[str, object]:
    """Another ParallelJob as `kubectl get paralleljobs -o yaml` prints it: placed on `node`, pod not bound yet."""
    return {
        "apiVersion": "paralleljob.io/v1alpha1",
        "kind": "ParallelJob",
        "metadata": {"name": name, "namespace": "research"},
        "status": {
            "phase": "Pending",
            "gpusPerNode": 8,
            "placement": [{"nodeRank": 0, "node": node, "ranks": "0-7", "stages": [0], "pod": pod_name}],
        },
    }


SMALL_JOB = """apiVersion: paralleljob.io/v1alpha1
kind: ParallelJob
metadata: {name: small, namespace: research}
spec:
  parallelism: {pipeline: 2, tensor: 8, data: 1}
  model: {layers: 8, hiddenSize: 512, attentionHeads: 8, sequenceLength: 512, vocabSize: 1024}
  deepspeed: {train_micro_batch_size_per_gpu: 1, gradient_accumulation_steps: 16}
  training: {steps: 10}
  checkpoint: {intervalSteps: 5, volume: {persistentVolumeClaim: {claimName: checkpoints}}}
"""


def four_gpu_pods_job(tmp_path: pathlib.Path) -> pathlib.Path:
    """PP 2 x TP 4 in two pods of 4 GPUs."""
    job = tmp_path / "four-gpu-pods.yaml"
    job.write_text(SMALL_JOB.replace("tensor: 8", "tensor: 4").replace("spec:\n", "spec:\n  gpusPerNode: 4\n"))
    return job


@pytest.fixture
def small_job(tmp_path: pathlib.Path) -> str:
    path = tmp_path / "small-job.yaml"
    path.write_text(SMALL_JOB)
    return str(path)


def test_a_pod_in_both_the_cluster_file_and_the_pods_file_counts_once(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = four_gpu_pods_job(tmp_path)
    pods = {"apiVersion": "v1", "kind": "List", "items": [clusters.pod("other", "n0", 4)]}
    cluster = write_yaml(tmp_path / "cluster.yaml", node_list("n0", "n1"), pods)
    pods_file = write_yaml(tmp_path / "pods.yaml", pods)
    # n0 has 4 of 8 GPUs free; counted twice it would have none and the 2-node job would not fit.
    assert cli.main(["plan", str(job), "--cluster", cluster, "--pods", pods_file, "-o", "json"]) == 0
    assert sorted(node["node"] for node in json.loads(capsys.readouterr().out)["nodes"]) == ["n0", "n1"]


def test_an_unschedulable_job_with_json_output_keeps_stdout_empty_and_says_why_on_stderr(
    tmp_path: pathlib.Path, small_job: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = write_yaml(tmp_path / "cluster.yaml", node_list("n0"))
    assert cli.main(["plan", small_job, "--cluster", cluster, "-o", "json"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert "spec: unschedulable: needs 2 nodes with 8 free nvidia.com/gpu" in err


def test_with_two_jobs_of_which_one_fits_stdout_is_the_json_of_the_one(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(SMALL_JOB + "---\n" + SMALL_JOB.replace("name: small,", "name: second,"))
    cluster = write_yaml(tmp_path / "cluster.yaml", node_list("n0", "n1", "n2"))
    assert cli.main(["plan", str(jobs), "--cluster", cluster, "-o", "yaml"]) == 1
    out, err = capsys.readouterr()
    assert [doc["worldSize"] for doc in yaml.safe_load_all(out)] == [16]
    assert "(document 2): spec: unschedulable: needs 2 nodes" in err


def test_an_invalid_job_with_svg_output_reports_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    job = str(EXAMPLES / "deepspeed-zero2-pipeline.yaml")
    assert cli.main(["plan", job, "--cluster", CLUSTER_8X8, "-o", "svg"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "ZeRO" in err


def test_an_unwritable_out_path_is_one_line_and_exit_2(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "no-such-directory" / "plan.json"
    assert cli.main(["plan", JOB_175B, "--cluster", CLUSTER_8X8, "-o", "json", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"paralleljob plan: cannot write --out {out}: ") and err.count("\n") == 1


def test_another_parallel_jobs_placement_not_yet_bound_holds_its_gpus(
    tmp_path: pathlib.Path, small_job: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = write_yaml(tmp_path / "cluster.yaml", node_list("n0", "n1"))
    others = write_yaml(
        tmp_path / "jobs.yaml", {"kind": "ParallelJobList", "items": [placed_job("gpt", "n0", "gpt-0")]}
    )
    assert cli.main(["plan", small_job, "--cluster", cluster, "--pods", others]) == 1
    assert "1 has GPUs in use by ParallelJob research/gpt" in capsys.readouterr().out


def test_a_parallel_job_whose_pod_is_bound_counts_through_the_pod_only(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pods = {"kind": "List", "items": [clusters.pod("gpt-0", "n0", 4)]}
    cluster = write_yaml(tmp_path / "cluster.yaml", node_list("n0", "n1"), pods, placed_job("gpt", "n0", "gpt-0"))
    assert cli.main(["plan", str(four_gpu_pods_job(tmp_path)), "--cluster", cluster, "-o", "json"]) == 0
    assert sorted(node["node"] for node in json.loads(capsys.readouterr().out)["nodes"]) == ["n0", "n1"]


def test_the_job_being_planned_does_not_reserve_against_itself(tmp_path: pathlib.Path, small_job: str) -> None:
    itself = placed_job("small", "n0", "small-0")
    cluster = write_yaml(tmp_path / "cluster.yaml", node_list("n0", "n1"), itself)
    assert cli.main(["plan", small_job, "--cluster", cluster, "-o", "json", "--out", str(tmp_path / "p.json")]) == 0


def test_plan_auto_prints_the_ranked_layouts_the_explanation_and_the_winners_placement(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["plan", JOB_175B, "--cluster", CLUSTER_8X8, "--auto"]) == 0
    out = capsys.readouterr().out
    assert "gpt-175b: layouts for 64 GPUs" in out
    assert "│ 1 │ 8x4x2    │   8x8 │     1 │  768 │ on" in out
    assert "3. so it needs PP across nodes: PP 8 x TP 4" in out
    assert "the runner-up " in out and "slower" in out
    assert "8x4x2 (PP x TP x DP), 64 GPUs on 8 nodes x 8" in out  # the winner's plan, as plan prints it


def test_plan_auto_json_holds_the_winner_the_candidates_and_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", JOB_175B, "--cluster", CLUSTER_8X8, "--auto", "--nodes", "8", "-o", "json"]) == 0
    choice = json.loads(capsys.readouterr().out)
    assert choice["budget"] == {"gpus": 64, "fixed": {}}
    assert choice["winner"]["layout"] == {"pipeline": 8, "tensor": 4, "data": 2}
    assert choice["candidates"][0] == choice["winner"]
    assert set(choice["winner"]) >= {
        "microBatch",
        "gradientAccumulationSteps",
        "memoryPerGPU",
        "tokensPerSecond",
        "mfu",
    }
    assert planning.Plan.from_dict(choice["plan"]).layout.world_size == 64


def test_plan_auto_over_a_range_shows_throughput_per_budget(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", JOB_175B, "--cluster", CLUSTER_8X8, "--auto", "--gpus", "16..64", "-o", "json"]) == 1
    captured = capsys.readouterr()
    scaling = json.loads(captured.out)["scaling"]
    assert [entry["budget"]["gpus"] for entry in scaling] == [64]
    assert "no layout of 16 GPUs fits in memory" in captured.err  # 16 and 32 GPUs cannot hold 175B
    assert "no layout of 32 GPUs fits in memory" in captured.err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--gpus", "64"], "add --auto"),
        (["--auto", "--gpus", "x"], "--gpus x: give a GPU count"),
        (["--auto", "--gpus", "64..32"], "low <= high"),
        (["--auto", "--gpus", "8", "--nodes", "1"], "not both"),
    ],
    ids=["gpus-without-auto", "not-a-number", "reversed-range", "gpus-and-nodes"],
)
def test_bad_budgets_are_usage_errors(flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", JOB_175B, "--cluster", CLUSTER_8X8, *flags]) == 2
    assert message in capsys.readouterr().err


def test_a_budget_too_small_for_the_model_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", JOB_175B, "--cluster", CLUSTER_8X8, "--auto", "--gpus", "8"]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and "spec.parallelism: no layout of 8 GPUs fits in memory: the closest, " in lines[0]


def test_a_json_node_list_reads_like_the_yaml_one(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    as_json = tmp_path / "nodes.json"
    as_json.write_text(json.dumps(next(yaml.safe_load_all(pathlib.Path(CLUSTER_8X8).read_text()))))
    assert cli.main(["plan", JOB_175B, "--cluster", str(as_json), "-o", "json"]) == 0
    from_json = json.loads(capsys.readouterr().out)
    assert cli.main(["plan", JOB_175B, "--cluster", CLUSTER_8X8, "-o", "json"]) == 0
    assert from_json == json.loads(capsys.readouterr().out)


def test_a_node_whose_cpu_a_bound_pod_holds_is_named_with_the_resource(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(SMALL_JOB + "  template:\n    resources:\n      requests: {cpu: '8'}\n")
    nodes = [clusters.node(name, allocatable={"cpu": "12", "memory": "1Ti"}) for name in ("n0", "n1")]
    pods = {"kind": "List", "items": [clusters.pod("etl", "n0", 0, requests={"cpu": "4500m"})]}
    cluster = write_yaml(tmp_path / "cluster.yaml", {"kind": "NodeList", "items": nodes}, pods)
    assert cli.main(["plan", str(job), "--cluster", cluster]) == 1
    assert "1 qualifies: 1 has too little cpu (7500m free, 8 requested)" in capsys.readouterr().out
